"""Paths under the server's object storage roots (``storage_roots`` entries
``DIR=s3://BUCKET/PREFIX``): files there exist only as objects, so what a
client would do to a local file (read ``latest``, delete an old
``.metadata``, see whether a file is on storage) goes through the server."""

from __future__ import annotations

import os
import threading

from tce.core import _knobs
from tce.core._session import with_client
from tce.errors import ServerUnavailableError, TCEError

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

