"""The soak's faults (tests/soak.py): what each one does, how long it lasts,
and the schedule that draws them from the run's seed.

Every fault ends by itself: a killed process is started again after a
pause of a few seconds, an S3 fault is lifted after a bounded time (a 503
burst after its n requests), a directory made unwritable is made writable
again. :meth:`Faults.end_all` lifts whatever is still on (the soak's
deadline, or an error).

S3 faults go through two pieces of test code in front of moto: the
FaultProxy (tests/s3_helpers.py) for connections reset, an endpoint frozen
and 503 SlowDown, and :class:`CutRelay`, a TCP relay in front of the proxy
that cuts a connection part way through what its client sends (an upload's
body), which the proxy, reading requests whole, does not do.
"""

from __future__ import annotations

import collections
import os
import random
import socket
import struct
import subprocess
import threading
import time
from typing import Callable

# kind -> weight in the draw
WEIGHTS = {"kill-server": 1.5, "kill-server-after-save": 1.0, "kill-writer": 1.0, "s3-reset": 1.0,
           "s3-midbody": 1.5, "s3-freeze": 1.0, "s3-slowdown": 1.5, "dir-readonly": 1.0,
           "state-readonly": 1.0}
KINDS = tuple(WEIGHTS)
# One fault of a group at a time.
_GROUP = {k: ("s3" if k.startswith("s3-") else
              "server" if k.startswith("kill-server") or k == "state-readonly" else k)
          for k in KINDS}


def _reset(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


class CutRelay:
    """A TCP relay on loopback in front of ``upstream`` (host, port).
    ``endpoint``: what clients are given. After :meth:`arm` (after, n),
    each connection that then forwards ``after`` more bytes from its client
    has exactly those bytes forwarded and is reset at both ends, up to n
    connections: a request body cut part way (headers are far shorter than
    ``after``). ``cuts``: connections cut so far. Thread-safe."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._lock = threading.Lock()
        self._after = 0
        self._left = 0  # cuts still to make while armed
        self._counts: dict[int, int] = {}  # id(connection pair) -> client bytes since armed
        self._socks: set[socket.socket] = set()
        self._closed = False
        self.cuts = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.endpoint = "http://127.0.0.1:%d" % self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, name="cut-relay", daemon=True)
        self._thread.start()

    def arm(self, after: int, n: int) -> None:
        with self._lock:
            self._after, self._left = after, n
            self._counts = dict.fromkeys(self._counts, 0)

    def disarm(self) -> None:
        with self._lock:
            self._left = 0

    def close(self) -> None:
        with self._lock:
            self._closed = True
            socks = list(self._socks)
        self._thread.join()
        self._listener.close()
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._upstream, timeout=10)
            except OSError:
                _reset(client)
                continue
            upstream.settimeout(None)
            key = id(client)
            with self._lock:
                self._socks |= {client, upstream}
                self._counts[key] = 0
            for src, dst, counted in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pump, args=(src, dst, key if counted else None),
                                 name="cut-relay-pump", daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, key: int | None) -> None:
        buf = memoryview(bytearray(256 << 10))
        cut = False
        try:
            while True:
                got = src.recv_into(buf)
                if not got:
                    break
                send, cut = got, False
                if key is not None:
                    with self._lock:
                        if self._left > 0 and key in self._counts:
                            before = self._counts[key]
                            self._counts[key] = before + got
                            if before + got >= self._after:
                                send, cut = self._after - before, True
                                self._left -= 1
                                self.cuts += 1
                dst.sendall(buf[:send])
                if cut:
                    break
        except OSError:
            cut = False
        finally:
            with self._lock:
                self._counts.pop(key, None)
                self._socks -= {src, dst}
            for s in (src, dst):
                if key is not None and cut:
                    _reset(s)
                else:
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    s.close()


class Faults:
    """Draws faults from ``rng`` and applies them: ``step()`` from the
    soak's loop starts the next one when it is due and ends those whose
    time is up. ``plan``: (seconds from the start, kind) pairs to run
    instead of the draw (the kinds' durations still come from ``rng``).
    ``counts``: faults started, by kind; ``log``: told of each start and end."""

    def __init__(self, rng: random.Random, *, server, writer, proxy, relay: CutRelay,
                 readonly_dir: str, kinds: tuple[str, ...] = KINDS,
                 every: tuple[float, float] = (3.0, 12.0),
                 plan: list[tuple[float, str]] | None = None, log: Callable[[str], None]) -> None:
        self.rng, self.kinds, self.every, self.log = rng, kinds, every, log
        self.server, self.writer = server, writer  # tests/soak.py's Server and Writer
        self.proxy, self.relay, self.readonly_dir = proxy, relay, readonly_dir
        self.plan = sorted(plan) if plan is not None else None
        self.counts: collections.Counter[str] = collections.Counter()
        self.untriggered = 0  # kills after a save armed while no save returned
        self.unavailable: dict[str, str] = {}  # kind -> why it cannot run here
        self._immutable: list[str] = []  # what a -readonly fault made immutable
        if not self._chattr_works():
            for kind in ("dir-readonly", "state-readonly"):
                self.unavailable[kind] = "chattr +i needs root (CAP_LINUX_IMMUTABLE)"
            self.kinds = tuple(k for k in kinds if k not in self.unavailable)
            if self.plan is not None:
                self.plan = [(t, k) for t, k in self.plan if k not in self.unavailable]
        self._ends: list[tuple[float, str, Callable[[], None]]] = []
        self._t0 = time.monotonic()
        self._next = self._t0 + (self.rng.uniform(*every) if plan is None else 0.0)

    def active(self) -> set[str]:
        return {_GROUP[k] for _, k, _ in self._ends}

    def step(self) -> None:
        now = time.monotonic()
        for end in [e for e in self._ends if e[0] <= now]:
            self._ends.remove(end)
            self.log(f"{end[1]} ends")
            end[2]()
        kind = self._due(now)
        if kind is not None:
            duration, end = getattr(self, "_fault_" + kind.replace("-", "_"))()
            self.counts[kind] += 1
            self.log(f"{kind} for {duration:.1f}s")
            self._ends.append((time.monotonic() + duration, kind, end))

    def end_all(self) -> None:
        """Lifts every fault still on, at once."""
        while self._ends:
            _, kind, end = self._ends.pop(0)
            self.log(f"{kind} ends (deadline)")
            end()
        self.proxy.throttle(0)

    def _due(self, now: float) -> str | None:
        busy = self.active()
        if self.plan is not None:
            if self.plan and now - self._t0 >= self.plan[0][0] and _GROUP[self.plan[0][1]] not in busy:
                return self.plan.pop(0)[1]
            return None
        if now < self._next:
            return None
        self._next = now + self.rng.uniform(*self.every)
        free = [k for k in self.kinds if _GROUP[k] not in busy]
        if not free:
            return None
        return self.rng.choices(free, [WEIGHTS[k] for k in free])[0]

    # Each fault starts now and returns (its duration, how it ends).

    def _fault_kill_server(self) -> tuple[float, Callable[[], None]]:
        """SIGKILL now; started again on the same state after 0-3 s."""
        self.server.kill()
        return self.rng.uniform(0.0, 3.0), self.server.start

    def _fault_kill_server_after_save(self) -> tuple[float, Callable[[], None]]:
        """SIGKILL the instant the writer's next save returns (the writer
        sends it): between a commit and what the server does next. Armed
        for 1-5 s; the server is started again at its end."""
        self.server.arm_kill(self.writer.kill_trigger)

        def end() -> None:
            if self.server.disarm_kill(self.writer.kill_trigger):
                self.server.start()
            else:
                self.untriggered += 1
        return self.rng.uniform(1.0, 5.0), end

    def _fault_kill_writer(self) -> tuple[float, Callable[[], None]]:
        """SIGKILL now; started again after 0-2 s."""
        self.writer.kill()
        return self.rng.uniform(0.0, 2.0), self.writer.start

    def _fault_s3_reset(self) -> tuple[float, Callable[[], None]]:
        """The endpoint goes away: every connection reset, open ones too."""
        self.proxy.refuse()
        return self.rng.uniform(0.2, 3.0), self.proxy.accept

    def _fault_s3_midbody(self) -> tuple[float, Callable[[], None]]:
        """The next 1-3 connections to send 64 KiB-4 MiB more are cut there."""
        self.relay.arm(self.rng.randint(64 << 10, 4 << 20), self.rng.randint(1, 3))
        return self.rng.uniform(2.0, 10.0), self.relay.disarm

    def _fault_s3_freeze(self) -> tuple[float, Callable[[], None]]:
        """Every request waits, unanswered, until the endpoint is released."""
        self.proxy.hold(lambda request: True)
        return self.rng.uniform(1.0, 15.0), self.proxy.release

    def _fault_s3_slowdown(self) -> tuple[float, Callable[[], None]]:
        """The next n requests are answered 503 SlowDown."""
        self.proxy.throttle(self.rng.randint(3, 40))
        return self.rng.uniform(2.0, 10.0), lambda: self.proxy.throttle(0)

    def _fault_dir_readonly(self) -> tuple[float, Callable[[], None]]:
        """No file can be made or renamed in one directory of the directory
        root, not even by root: ``chattr +i``."""
        return self.rng.uniform(1.0, 6.0), self._make_immutable([self.readonly_dir])

    def _fault_state_readonly(self) -> tuple[float, Callable[[], None]]:
        """The server's state dir and every file in it (the SQLite database
        and its WAL, the upload journals) refuse writes, even on the fds the
        server holds open (``chattr +i``, as a failing disk under it would),
        for 1-5 s; meanwhile the server is SIGKILLed right after a save
        returns, and started again once the state dir is writable."""
        state = self.server.state_dir
        writable = self._make_immutable(
            [state] + [os.path.join(state, n) for n in sorted(os.listdir(state))])
        self.server.arm_kill(self.writer.kill_trigger)

        def end() -> None:
            killed = self.server.disarm_kill(self.writer.kill_trigger)
            writable()
            if killed:
                self.server.start()
            else:
                self.untriggered += 1
        return self.rng.uniform(1.0, 5.0), end

    def _make_immutable(self, paths: list[str]) -> Callable[[], None]:
        """``chattr +i`` on ``paths``; returns what makes them writable again."""
        self._immutable += paths
        subprocess.run(["chattr", "+i", *paths], check=True)

        def writable() -> None:
            subprocess.run(["chattr", "-i", *paths], check=False)
            self._immutable = [p for p in self._immutable if p not in paths]
        return writable

    def _chattr_works(self) -> bool:
        if subprocess.run(["chattr", "+i", self.readonly_dir], capture_output=True).returncode:
            return False
        subprocess.run(["chattr", "-i", self.readonly_dir], check=True)
        return True

    def writable(self) -> None:
        """Ends every -readonly fault still on (the soak's last word)."""
        if self._immutable:
            subprocess.run(["chattr", "-i", *self._immutable], check=False)
            self._immutable.clear()
