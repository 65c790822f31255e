"""Real DeepSpeed training on CPU (gloo) with "checkpoint_engine": "tce".

Every run is a set of real processes, one per rank (what torchrun starts),
killed with SIGKILL where the test says so.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tce._server import LocalServer

pytestmark = [pytest.mark.deepspeed]

HERE = Path(__file__).parent
SCRIPT = HERE / "ds_train.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Run:
    """One multi-process DeepSpeed run of tests/ds_train.py."""

    def __init__(self, world: int, args: list[str], *, socket_path: str, out: Path,
                 job: str = "ds-test", ready: bool = False) -> None:
        port = _free_port()
        self.world, self.out = world, out
        self.ready = str(out) + ".ready" if ready else ""
        self.procs = []
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       TCE_SOCKET=socket_path, TCE_JOB=job, TCE_ON_UNAVAILABLE="raise",
                       OMP_NUM_THREADS="1")
            cmd = [sys.executable, str(SCRIPT), *args, "--out", str(out)]
            if self.ready:
                cmd += ["--ready", self.ready]
            log = open(f"{out}-{rank}.log", "w")
            self.procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))

    def logs(self) -> str:
        return "\n".join(Path(f"{self.out}-{r}.log").read_text()[-4000:] for r in range(self.world))

    def wait(self, timeout: float = 240) -> list[dict]:
        """Until every rank exited 0 (or, with ready, is ready and SIGKILLed)."""
        deadline = time.monotonic() + timeout
        if self.ready:
            while not all(os.path.exists(f"{self.ready}-{r}") for r in range(self.world)):
                dead = [p.returncode for p in self.procs if p.poll() is not None]
                assert not dead and time.monotonic() < deadline, f"exit codes {dead}\n{self.logs()}"
                time.sleep(0.1)
            for p in self.procs:
                p.send_signal(signal.SIGKILL)
        for p in self.procs:
            try:
                p.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in self.procs:
                    q.kill()
                raise AssertionError(f"training timed out\n{self.logs()}")
        expected = -signal.SIGKILL if self.ready else 0
        codes = [p.returncode for p in self.procs]
        assert codes == [expected] * self.world, f"exit codes {codes}\n{self.logs()}"
        return [torch.load(f"{self.out}-{r}.pt", weights_only=False) for r in range(self.world)]


def _same(a, b, what: str) -> None:
    assert a.keys() == b.keys(), f"{what}: keys differ"
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), f"{what}{k} differs"
        else:
            assert x == y, f"{what}{k}: {x!r} != {y!r}"


def _same_state(a: dict, b: dict, what: str) -> None:
    _same(a["params"], b["params"], f"{what} param ")
    _same(a["optim"], b["optim"], f"{what} optimizer state ")
    assert torch.equal(a["seen"], b["seen"]) and a["global_steps"] == b["global_steps"], what


@pytest.fixture
def ds_server(tmp_path):
    storage = tmp_path / "storage"
    storage.mkdir()
    s = LocalServer(memory_budget="1GiB", storage_roots=[str(storage)],
                    state_dir=str(tmp_path / "state")).start()
    s.storage = storage
    yield s
    code = s.stop()
    s.cleanup()
    assert code == 0, s.log()


def _garble_storage(ckpt: Path) -> list[Path]:
    """Overwrite every persisted checkpoint file: a load that read storage would fail."""
    files = sorted(ckpt.rglob("*.pt"))
    for f in files:
        f.write_bytes(b"not a checkpoint: the cache must serve this")
    return files


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_sigkill_and_resume_from_cache_is_bitwise(ds_server, tmp_path, stage, world):
    ckpt = ds_server.storage / "ckpt"
    common = ["--stage", str(stage), "--ckpt", str(ckpt), "--steps", "5"]
    first = Run(world, [*common, "--save-at", "3", "--wait-persisted"],
                socket_path=ds_server.socket, out=tmp_path / "first", ready=True).wait()
    assert (ckpt / "latest").read_text() == "global_step3"
    garbled = _garble_storage(ckpt)
    # ZeRO-3 writes zero_pp_rank_<r>_mp_rank_00_model_states.pt per rank
    model_files = [f for f in garbled if f.name.endswith("model_states.pt")]
    assert len(model_files) == (world if stage == 3 else 1), garbled
    if stage:
        assert sum("optim_states" in f.name for f in garbled) == world
    resumed = Run(world, [*common, "--load"], socket_path=ds_server.socket,
                  out=tmp_path / "resumed").wait()
    for rank in range(world):
        a, b = first[rank], resumed[rank]
        _same_state(b["at_load"], a["saved"][3], f"rank {rank} after load:")
        assert b["losses"] == {k: v for k, v in a["losses"].items() if k > 3}, f"rank {rank} losses"
        _same_state(b["final"], a["final"], f"rank {rank} at the end:")
        # every read came from the cache, the model file's second read included
        assert b["loads"]["storage"] == 0 and b["loads"]["cache"] >= 2, b["loads"]
