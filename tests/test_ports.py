"""tce.tools._ports: ports for listeners other processes open later."""

import socket

from tce.tools._ports import _ephemeral_range, free_port


def test_a_free_port_is_outside_the_kernels_ephemeral_range_and_bindable():
    low, high = _ephemeral_range()
    for _ in range(20):
        port = free_port()
        assert not low <= port <= high, (port, low, high)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free: nothing took it


def test_a_port_in_use_is_never_chosen():
    taken = []
    try:
        for _ in range(50):
            s = socket.socket()
            s.bind(("127.0.0.1", free_port()))
            s.listen()
            taken.append(s)
        assert len({s.getsockname()[1] for s in taken}) == 50
    finally:
        for s in taken:
            s.close()
