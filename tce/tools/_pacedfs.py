"""A paced passthrough FUSE filesystem: shared storage of a given bandwidth,
which counts what it serves (``tce bench --restore``).

    python -m tce.tools._pacedfs BACKING MOUNTPOINT [--rate BYTES_PER_S] [--burst BYTES]

mounts BACKING at MOUNTPOINT (fusepy, libfuse 2; root, ``allow_other``) and
passes every operation through. Reads share one token bucket of ``--rate``
bytes/s (0: not limited), whoever reads, as the readers of a shared
filesystem share its bandwidth; after an idle spell up to ``--burst`` bytes
go at once. The mount uses ``direct_io``, so the kernel's page cache never
answers a read: each byte a process reads is served, paced and counted
here, however often it is read.

The counters: reading ``MOUNTPOINT/.pacedfs-stats`` (not listed, not
counted, read-only) returns one JSON object, ``bytes_read`` and ``reads``
(what the filesystem served from BACKING), ``bytes_written``, ``writes``,
``rate`` and ``burst``; :meth:`PacedMount.stats` reads it. Runs in the
foreground until unmounted (``umount MOUNTPOINT``); :class:`PacedMount`
starts it, waits for the mount and unmounts it at the end, error or not.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import subprocess
import sys
import threading
import time

from tce.tools._passthrough import fuse, passthrough_class

STATS = ".pacedfs-stats"
_STATS_SIZE = 4096  # what getattr says of the stats file; its reads return the JSON


def _fuse():
    return fuse()


class Bucket:
    """A token bucket as a virtual clock: each read books the next
    ``n / rate`` seconds of the link and returns when its slot ends; an
    idle link lets ``burst`` bytes through at once."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._clock = 0.0
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        if self.rate <= 0 or n <= 0:
            return
        with self._lock:
            now = time.monotonic()
            self._clock = max(self._clock, now - self.burst / self.rate) + n / self.rate
            wait = self._clock - now
        if wait > 0:
            time.sleep(wait)


def make_operations(backing: str, rate: float, burst: int):
    """The fusepy Operations of the paced passthrough (built on demand, so
    importing this module needs no fusepy)."""
    _, FuseOSError, _ = _fuse()

    class Paced(passthrough_class()):
        def __init__(self) -> None:
            super().__init__(backing)
            self.bucket = Bucket(rate, burst)
            self._mu = threading.Lock()
            self.counts = {"bytes_read": 0, "reads": 0, "bytes_written": 0, "writes": 0}

        def __call__(self, op, path, *args):
            if path == "/" + STATS and op not in ("getattr", "open", "read", "release", "access",
                                                   "flush"):
                raise FuseOSError(errno.EACCES)
            return super().__call__(op, path, *args)

        def _stats(self) -> bytes:
            with self._mu:
                d = dict(self.counts, rate=rate, burst=burst)
            return json.dumps(d).encode().ljust(_STATS_SIZE)[:_STATS_SIZE]

        def getattr(self, path, fh=None):
            if path == "/" + STATS:
                now = time.time()
                return {"st_mode": 0o100444, "st_nlink": 1, "st_size": _STATS_SIZE, "st_uid": 0,
                        "st_gid": 0, "st_atime": now, "st_mtime": now, "st_ctime": now}
            return super().getattr(path, fh)

        def access(self, path, amode):
            if path != "/" + STATS:
                super().access(path, amode)

        def open(self, path, flags):
            if path == "/" + STATS:
                if flags & (os.O_WRONLY | os.O_RDWR):
                    raise FuseOSError(errno.EACCES)
                return 0  # no descriptor: read() answers from the counters
            return super().open(path, flags)

        def read(self, path, size, offset, fh):
            if path == "/" + STATS:
                return self._stats()[offset:offset + size]
            data = os.pread(fh, size, offset)
            self.bucket.take(len(data))
            with self._mu:
                self.counts["bytes_read"] += len(data)
                self.counts["reads"] += 1
            return data

        def write(self, path, data, offset, fh):
            n = os.pwrite(fh, data, offset)
            with self._mu:
                self.counts["bytes_written"] += n
                self.counts["writes"] += 1
            return n

        def release(self, path, fh):
            if path != "/" + STATS:
                os.close(fh)

    return Paced()


def _umount(mountpoint: str) -> None:
    """Unmounts; lazily if the mount is busy (a reader still holds a file)."""
    if not os.path.ismount(mountpoint):
        return
    tool = ["fusermount", "-u"] if shutil.which("fusermount") else ["umount"]
    if subprocess.run([*tool, mountpoint], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", mountpoint], capture_output=True)


class PacedMount:
    """The paced filesystem of ``backing`` at ``mountpoint``, in a process of
    its own (started by :meth:`start`, or ``with PacedMount(...)``)."""

    def __init__(self, backing: str, mountpoint: str, rate: float = 0, burst: int = 1 << 20) -> None:
        self.backing, self.mountpoint = backing, mountpoint
        self.rate, self.burst = rate, burst
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> "PacedMount":
        _fuse()  # says what is missing here rather than in the child
        os.makedirs(self.mountpoint, exist_ok=True)
        # Its messages go to a file beside the mount: a pipe nobody reads
        # would stall the filesystem once full.
        self.log_path = self.mountpoint.rstrip("/") + ".log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tce.tools._pacedfs", self.backing, self.mountpoint,
                 "--rate", str(self.rate), "--burst", str(self.burst)],
                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not os.path.ismount(self.mountpoint):
            if self.proc.poll() is not None:
                with open(self.log_path, errors="replace") as log:
                    raise RuntimeError("the paced filesystem did not mount: " + log.read()[-4000:])
            if time.monotonic() > deadline:
                self.close()
                raise TimeoutError(f"the paced filesystem did not mount in {timeout} s")
            time.sleep(0.02)
        return self

    def stats(self) -> dict[str, float]:
        """The counters: bytes_read, reads, bytes_written, writes (since the
        mount), rate, burst."""
        with open(os.path.join(self.mountpoint, STATS), "rb") as f:
            return json.loads(f.read())

    def close(self) -> None:
        _umount(self.mountpoint)
        if self.proc is not None:
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                _umount(self.mountpoint)

    def __enter__(self) -> "PacedMount":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tce.tools._pacedfs", description=__doc__.split("\n")[0])
    p.add_argument("backing")
    p.add_argument("mountpoint")
    p.add_argument("--rate", type=float, default=0, help="read bytes/s, shared (0: not limited)")
    p.add_argument("--burst", type=int, default=1 << 20, help="bytes an idle link lets through at once")
    a = p.parse_args(argv)
    FUSE, _, _ = _fuse()
    FUSE(make_operations(a.backing, a.rate, a.burst), a.mountpoint, foreground=True, nothreads=False,
         allow_other=True, direct_io=True, default_permissions=True)


if __name__ == "__main__":
    main()
