"""A throwaway MariaDB server for tests: its own datadir, socket and a free
loopback port; stopped (and its files removed) afterwards."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from tce.tools._ports import free_port


class MariaDB:
    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="tce-mariadb-")
        self.datadir = os.path.join(self.dir, "data")
        self.socket = os.path.join(self.dir, "mysqld.sock")
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.user, self.password, self.database = "tce", "tce-test-pw", "tce"
        subprocess.run(["mariadb-install-db", f"--datadir={self.datadir}",
                        "--auth-root-authentication-method=normal", "--skip-test-db"],
                       check=True, capture_output=True)
        self.start()
        self.sql(f"CREATE DATABASE {self.database}; "
                 f"CREATE USER '{self.user}'@'127.0.0.1' IDENTIFIED BY '{self.password}'; "
                 f"GRANT ALL ON {self.database}.* TO '{self.user}'@'127.0.0.1';")

    @property
    def url(self) -> str:
        return f"mysql://{self.user}:{self.password}@127.0.0.1:{self.port}/{self.database}"

    def start(self, timeout: float = 30) -> None:
        log = open(os.path.join(self.dir, "mariadbd.log"), "ab")
        self.proc = subprocess.Popen(
            ["mariadbd", f"--datadir={self.datadir}", f"--socket={self.socket}",
             f"--port={self.port}", "--bind-address=127.0.0.1", "--user=root",
             "--skip-log-bin", "--skip-name-resolve", "--innodb-buffer-pool-size=32M",
             f"--pid-file={os.path.join(self.dir, 'mariadbd.pid')}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while subprocess.run(["mariadb", f"--socket={self.socket}", "-uroot", "-e", "SELECT 1"],
                             capture_output=True).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("mariadbd did not start: " +
                                   open(os.path.join(self.dir, "mariadbd.log")).read()[-2000:])
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)

    def sql(self, statements: str) -> str:
        p = subprocess.run(["mariadb", f"--socket={self.socket}", "-uroot", "-N", "-B", "-e",
                            statements], capture_output=True, text=True, check=True)
        return p.stdout

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
