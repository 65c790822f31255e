"""`tce wait` on a terminal shows the files and bytes left to persist, one
line redrawn in place, and erases it before its own output; into a pipe
(or with --no-progress) its output is what it always was. The wait is held
by the S3 endpoint: moto's server behind the fault proxy holds one file's
upload until the test lets it go."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import threading
import uuid

import pytest
import torch

import tce
from tce import api, client
from tce.core import _knobs
from tce.tools._moto import credentials_env
from tce.tools._server import LocalServer

pytestmark = pytest.mark.s3

ERASE = "\r\033[K"


class _Terminal:
    """A pseudo-terminal for a command's stderr; what the command wrote
    there is collected by a thread until the command closes it."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        self._text = b""
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)

    def start(self) -> None:
        os.close(self.slave)  # the command holds its own copy
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 4096)
            except OSError:  # EIO: every writer closed the terminal
                chunk = b""
            with self._changed:
                if not chunk:
                    self._changed.notify_all()
                    return
                self._text += chunk
                self._changed.notify_all()

    def wait_for(self, text: str, timeout: float = 60.0) -> None:
        with self._changed:
            if not self._changed.wait_for(lambda: text.encode() in self._text, timeout):
                raise AssertionError(f"{text!r} never came; the terminal shows {self._text!r}")

    def text(self) -> str:
        """All of it, once the command ended."""
        self._reader.join(timeout=60)
        os.close(self.master)
        return self._text.decode()


@pytest.fixture
def held(tmp_path, s3_bucket, fault_proxy):
    """A server with an object root behind the fault proxy, and in it `a.pt`
    on storage and `b.pt` cached, its upload held: (socket, a, b, b's size)."""
    root = str(tmp_path / "ckpt")
    server = LocalServer(memory_budget="256MiB", storage_roots=[f"{root}=s3://{s3_bucket}/run1"],
                         extra_args=["--memory-backing", "4k", "--s3-endpoint", fault_proxy.endpoint,
                                     "--s3-path-style", "true"],
                         env={**os.environ, **credentials_env()}).start()
    a, b = f"{root}/a.pt", f"{root}/b.pt"
    try:
        with _knobs.override(socket=server.socket, job=f"wait-{uuid.uuid4().hex[:8]}", on_unavailable="raise"):
            fault_proxy.hold(lambda q: q.kind == "PutObject" and q.path.endswith("/b.pt"))
            tce.save({"w": torch.arange(1000)}, a)
            tce.save({"w": torch.arange(3000)}, b)
            tce.wait([a])
            fault_proxy.wait_held()
            yield server.socket, a, b, client.lookup(b).size
            fault_proxy.release()
            api.close()
    finally:
        fault_proxy.release()
        assert server.stop() == 0, server.log()
        server.cleanup()


def _tce_wait(socket: str, *args: str, stderr: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tce.cli", "--socket", socket, "wait", *args],
                            stdout=subprocess.PIPE, stderr=stderr, text=True)


def _kib(n: int) -> str:
    """`n` bytes as tce writes a size of 1 KiB to 1 MiB."""
    assert 1024 <= n < 1 << 20, n
    return f"{n / 1024:.1f} KiB"


def test_on_a_terminal_the_bytes_left_show_and_are_erased_at_the_end(held, fault_proxy):
    socket, a, b, size = held
    term = _Terminal()
    p = _tce_wait(socket, a, b, stderr=term.slave)
    term.start()
    term.wait_for(f"{ERASE}waiting: 1 of 2 file(s), {_kib(size)} left")  # a is on storage, b is not
    term.wait_for(" B/s")  # from the second redraw on: the rate, nothing became durable since
    fault_proxy.release()
    out, _ = p.communicate(timeout=60)
    shown = term.text()
    assert (p.returncode, out) == (0, f"durable   {a}\ndurable   {b}\n")
    assert "\n" not in shown and shown.endswith(ERASE), shown  # the line is gone before the results
    assert all(line.startswith("waiting: 1 of 2 file(s), ") for line in shown.split(ERASE)[1:-1]), shown


def test_on_a_terminal_a_timeout_erases_the_line_before_its_error(held):
    socket, a, b, size = held
    term = _Terminal()
    p = _tce_wait(socket, "--timeout", "1.5", a, b, stderr=term.slave)
    term.start()
    out, _ = p.communicate(timeout=60)
    shown = term.text()
    assert (p.returncode, out) == (1, "")
    assert f"{ERASE}waiting: 1 of 2 file(s), {_kib(size)} left" in shown, shown
    assert shown.endswith(ERASE + _timed_out(b).replace("\n", "\r\n")), shown


def _timed_out(b: str) -> str:
    """What `tce wait` says when its timeout passes with `b` not on storage."""
    return f"tce wait: DEADLINE_EXCEEDED: 1 of 2 file(s) not persisted yet, e.g. {b}\n"


@pytest.mark.parametrize("where", ["pipe", "terminal with --no-progress"])
def test_elsewhere_the_output_is_only_the_results(held, fault_proxy, where):
    """A wait that outlasts several redraws (its timeout passes, b still
    held) prints its error and nothing else; then, b on storage, the results."""
    socket, a, b, _ = held
    term = _Terminal() if where != "pipe" else None
    flags = ["--no-progress"] if term else []
    p = _tce_wait(socket, *flags, "--timeout", "1.5", a, b, stderr=term.slave if term else subprocess.PIPE)
    if term:
        term.start()
    out, err = p.communicate(timeout=60)
    err = term.text().replace("\r\n", "\n") if term else err  # a terminal ends lines with \r\n
    assert (p.returncode, out, err) == (1, "", _timed_out(b))
    fault_proxy.release()
    tce.wait([b])
    p = _tce_wait(socket, *flags, a, b, stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=60)
    assert (p.returncode, out, err) == (0, f"durable   {a}\ndurable   {b}\n", "")
