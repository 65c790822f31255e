"""The `tce` command writing into a pipe whose reader goes away (`tce status
| head -1`): it stops quietly, with the status a shell gives a command
that SIGPIPE killed, and no traceback."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import uuid

import torch

import tce

SIGPIPE_STATUS = 128 + signal.SIGPIPE


def _tce_into(write_fd: int, socket: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tce.cli", "--socket", socket, *args],
                            stdout=write_fd, stderr=subprocess.PIPE, text=True)


def test_status_into_a_pipe_no_one_reads_ends_quietly(server):
    r, w = os.pipe()
    os.close(r)  # the reader is gone before the first line
    p = _tce_into(w, server.socket, "status")
    os.close(w)
    _, err = p.communicate(timeout=60)
    assert err == "" and p.returncode == SIGPIPE_STATUS, (p.returncode, err)


def test_ls_ends_quietly_when_its_reader_closes_after_the_first_line(server, tmp_path):
    """More rows than the pipe and both sides' buffers hold: the command is
    still writing when the reader closes, whatever its buffering."""
    job = f"pipe-{uuid.uuid4().hex[:8]}"
    for i in range(300):
        tce.save({"i": i}, tmp_path / f"{i:03d}.pt", job=job)
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)  # one page
    p = _tce_into(w, server.socket, "ls", "--job", job)
    os.close(w)
    got = b""
    while b"\n" not in got:
        chunk = os.read(r, 4096)
        assert chunk, p.communicate(timeout=60)
        got += chunk
    os.close(r)
    _, err = p.communicate(timeout=60)
    assert got.split(b"\n")[0].split() == [b"JOB", b"TAG", b"RANK", b"STATE", b"SIZE", b"PATH"]
    assert err == "" and p.returncode == SIGPIPE_STATUS, (p.returncode, err)


def test_a_broken_pipe_that_is_not_stdout_is_reported():
    """A broken pipe of something else the command talks to is a failure:
    its traceback shows, though stdout still has its reader."""
    code = ("import sys\nfrom tce import api\nfrom tce.tools import cli\n"
            "def status():\n    raise BrokenPipeError(32, 'the other end of something else')\n"
            "api.status = status\nsys.exit(cli.main(['status']))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "BrokenPipeError: [Errno 32] the other end of something else" in p.stderr, p
