"""Comparison helpers for round-trip tests."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import glob
import hashlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tce.tools._server import server_binary


def assert_same(a: Any, b: Any, path: str = "obj") -> None:
    """Recursively equal, tensors bitwise (dtype, shape, stride, bytes)."""
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)}"
        assert a.stride() == b.stride(), f"{path}: stride {a.stride()} != {b.stride()}"
        assert a.storage_offset() == b.storage_offset(), f"{path}: storage offset"
        assert a.requires_grad == b.requires_grad, f"{path}: requires_grad"
        sa, sb = a.untyped_storage(), b.untyped_storage()
        assert sa.nbytes() == sb.nbytes(), f"{path}: storage size"
        ta = torch.empty(0, dtype=torch.uint8).set_(sa, 0, (sa.nbytes(),), (1,))
        tb = torch.empty(0, dtype=torch.uint8).set_(sb, 0, (sb.nbytes(),), (1,))
        assert torch.equal(ta, tb), f"{path}: bytes differ"
    elif isinstance(a, (torch.UntypedStorage, torch.storage.TypedStorage)):
        ua = a if isinstance(a, torch.UntypedStorage) else a._untyped_storage
        ub = b if isinstance(b, torch.UntypedStorage) else b._untyped_storage
        assert bytes(ua) == bytes(ub), f"{path}: storage bytes differ"
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: len"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def every_dtype() -> list[torch.dtype]:
    names = [
        "float64", "float32", "float16", "bfloat16", "complex128", "complex64", "complex32",
        "int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64", "bool",
        "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
    ]
    return [getattr(torch, n) for n in names if hasattr(torch, n)]


def sample_tensor(dtype: torch.dtype, n: int = 37) -> torch.Tensor:
    raw = torch.arange(n * torch.empty(0, dtype=dtype).element_size(), dtype=torch.uint8)
    raw = (raw * 37 + 11) % 251
    if dtype == torch.bool:
        return (raw[:n] % 2).bool()
    return raw.view(dtype)


def faulty_server_binary() -> str:
    """tce-server-faulty, the test build of the server with faults to inject
    (``--ring-fault corrupt``): $TCE_FAULTY_SERVER_BIN, else beside the
    tce-server the tests run, else in a build tree under build/ (``make
    build`` makes it: TCE_BUILD_TESTS=ON). Skips the test when none is built."""
    env = os.environ.get("TCE_FAULTY_SERVER_BIN")
    candidates = [env] if env else [
        os.path.join(os.path.dirname(os.path.realpath(server_binary())), "tce-server-faulty"),
        *sorted(glob.glob(str(Path(__file__).resolve().parent.parent / "build" / "*" / "server_cpp"
                              / "tce-server-faulty"))),
    ]
    for c in candidates:
        if os.access(c, os.X_OK):
            return c
    pytest.skip("tce-server-faulty is not built (configure with TCE_BUILD_TESTS=ON, as make build "
                "does, or set TCE_FAULTY_SERVER_BIN)")


def until(predicate, timeout: float = 60.0, what: str = "condition"):
    """Polls `predicate` until it returns something true, and returns that;
    fails naming `what` after `timeout` seconds (a bound on a hang only: a
    loaded machine may take long)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def wait_metadata_written(timeout: float = 30.0) -> None:
    """Until the server in use (the socket setting) has written every queued
    metadata change: its writer is asynchronous."""
    import tce

    until(lambda: not int(tce.status()["metadata_queue"]), timeout,
          "the metadata writer to catch up")


class Blocker:
    """Keeps persistence of one path failing until released: an immutable
    file (``chattr +i``) stands at the path, and no rename may replace it, not
    even root's. Each attempt fails with EPERM and is retried; the save itself
    is accepted (its directory exists and the path is a file)."""

    def __init__(self, path, owner: tuple[int, int] | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_bytes(b"a placeholder persistence cannot replace")
        if owner is not None:
            os.chown(self.path, *owner)
        subprocess.run(["chattr", "+i", str(self.path)], check=True)
        self.held = True
        atexit.register(self.release)  # never leave an undeletable file behind

    def release(self) -> None:
        if self.held:
            self.held = False
            subprocess.run(["chattr", "-i", str(self.path)], check=True)

    def __enter__(self) -> "Blocker":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class LoopMount:
    """A real ext4 filesystem on a loop device, mounted at ``path``: storage
    that can be taken away (``unmount``) as a failed disk or a lost network
    mount would be. Needs root."""

    def __init__(self, path, size_mb: int = 64) -> None:
        self.path = Path(path)
        self.image = self.path.with_name(self.path.name + ".img")
        self.path.mkdir(parents=True, exist_ok=True)
        with open(self.image, "wb") as f:
            f.truncate(size_mb << 20)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(self.image)], check=True, capture_output=True)
        subprocess.run(["mount", "-o", "loop", str(self.image), str(self.path)], check=True)
        self.mounted = True

    def unmount(self) -> None:
        if self.mounted:
            self.mounted = False
            subprocess.run(["umount", "-l", str(self.path)], check=True)

    def close(self) -> None:
        self.unmount()
        self.image.unlink(missing_ok=True)


@contextlib.contextmanager
def loop_mount(path, size_mb: int = 64):
    m = LoopMount(path, size_mb)
    try:
        yield m
    finally:
        m.close()


class FailingMount:
    """A FUSE passthrough of ``backing`` at ``mountpoint`` (tests/failing_fs.py)
    whose every operation fails with EIO between :meth:`fail` and :meth:`heal`,
    as a bad disk or a wedged network filesystem does, while it stays mounted."""

    def __init__(self, backing: Path, mountpoint: Path) -> None:
        backing.mkdir(parents=True, exist_ok=True)
        mountpoint.mkdir(parents=True, exist_ok=True)
        self.path = mountpoint
        self.switch = backing.parent / (backing.name + ".fail")
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("failing_fs.py")), str(backing),
             str(mountpoint), str(self.switch)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        until(lambda: os.path.ismount(mountpoint) or self.proc.poll() is not None, timeout=30,
              what="the FUSE mount")
        if self.proc.poll() is not None:
            raise RuntimeError("failing_fs.py did not mount: " + self.proc.stderr.read().decode())

    def fail(self) -> None:
        self.switch.touch()

    def heal(self) -> None:
        self.switch.unlink(missing_ok=True)

    def close(self) -> None:
        self.heal()
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def failing_mount(backing: Path, mountpoint: Path):
    m = FailingMount(backing, mountpoint)
    try:
        yield m
    finally:
        m.close()


class Hold:
    """Holds persistence back: a save being written into the cache (an
    allocation never committed) makes the persister wait before it writes
    (up to 5 s a file), as it yields to training."""

    def __init__(self, socket: str, job: str, storage: Path) -> None:
        from tce.core._client import Client
        from tce.v1 import tce_pb2 as pb

        self.c = Client(socket, rpc_timeout=10)
        self.job = job
        resp = self.c._call("Allocate", pb.AllocateRequest(
            session=self.c.session, job=job, path=str(storage / "held.pt"), size=4096))
        self.allocation = resp.allocation_id

    def release(self) -> None:
        from tce.v1 import tce_pb2 as pb

        self.c._call("Abort", pb.AbortRequest(session=self.c.session, allocation_id=self.allocation))
        self.c.close()


class SilentPeer:
    """A ring member that accepts connections and never says a word: a
    server thread that asks it anything waits for its peer timeout.
    ``conns``: the connections accepted so far."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.endpoint = "127.0.0.1:%d" % self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                self.conns.append(self.sock.accept()[0])
            except socket.timeout:
                continue

    def close(self) -> None:
        """Ends every connection: what waits on them fails at once."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        for c in self.conns:
            c.close()
        self.sock.close()


def exchange(a, b) -> None:
    """Swaps the names ``a`` and ``b`` atomically (renameat2 with
    RENAME_EXCHANGE): at no instant is either name missing, as an attacker
    swapping a directory for a symlink would do it."""
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd, rename_exchange = -100, 2
    if libc.renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(a))


def end_processes(procs, files=()) -> None:
    """Kills the processes still running (a test that failed midway) and
    closes their log files."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    for f in files:
        f.close()


def state_digest(state: dict) -> str:
    """SHA-256 of a flat state dict: each key, then its tensor's bytes (or
    repr), in key order; the same for the same state whoever loaded it."""
    h = hashlib.sha256()
    for name in sorted(state):
        value = state[name]
        h.update(name.encode())
        h.update(value.numpy().tobytes() if isinstance(value, torch.Tensor) else repr(value).encode())
    return h.hexdigest()


def call_on(socket: str, job: str, fn):
    """fn() as a client of the server at `socket`, for `job` (an unreachable
    server raises); the session is closed after."""
    from tce import api
    from tce.core import _knobs

    with _knobs.override(socket=socket, job=job, on_unavailable="raise"):
        try:
            return fn()
        finally:
            api.close()
