"""TCE's exception hierarchy.

Every error the server reports carries its status code (the gRPC code name,
e.g. ``RESOURCE_EXHAUSTED``) and the server's message.
"""

from __future__ import annotations

import errno


class TCEError(Exception):
    """Base class of every error TCE raises. ``code`` is the server's status
    code name (``UNKNOWN`` for an error the client raised itself); the
    message is prefixed with it where a status gave it."""

    code: str = "UNKNOWN"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return self.message if self.code == TCEError.code else f"{self.code}: {self.message}"


class ServerUnavailableError(TCEError):
    """The cache server cannot be reached (not running, socket missing)."""

    code = "UNAVAILABLE"


class NotCachedError(TCEError):
    """The file (or allocation, lease, buffer) is not known to the server."""

    code = "NOT_FOUND"


class MissingDirectoryError(NotCachedError, FileNotFoundError, RuntimeError):
    """A save into a directory that does not exist, refused at once (the
    server creates no directories). A ``FileNotFoundError`` (errno ENOENT,
    ``filename`` the path), and a ``RuntimeError`` as ``torch.save``'s own
    error for a missing parent directory is."""

    def __init__(self, message: str, *, filename: str | None = None) -> None:
        super().__init__(message)
        self.errno = errno.ENOENT
        self.strerror = message
        self.filename = filename


class InvalidArgumentError(TCEError):
    code = "INVALID_ARGUMENT"


class PermissionDeniedError(TCEError):
    code = "PERMISSION_DENIED"


class CacheFullError(TCEError):
    """The cache has no room for the file within its memory budget."""

    code = "RESOURCE_EXHAUSTED"


class FailedPreconditionError(TCEError):
    code = "FAILED_PRECONDITION"


class PathIsADirectoryError(FailedPreconditionError, IsADirectoryError, RuntimeError):
    """A save onto a path that is a directory, refused at once. An
    ``IsADirectoryError`` (errno EISDIR, ``filename`` the path), and a
    ``RuntimeError`` as ``torch.save``'s own error for it is."""

    def __init__(self, message: str, *, filename: str | None = None) -> None:
        super().__init__(message)
        self.errno = errno.EISDIR
        self.strerror = message
        self.filename = filename


class UnauthenticatedError(TCEError):
    code = "UNAUTHENTICATED"


class DeadlineExceededError(TCEError):
    """A wait ran out of time."""

    code = "DEADLINE_EXCEEDED"


class CorruptCheckpointError(TCEError, ValueError):
    """A checkpoint file is not what its format promises (damaged, or forged
    by whoever could write it): refused before anything in it is used, with
    the file and the reason. A ``ValueError`` too."""

    code = "DATA_LOSS"


class PersistFailedError(TCEError):
    """The server gave up writing a file to storage (it stays in memory).

    ``failures`` maps each failed path to the server's reason.
    """

    code = "PERSIST_FAILED"

    def __init__(self, message: str, *, failures: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.failures = dict(failures or {})


_BY_CODE = {
    cls.code: cls
    for cls in (
        ServerUnavailableError,
        NotCachedError,
        InvalidArgumentError,
        PermissionDeniedError,
        CacheFullError,
        FailedPreconditionError,
        UnauthenticatedError,
        DeadlineExceededError,
    )
}


def error_for(code: str, message: str) -> TCEError:
    """The TCEError subclass for a status code name."""
    cls = _BY_CODE.get(code, TCEError)
    return cls(message, code=code)
