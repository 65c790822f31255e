"""moto's S3 server in a child process on loopback: the S3 endpoint of the
s3 tests and of ``tce bench --s3``.

A process of its own (``python -m moto.server``), not a thread: the server
under test and the client timing it never share moto's interpreter (its
GIL). moto and boto3 are test and bench dependencies (``make setup``
installs them; ``pip install 'tce[bench]'``): :func:`require` says so when
they are missing.
"""

from __future__ import annotations

import http.client
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from tce.tools._ports import free_port

# moto accepts any credentials; these are what the clients of a run sign with.
ACCESS_KEY = "tce-test-access-key"
SECRET_KEY = "tce-test-secret-key"
REGION = "us-east-1"


class MissingDependency(RuntimeError):
    pass


def require(what: str = "this") -> None:
    """Raises :class:`MissingDependency`, naming the install, unless moto's
    server and boto3 can be imported."""
    missing = [m for m in ("boto3", "moto", "flask") if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingDependency(
            f"{what} needs moto's S3 server and boto3 ({', '.join(missing)} not installed): "
            "pip install 'moto[server]>=5.2,<5.3' 'boto3>=1.43,<1.44' (make setup does)")


def credentials_env() -> dict[str, str]:
    """The environment a process signs its S3 requests with (the AWS
    variables; the tce-server reads them when given no credentials file)."""
    return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION}


def _answers(host: str, port: int) -> bool:
    conn = http.client.HTTPConnection(host, port, timeout=2)
    try:
        conn.request("GET", "/")
        conn.getresponse().read()
        return True
    except OSError:
        return False
    finally:
        conn.close()


class MotoServer:
    """``python -m moto.server`` on ``host`` and a free port, its log in a
    file. A context manager: started on entry, killed on exit whatever
    happened inside.

    ``endpoint``: ``http://host:port``; :meth:`boto3`: a client of it
    (fixed credentials, ``us-east-1``, path-style addressing);
    :meth:`make_bucket`.
    """

    def __init__(self, *, host: str = "127.0.0.1", log_path: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.host = host
        self.port = 0
        self._tmpdir = None
        if log_path is None:
            self._tmpdir = tempfile.mkdtemp(prefix="tce-moto-")
            log_path = os.path.join(self._tmpdir, "moto.log")
        self.log_path = log_path
        self._env = env
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> "MotoServer":
        """Starts it and returns once it answers HTTP (bounded by
        ``timeout``). A port taken between its choice and moto's bind is
        chosen again."""
        require("an S3 endpoint on loopback")
        deadline = time.monotonic() + timeout
        for _ in range(5):
            self.port = free_port(self.host)
            with open(self.log_path, "ab") as log:
                offset = log.tell()
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=dict(os.environ, **(self._env or {})), start_new_session=True)
            while not _answers(self.host, self.port):
                if self.proc.poll() is not None:
                    break
                if time.monotonic() > deadline:
                    self.kill()
                    raise TimeoutError(f"moto did not answer on {self.endpoint} in {timeout}s:\n"
                                       f"{self.log()}")
                time.sleep(0.05)
            else:
                return self
            if "address already in use" not in self.log()[offset:].lower():
                break
        raise RuntimeError(f"moto exited with {self.proc.returncode}:\n{self.log()}")

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def boto3(self, endpoint: str | None = None, **config: Any):
        """A boto3 S3 client of ``endpoint`` (default: this server; a proxy
        in front of it otherwise). ``config``: botocore Config arguments
        (``retries={"max_attempts": 1}``, ...)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=endpoint or self.endpoint, region_name=REGION,
            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
            config=Config(s3={"addressing_style": "path"}, **config))

    def make_bucket(self, name: str) -> str:
        self.boto3().create_bucket(Bucket=name)
        return name

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def cleanup(self) -> None:
        self.kill()
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)

    def __enter__(self) -> "MotoServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        try:
            self.stop()
        finally:
            self.cleanup()
