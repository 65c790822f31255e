"""Hugging Face Trainer with DeepSpeed ("checkpoint_engine": "tce"), ZeRO-2,
on CPU: checkpoint rotation (save_total_limit) frees the disk, and a resume
in a new process reads from the cache and trains bit for bit as an
uninterrupted run. One process (rank) per run: enough for the Trainer's
rotation and resume paths, which run on rank 0 alone."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tce._client import Client
from tce._server import LocalServer

from helpers import Hold, until

pytestmark = [pytest.mark.deepspeed, pytest.mark.timeout(600)]

SCRIPT = Path(__file__).with_name("hf_train.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(server: LocalServer, job: str, out_dir: Path, result: Path, *args: str) -> dict:
    env = dict(os.environ, TCE_SOCKET=server.socket, TCE_JOB=job, TCE_ON_UNAVAILABLE="raise",
               RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, str(SCRIPT), "--out-dir", str(out_dir), "--result", str(result),
                        *args], env=env, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    return json.loads(result.read_text())


def _quiet(server: LocalServer) -> bool:
    c = Client(server.socket, rpc_timeout=10)
    try:
        return c.status().persist_queue == 0
    finally:
        c.close()


@pytest.fixture
def server(tmp_path):
    storage = tmp_path / "storage"
    storage.mkdir()
    s = LocalServer(memory_budget="1GiB", storage_roots=[str(storage)],
                    extra_args=["--persist-threads", "1"]).start()
    s.storage = storage
    yield s
    code = s.stop()
    s.cleanup()
    assert code == 0, s.log()


def test_rotation_frees_the_disk_and_a_resume_from_the_cache_is_bitwise(server, tmp_path):
    job = f"hf-{uuid.uuid4().hex[:8]}"
    run = server.storage / "run"
    # Persistence is held back (a save in flight elsewhere) the whole run, so
    # the Trainer rotates checkpoints (shutil.rmtree) before they persist.
    hold = Hold(server.socket, job, server.storage)
    try:
        first = _train(server, job, run, tmp_path / "first.json", "--steps", "8")
    finally:
        hold.release()
    until(lambda: _quiet(server), timeout=120, what="persistence to finish")
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("checkpoint-")) == \
        ["checkpoint-6", "checkpoint-8"]
    assert first["engine"] == "TCECheckpointEngine"

    resumed = _train(server, job, run, tmp_path / "resumed.json", "--steps", "12", "--resume")
    assert resumed["loads_from_cache"] > 0 and resumed["loads_from_storage"] == 0, resumed

    straight = _train(server, f"{job}-straight", server.storage / "straight",
                      tmp_path / "straight.json", "--steps", "12")
    losses = {int(k): v for k, v in straight["losses"].items()}
    assert {int(k): v for k, v in first["losses"].items()} == {s: losses[s] for s in range(1, 9)}
    assert {int(k): v for k, v in resumed["losses"].items()} == {s: losses[s] for s in range(9, 13)}
