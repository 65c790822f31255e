"""tce.weights and DeepSpeed ZeRO-3 (docs/weights.md, docs/deepspeed.md).

Real DeepSpeed, two ranks on CPU (gloo), ZeRO stage 3, "checkpoint_engine":
"tce" (tests/weights_zero3_job.py), against a real server. A ZeRO-3
checkpoint's model-states files hold a placeholder for each parameter:

* with ``"tce": {"consolidate_weights": true}`` each tag carries the
  gathered weights (``<tag>/pytorch_model.bin``), and every published
  version reads back as the parameters the trainer gathered itself, bit for
  bit; the checkpoint still loads;
* without it, reading a version raises FailedPreconditionError saying what
  to do, never placeholders as weights; what ``save_16bit_model`` saves goes
  through the cache and, published, reads back whole.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tce
from tce import client, weights
from tce.core import _knobs
from tce.errors import FailedPreconditionError
from tce.weights import weight_files

from helpers import end_processes

HERE = Path(__file__).parent
WORLD = 2


def _train(srv, tmp_path: Path, job: str, mode: str, steps: int) -> tuple[Path, str, str]:
    """Runs the job's two ranks to the end; returns the checkpoint directory,
    the OUT prefix and the ranks' logs."""
    from tce.tools._ports import free_port

    ckpt, out, port = tmp_path / "ckpt", str(tmp_path / "out"), free_port()
    env = dict(os.environ, TCE_SOCKET=srv.socket, TCE_JOB=job, TCE_ON_UNAVAILABLE="raise",
               OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD),
               PYTHONPATH=os.pathsep.join(p for p in (str(HERE.parent), os.environ.get("PYTHONPATH"))
                                          if p))
    procs, logs = [], []
    try:
        for rank in range(WORLD):
            logs.append(open(f"{out}-{rank}.log", "w"))
            procs.append(subprocess.Popen(
                [sys.executable, str(HERE / "weights_zero3_job.py"), str(ckpt), out, str(steps), mode],
                env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)), stdout=logs[-1],
                stderr=subprocess.STDOUT))
        codes = [p.wait(300) for p in procs]
    finally:
        end_processes(procs, logs)
    text = "\n".join(Path(f"{out}-{r}.log").read_text()[-4000:] for r in range(WORLD))
    assert codes == [0] * WORLD, text
    return ckpt, out, text


@pytest.fixture
def srv(tmp_path):
    from tce.tools._server import LocalServer

    s = LocalServer(memory_budget="256MiB", state_dir=str(tmp_path / "state"),
                    extra_args=["--memory-backing", "4k"]).start()
    yield s
    tce.close()
    code = s.stop()
    s.cleanup()
    assert code == 0, s.log()


def _fresh() -> torch.nn.Module:
    m = torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.GELU(), torch.nn.Linear(33, 7))
    m.register_buffer("scale", torch.zeros(7))
    return m


def _equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], what: str) -> None:
    assert got.keys() == want.keys(), what
    for n, t in want.items():
        assert got[n].dtype == t.dtype and got[n].shape == t.shape, f"{what}: {n}"
        assert torch.equal(got[n], t), f"{what}: {n} differs"


def test_weight_files_prefer_consolidated_weights_to_zero3_placeholders():
    d = "/c/global_step5"
    zero3 = [f"{d}/zero_pp_rank_{r}_mp_rank_00_{kind}_states.pt" for r in range(2)
             for kind in ("model", "optim")]
    assert weight_files(zero3 + [f"{d}/pytorch_model.bin"]) == [f"{d}/pytorch_model.bin"]
    assert weight_files(zero3) == [zero3[0], zero3[2]]  # nothing else: read them, and refuse
    # Stages 0-2: the model-states file holds the weights, whatever else the version has.
    stage2 = [f"{d}/mp_rank_00_model_states.pt", f"{d}/zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    assert weight_files(stage2 + [f"{d}/pytorch_model.bin"]) == [stage2[0]]


@pytest.mark.deepspeed
@pytest.mark.slow
def test_consolidated_weights_join_each_tag_and_read_back_bit_for_bit(srv, tmp_path):
    job, steps = "zero3-consolidated", 2
    ckpt, out, log = _train(srv, tmp_path, job, "consolidated", steps)
    # The checkpoint still loads (the extra file is part of the tag, under its directory).
    assert f"loaded {ckpt}/global_step{steps}" in log, log
    assert log.count("partitions as saved: True") == WORLD, log
    with _knobs.override(socket=srv.socket, job=job):
        info = weights.latest()
        assert (info.version, info.tag) == (steps, f"global_step{steps}")
        for v in range(1, steps + 1):
            tag_dir = ckpt / f"global_step{v}"
            with weights.open(version=v) as w:
                assert sorted((r, os.path.basename(p)) for r, p, _ in w.info.files) == [
                    (0, "pytorch_model.bin"),
                    (0, "zero_pp_rank_0_mp_rank_00_model_states.pt"),
                    (0, "zero_pp_rank_0_mp_rank_00_optim_states.pt"),
                    (1, "zero_pp_rank_1_mp_rank_00_model_states.pt"),
                    (1, "zero_pp_rank_1_mp_rank_00_optim_states.pt")]
                assert w.paths == [str(tag_dir / "pytorch_model.bin")]
                want = torch.load(f"{out}-step{v}.pt", weights_only=True)
                _equal(w.state_dict(), want, f"version {v}")
                model = _fresh()
                assert sorted(w.load_into(model)) == sorted(want)
                _equal(model.state_dict(), want, f"version {v} loaded into a module")
        # The versions differ: each holds its own step's weights.
        one, two = (torch.load(f"{out}-step{v}.pt", weights_only=True) for v in (1, 2))
        assert not torch.equal(one["0.weight"], two["0.weight"])


@pytest.mark.deepspeed
@pytest.mark.slow
def test_partitioned_placeholders_are_refused_and_save_16bit_model_publishes(srv, tmp_path):
    job = "zero3-partitioned"
    ckpt, out, log = _train(srv, tmp_path, job, "partitioned", 1)
    assert log.count("saved the 16-bit model") == WORLD, log
    tag_dir = ckpt / "global_step1"
    model_states = [str(tag_dir / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt") for r in range(WORLD)]
    want = torch.load(f"{out}-step1.pt", weights_only=True)
    refused = (f"FAILED_PRECONDITION: {model_states[0]}: a DeepSpeed ZeRO-3 checkpoint's model states hold no weights: "
               "'0.weight' is a placeholder of shape [0] for a parameter of shape [33, 16] (the "
               "weights are partitioned over the ranks' optimizer states). Save them whole in each "
               "checkpoint with \"tce\": {\"consolidate_weights\": true} in the DeepSpeed config, "
               "or publish what engine.save_16bit_model() saves (see docs/deepspeed.md)")
    with _knobs.override(socket=srv.socket, job=job):
        with weights.open() as w:
            assert (w.version, w.info.tag) == (1, "global_step1")
            assert w.paths == model_states  # all it has: read them, and say why not
            with pytest.raises(FailedPreconditionError) as e:
                next(w.tensors())
            assert str(e.value) == refused
            with pytest.raises(FailedPreconditionError) as e:
                w.state_dict()
            assert str(e.value) == refused
            model = _fresh()
            with pytest.raises(FailedPreconditionError) as e:
                w.load_into(model)
            assert str(e.value) == refused
            assert torch.equal(model.state_dict()["scale"], torch.zeros(7))  # nothing loaded

        # save_16bit_model went through the engine into the cache (rank 0, the step's tag),
        # outside the tag's directory: no part of the tag, never published by itself.
        whole = str(tmp_path / "out-16bit" / "pytorch_model.bin")
        (cached,) = [f for f in client.files(job) if f.path == whole]
        assert (cached.rank, cached.tag) == (0, "global_step1")
        assert [os.path.basename(p) for _, p, _ in weights.latest().files] == [
            "zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
            "zero_pp_rank_1_mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
        # The trainer publishes it under a tag of its own (not DeepSpeed's: that would replace it).
        info = weights.publish("global_step1-16bit", [whole])
        assert (info.version, [p for _, p, _ in info.files]) == (2, [whole])
        with weights.open() as w:
            assert w.paths == [whole]
            _equal(w.state_dict(), want, "the 16-bit model")
            model = _fresh()
            w.load_into(model)
            _equal(model.state_dict(), want, "the 16-bit model loaded into a module")
        assert [t.tag for t in client.tags(job)] == ["global_step1", "global_step1-16bit"]
