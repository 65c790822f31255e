"""TCE: a checkpoint costs only a memory copy.

``tce.save`` / ``tce.load`` stream state dicts into the node's cache server
(``tce-server``) through shared memory; the files have torch.save's format.
Importing this package does nothing else.
"""

from tce._api import cached, close, load, remove, save, status, wait
from tce._knobs import configure
from tce.errors import (
    CacheFullError,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotCachedError,
    PermissionDeniedError,
    PersistFailedError,
    ServerUnavailableError,
    TCEError,
    UnauthenticatedError,
)

__version__ = "0.1.0"

__all__ = [
    "CacheFullError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "NotCachedError",
    "PermissionDeniedError",
    "PersistFailedError",
    "ServerUnavailableError",
    "TCEError",
    "UnauthenticatedError",
    "cached",
    "close",
    "configure",
    "load",
    "remove",
    "save",
    "status",
    "wait",
]
