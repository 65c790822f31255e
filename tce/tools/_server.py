"""Finding and running the tce-server binary (for the CLI, tests, demo, bench)."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from typing import Sequence

# tce/tools/_server.py -> the repository root (a development checkout)
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def server_binary() -> str:
    """Path of tce-server: $TCE_SERVER_BIN, else the one installed with this
    package (scripts dir / PATH), else a development build under build/."""
    env = os.environ.get("TCE_SERVER_BIN")
    if env:
        return env
    candidates = [
        os.path.join(os.path.dirname(sys.executable), "tce-server"),
        os.path.join(sysconfig.get_path("scripts"), "tce-server"),
        shutil.which("tce-server") or "",
        *sorted(glob.glob(os.path.join(_REPO, "build", "*", "server_cpp", "tce-server"))),
    ]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    raise FileNotFoundError(
        "tce-server not found: install the package (pip install .), run `make build`, "
        "or set TCE_SERVER_BIN"
    )


def _accepting(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


class LocalServer:
    """A tce-server child process on its own socket (a temp dir by default).

    ``binary`` runs another build of the server (tests: tce-server-faulty);
    default: :func:`server_binary`.
    """

    def __init__(
        self,
        *,
        socket_path: str | None = None,
        memory_budget: str = "1GiB",
        storage_roots: Sequence[str] = (),
        state_dir: str | None = None,
        extra_args: Sequence[str] = (),
        log_path: str | None = None,
        env: dict[str, str] | None = None,
        netns: str | None = None,
        drain_timeout_ms: int = 0,
        binary: str | None = None,
    ) -> None:
        self._tmpdir = None
        if socket_path is None:
            self._tmpdir = tempfile.mkdtemp(prefix="tce-")
            socket_path = os.path.join(self._tmpdir, "tce.sock")
        self.socket = socket_path
        # In a network namespace (multi-node tests): its peer traffic uses
        # that namespace's addresses; the Unix sockets stay reachable by path.
        prefix = ["ip", "netns", "exec", netns] if netns else []
        self.args = [
            *prefix, binary or server_binary(), "--socket", socket_path,
            "--memory-budget", memory_budget,
            # Throwaway servers (tests, demo, bench) stop at once by default;
            # the drain is the deployed server's (and its own test's) business.
            "--drain-timeout-ms", str(drain_timeout_ms), *extra_args,
        ]
        if storage_roots:
            self.args += ["--storage-roots", ",".join(storage_roots)]
        # Its own metadata (SQLite) next to the socket unless told otherwise,
        # so servers started side by side never share state.
        self.state_dir = state_dir or os.path.join(os.path.dirname(socket_path), "state")
        self.args += ["--state-dir", self.state_dir]
        self.log_path = log_path or os.path.join(
            self._tmpdir or os.path.dirname(socket_path), "tce-server.log"
        )
        self._env = env
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 20.0) -> "LocalServer":
        log = open(self.log_path, "ab")
        env = dict(os.environ, **(self._env or {}))
        self.proc = subprocess.Popen(
            self.args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not _accepting(self.socket + ".fd"):
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"tce-server exited with {self.proc.returncode}:\n{self.log()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"tce-server did not start in {timeout}s:\n{self.log()}")
            time.sleep(0.02)
        return self

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def cleanup(self) -> None:
        self.kill()
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)

    def __enter__(self) -> "LocalServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self.cleanup()
