"""TCE: a checkpoint costs only a memory copy.

``tce.save`` / ``tce.load`` stream state dicts into the node's cache server
(``tce-server``) through shared memory; the files have torch.save's format.
Importing this package does nothing else, except that DeepSpeed (if and
when it is imported) accepts ``"checkpoint_engine": "tce"``.
"""

from tce.api import cached, close, load, remove, save, status, wait, wait_staged
from tce.integrations import attach, engine_class, install_deepspeed, patch_torch, unpatch_torch
from tce.core.dist import join_ring
from tce.core._knobs import configure
from tce.errors import (
    CacheFullError,
    CorruptCheckpointError,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    MissingDirectoryError,
    NotCachedError,
    PathIsADirectoryError,
    PermissionDeniedError,
    PersistFailedError,
    ServerUnavailableError,
    TCEError,
    UnauthenticatedError,
)

__version__ = "0.1.0"

install_deepspeed()


def __getattr__(name: str):
    if name == "TCECheckpointEngine":  # subclasses DeepSpeed's: built on first use
        return engine_class()
    if name == "weights":  # the readers' API (docs/weights.md)
        import importlib
        return importlib.import_module("tce.weights")
    raise AttributeError(f"module 'tce' has no attribute {name!r}")


__all__ = [
    "CacheFullError",
    "CorruptCheckpointError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "MissingDirectoryError",
    "NotCachedError",
    "PathIsADirectoryError",
    "PermissionDeniedError",
    "PersistFailedError",
    "ServerUnavailableError",
    "TCEError",
    "TCECheckpointEngine",
    "UnauthenticatedError",
    "attach",
    "cached",
    "close",
    "configure",
    "install_deepspeed",
    "join_ring",
    "load",
    "patch_torch",
    "remove",
    "save",
    "status",
    "unpatch_torch",
    "wait",
    "wait_staged",
]
