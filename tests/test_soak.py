"""The soak (tests/soak.py) end to end, short, so that it cannot rot: half a
minute with a fixed plan of faults (each kind once, the server killed
twice), then its self-check, which flips one byte of one stored file per
root after the run: the soak must report exactly those two files lost and
nothing else, so its verification is shown to compare bytes.

The plan has every kind of fault the soak draws, kill-server-after-save and
state-readonly included: the server killed right after a save, before it
recorded the save (docs/testing.md, "The soak")."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tce.tools import _moto

pytestmark = [pytest.mark.slow, pytest.mark.s3]

SOAK = Path(__file__).with_name("soak.py")
PLAN = ("kill-server@2,s3-midbody@4,kill-writer@7,s3-slowdown@9,s3-reset@12,dir-readonly@14,"
        "s3-freeze@17,kill-server@20,state-readonly@22,kill-server-after-save@25")


def _processes_naming(text: str) -> list[str]:
    """Command lines of the processes whose command line holds ``text``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found.append(f"{pid}: {cmd}")
    return found


@pytest.mark.timeout(600)
def test_a_short_soak_with_every_fault_reports_exactly_the_files_corrupted_after_it(tmp_path):
    try:
        _moto.require("the soak")
    except _moto.MissingDependency as e:
        pytest.skip(str(e))
    work = tmp_path / "work"
    proc = subprocess.Popen(
        [sys.executable, str(SOAK), "--minutes", "0.55", "--seed", "7", "--plan", PLAN,
         "--self-check", "--work-dir", str(work)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=240)  # a bound on a hang: about 50 s on 2 cores
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # it ends its children on the way out
        out, _ = proc.communicate(timeout=120)
        pytest.fail(f"the soak did not end:\n{out}")
    assert proc.returncode == 0, out
    assert not _processes_naming(str(work)), "the soak left processes behind"

    faults = re.search(r"^  faults: (.*)$", out, re.M).group(1)
    for kind in ("s3-midbody", "kill-writer", "s3-slowdown", "s3-reset", "s3-freeze"):
        assert f"{kind} 1," in faults, out
    assert "kill-server 2," in faults, out
    if os.geteuid() == 0:
        assert "dir-readonly 1" in faults, out
        assert "state-readonly 1" in faults, out
    assert "kill-server-after-save 1," in faults, out
    # Two kill-server, one kill-server-after-save, and state-readonly's kill
    # when a save returned while it held (one does, unless the machine is slow).
    server = re.search(r"server: (\d+) starts, (\d+) SIGKILLed, 0 unexpected exits, exit status after "
                       r"SIGTERM \[0, 0\]", out)
    assert server and int(server.group(1)) == int(server.group(2)) + 2 and int(server.group(2)) in (3, 4), out
    acknowledged = int(re.search(r"(\d+) acknowledged durable", out).group(1))
    assert acknowledged > 10, out

    corrupted = re.search(r"self-check: corrupted \[(.*)\] after the run; the soak reported \[(.*)\]: "
                          r"as expected", out)
    assert corrupted, out
    paths = [p.strip(" '") for p in corrupted.group(1).split(",")]
    assert corrupted.group(1) == corrupted.group(2) and len(paths) == 2, out
    assert {"dir", "s3"} == {"s3" if "/s3root/" in p else "dir" for p in paths}, out
    lost = re.findall(r"^  LOST (\S+) \((dir|s3)\): .* found (\d+) bytes, digest", out, re.M)
    assert sorted(p for p, _, _ in lost) == sorted(paths), out
    assert out.rstrip().splitlines()[-1].startswith("result: PASS"), out
