"""This process's session with the node's server.

One :class:`~tce.core._client.Client` per process, made on first use and made
again after a fork, after the server restarted or went away, or when the
``socket`` setting changed. Any thread may call these functions.
"""

from __future__ import annotations

import os
import threading
from typing import Callable, TypeVar

from tce.core import _knobs
from tce.core._client import Client
from tce.errors import TCEError

T = TypeVar("T")

_lock = threading.Lock()
_client: Client | None = None  # GUARDED_BY(_lock)


def client() -> Client:
    """This process's session with the server (reconnects after fork or restart)."""
    global _client
    socket_path = _knobs.get("socket")
    with _lock:
        c = _client
        if c is not None and (c.closed or c.pid != os.getpid() or c.socket_path != socket_path):
            if c.pid == os.getpid():
                c.close()
            c = _client = None
        if c is None:
            c = _client = Client(socket_path, rpc_timeout=_knobs.get("rpc_timeout"))
        return c


def _drop(c: Client) -> None:
    global _client
    with _lock:
        if _client is c:
            _client = None
    c.close()


def with_client(fn: Callable[[Client], T]) -> T:
    """Run fn(client); on a lost server or session, reconnect once and retry."""
    c = client()
    try:
        return fn(c)
    except TCEError as e:
        if e.code not in ("UNAVAILABLE", "UNAUTHENTICATED"):
            raise
        _drop(c)
        return fn(client())


def close() -> None:
    """End this process's session with the server (it reconnects on next use)."""
    global _client
    with _lock:
        c, _client = _client, None
    if c is not None:
        c.close()
