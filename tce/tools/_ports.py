"""A free TCP port for a listener that another process opens later (torch's
TCPStore through ``MASTER_PORT``, mariadbd).

A port from ``bind(("127.0.0.1", 0))`` comes from the kernel's ephemeral
range, from which it also picks the local port of every outgoing
connection: between the check and the other process's ``listen``, a busy
machine (gloo alone opens dozens of connections) can take it, and the
listener fails with EADDRINUSE. A port below that range is never handed out
by the kernel, so only another explicit choice can take it.
"""

from __future__ import annotations

import random
import socket

_LOWEST = 20000  # above the well-known and registered ports services tend to use


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on or is bound to now, outside the ephemeral
    range (falls back to the kernel's choice if that range leaves no room)."""
    low, high = _ephemeral_range()
    candidates = range(_LOWEST, low) if low > _LOWEST else range(high + 1, 65536)
    rng = random.SystemRandom()
    for _ in range(min(len(candidates), 200)):
        port = rng.choice(candidates)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
