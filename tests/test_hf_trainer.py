"""Hugging Face Trainer with DeepSpeed ("checkpoint_engine": "tce"), ZeRO-2,
on CPU: checkpoint rotation (save_total_limit) frees the disk, and a resume
in a new process reads from the cache and trains bit for bit as an
uninterrupted run. Two ranks, one process each (gloo), as torchrun starts
them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tce.core._client import Client
from tce.tools._server import LocalServer

from helpers import Hold, until
from tce.tools._ports import free_port

pytestmark = [pytest.mark.deepspeed, pytest.mark.timeout(600)]

SCRIPT = Path(__file__).with_name("hf_train.py")
WORLD = 2  # ranks (processes) per run


def _train(server: LocalServer, job: str, out_dir: Path, result: Path, *args: str,
           world: int = WORLD) -> list[dict]:
    """One run, a process per rank; each rank's result."""
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = dict(os.environ, TCE_SOCKET=server.socket, TCE_JOB=job, TCE_ON_UNAVAILABLE="raise",
                   RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                   OMP_NUM_THREADS="1")
        log = open(f"{result}.{rank}.log", "w")
        procs.append(subprocess.Popen(
            [sys.executable, str(SCRIPT), "--out-dir", str(out_dir), "--result", str(result), *args],
            env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        codes = [p.wait(timeout=400) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    logs = "\n".join(Path(f"{result}.{r}.log").read_text()[-4000:] for r in range(world))
    assert codes == [0] * world, f"exit codes {codes}\n{logs}"
    return [json.loads(Path(f"{result}.{r}").read_text()) for r in range(world)]


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
    assert [(r["engine"], r["world"]) for r in first] == [("TCECheckpointEngine", WORLD)] * WORLD
    # ZeRO-2: each rank's optimizer shard, rank 0's model states, all persisted
    assert sorted(p.name for p in (run / "checkpoint-8" / "global_step8").iterdir()) == \
        ["mp_rank_00_model_states.pt"] + \
        [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(WORLD)]

    resumed = _train(server, job, run, tmp_path / "resumed.json", "--steps", "12", "--resume")
    for r in resumed:  # every DeepSpeed state of every rank came from the cache
        assert r["loads_from_cache"] > 0 and r["loads_from_storage"] == 0, resumed

    straight = _train(server, f"{job}-straight", server.storage / "straight",
                      tmp_path / "straight.json", "--steps", "12")
    for rank in range(WORLD):
        losses = {int(k): v for k, v in straight[rank]["losses"].items()}
        assert sorted(losses) == list(range(1, 13)), losses
        assert {int(k): v for k, v in first[rank]["losses"].items()} == \
            {s: losses[s] for s in range(1, 9)}, rank
        assert {int(k): v for k, v in resumed[rank]["losses"].items()} == \
            {s: losses[s] for s in range(9, 13)}, rank
