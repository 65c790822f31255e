"""This process's saves, per server socket, job and path, and how each one
settles (what :func:`tce.wait` waits for, and how it knows an answer is about
the save it made).

A save through a server is *pending* until ``tce.wait`` saw it persisted;
the server's version of it (the allocation id: a later save of the path, a
restart included, has a higher one) is kept, because the server answers a
wait for a path: an answer about an older version means this process's save
was lost. A save written directly (a fallback, fsynced before it returned)
is durable at once, and settles without asking a server."""

from __future__ import annotations

import threading

Key = tuple[str, str, str]  # (socket, job, path)

_lock = threading.Lock()
_pending: dict[Key, int] = {}  # GUARDED_BY(_lock): key -> version of the last save through the server
_direct: set[Key] = set()  # GUARDED_BY(_lock): keys whose last save was written directly


def saved_through_server(key: Key, version: int) -> None:
    """The path's last save went to the server as ``version``."""
    with _lock:
        _pending[key] = version
        _direct.discard(key)


def written_directly(key: Key) -> None:
    """The path's last save was written directly (durable already)."""
    with _lock:
        _pending.pop(key, None)
        _direct.add(key)


def settled(key: Key) -> None:
    """The path's last save is settled (persisted, failed, or removed)."""
    with _lock:
        _pending.pop(key, None)


def version(key: Key) -> int:
    """The version of the path's pending save through the server; 0: none."""
    with _lock:
        return _pending.get(key, 0)


def is_direct(key: Key) -> bool:
    """Whether the path's last save was written directly."""
    with _lock:
        return key in _direct


def pending(socket: str) -> list[tuple[str, str]]:
    """(job, path) of every pending save through the server at ``socket``."""
    with _lock:
        return [(j, p) for s, j, p in _pending if s == socket]
