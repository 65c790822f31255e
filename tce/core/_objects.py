"""Paths under the server's object storage roots (``storage_roots`` entries
``DIR=s3://BUCKET/PREFIX``): files there exist only as objects, so what a
client would do to a local file (read ``latest``, delete an old
``.metadata``, see whether a file is on storage) goes through the server.
A load reading ranges of such a file pins the object it began with
(:class:`ObjectPin`)."""

from __future__ import annotations

import os
import threading
from typing import Any

from tce.core import _knobs
from tce.core._session import with_client
from tce.errors import FailedPreconditionError, ServerUnavailableError, TCEError

_lock = threading.Lock()
_roots: dict[str, tuple[str, ...]] = {}  # socket -> the server's object root directories


def object_roots() -> tuple[str, ...]:
    """The directories the server maps to object storage (asked once per
    server socket; none when the server cannot be reached)."""
    socket = _knobs.get("socket")
    with _lock:
        if socket in _roots:
            return _roots[socket]
    try:
        status = with_client(lambda c: c.status())
    except (ServerUnavailableError, TCEError):
        return ()
    dirs = tuple(r.split("=", 1)[0] for r in status.object_roots)
    with _lock:
        _roots[socket] = dirs
    return dirs


def is_object_path(path: str | os.PathLike) -> bool:
    """Whether ``path`` (absolute) lies under an object storage root."""
    p = os.path.abspath(os.fspath(path))
    return any(p.startswith(d.rstrip("/") + "/") for d in object_roots())


def delete(path: str, job: str) -> None:
    """Drops ``path`` from the cache and deletes its object from storage (no
    error when neither holds it)."""
    try:
        with_client(lambda c: c.remove(job, path, from_storage=True))
    except TCEError as e:
        if e.code != "NOT_FOUND":
            raise


def stored(directory: str, job: str) -> list[tuple[str, int]]:
    """(path, size) of each file object storage holds under ``directory``
    (under an object root), by path."""
    files = with_client(lambda c: c.list(job, storage_dir=os.path.abspath(directory)))
    return sorted((f.path, f.size) for f in files)


class ObjectPin:
    """The identity of one object (ETag, size) as one load first read a
    range of it from object storage. The load's later ranges of that file
    pass it (:meth:`expected`): the server reads them only while the object
    is still that one, with no look at it first (no HEAD), and fails them
    (``FAILED_PRECONDITION``, naming the object) once it was replaced or
    deleted, so a load never mixes two versions of an object. Any thread
    may use it (a load has several ranges in flight)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._etag, self._size = "", 0

    def expected(self) -> dict[str, Any]:
        """What a ranged read passes (``Client.read_range``'s ``etag`` and
        ``size``): nothing until the first range from storage."""
        with self._lock:
            return {"etag": self._etag, "size": self._size} if self._etag else {}

    def seen(self, etag: str, size: int) -> None:
        """Pins the identity a range from storage came from (the first), or
        checks it (the others: one read before the pin was set may have met
        another version).

        Raises:
            FailedPreconditionError: it is not the pinned one.
        """
        if not etag:  # not from storage (this node's cache, the ring)
            return
        with self._lock:
            if not self._etag:
                self._etag, self._size = etag, size
                return
            if (etag, size) == (self._etag, self._size):
                return
            pinned = f"ETag {self._etag}, {self._size} bytes"
        raise FailedPreconditionError(
            f"{self.path} was replaced on object storage since this load began (it read {pinned}; "
            f"now ETag {etag}, {size} bytes)")
