"""tce.weights with a real consumer and real faults (docs/weights.md).

Real processes against a real server, nothing mocked:

* an inference process (tests/weights_infer.py) serving a tiny Hugging Face
  model with ``generate()`` swaps in each version a trainer saves with
  ``save_pretrained`` under ``tce.patch_torch`` and publishes, and serves
  what the trainer had, bit for bit;
* a DeepSpeed rank SIGKILLed inside the save of a version
  (tests/weights_ds_job.py): the version is never published, readers keep
  the one before;
* a reader frozen with a version leased: its lease runs out, the memory
  comes back, and a save that needs it succeeds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tce
from tce import weights
from tce.core import _knobs
from tce.errors import DeadlineExceededError, FailedPreconditionError
from helpers import end_processes, until
from weights_infer import request, tiny_model

HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def own_job(request):
    """A job of its own per test: versions count from 1."""
    if "server" in request.fixturenames:
        request.getfixturevalue("server")  # (its own job setting comes first)
    with _knobs.override(job=f"ws-{os.getpid()}-{request.node.name}"[:200]):
        yield


def _env(socket: str, job: str) -> dict[str, str]:
    """What a child process needs to reach the same server and job (and this
    checkout of tce)."""
    return dict(os.environ, TCE_SOCKET=socket, TCE_JOB=job, TCE_ON_UNAVAILABLE="raise",
                PYTHONPATH=os.pathsep.join(p for p in (str(HERE.parent), os.environ.get("PYTHONPATH"))
                                           if p),
                OMP_NUM_THREADS="1")


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    model.train()
    g = torch.Generator().manual_seed(step)
    x = torch.randint(1, 128, (4, 16), generator=g)
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad()


def _serve_while_training(server, tmp_path: Path, arch: str, same_path: bool, versions: int = 4
                          ) -> tuple[dict[int, dict], dict[int, tuple[torch.Tensor, torch.Tensor]],
                                     dict[int, dict[str, torch.Tensor]]]:
    """The trainer (this process) trains a few steps with AdamW, saves each
    with save_pretrained through the cache and publishes it; the inference
    process serves each version before the next step is taken (so it sees
    every one, and still holds the previous lease while the next is saved).
    Returns what the reader served, the trainer's request and its state
    dict, by version."""
    pytest.importorskip("transformers")
    job = _knobs.get("job")
    out = tmp_path / "served"
    out.mkdir()
    log = open(tmp_path / "infer.log", "w")
    reader = subprocess.Popen([sys.executable, str(HERE / "weights_infer.py"), arch, str(out),
                               str(versions)], env=_env(server.socket, job), stdout=log,
                              stderr=subprocess.STDOUT)
    ckpt = tmp_path / "ckpt"
    model = tiny_model(arch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    expected, saved = {}, {}
    tce.patch_torch([ckpt])
    try:
        for step in range(1, versions + 1):
            _train_step(model, opt, step)
            d = ckpt / ("model" if same_path else f"step{step}")
            if step > 1:  # the reader holds version step-1 while step is saved
                assert int(tce.status()["version_leases"]) == 1
            model.save_pretrained(d)
            info = weights.publish(f"step{step}", [d])
            assert (info.version, info.tag) == (step, f"step{step}")
            if same_path and step > 1:  # its file was saved over: no new reader gets it
                with pytest.raises(FailedPreconditionError, match=f"version {step - 1} of job .* is gone: "
                                   f".*model.safetensors was saved again"):
                    weights.open(version=step - 1)
            saved[step] = {n: t.detach().clone() for n, t in model.state_dict().items()}
            expected[step] = request(model)
            done = out / f"v{step}.pt"
            until(lambda: done.exists() or reader.poll() is not None, timeout=120,
                  what=f"the reader to serve version {step}")
            assert done.exists(), f"the reader exited {reader.returncode}:\n" + \
                (tmp_path / "infer.log").read_text()[-4000:]
        assert reader.wait(60) == 0, (tmp_path / "infer.log").read_text()[-4000:]
    finally:
        tce.unpatch_torch()
        if reader.poll() is None:
            reader.kill()
            reader.wait()
        log.close()
    served = {int(p.stem[1:]): torch.load(p, weights_only=False) for p in out.glob("v*.pt")}
    return served, expected, saved


def _check_served(served: dict[int, dict], expected: dict, model: torch.nn.Module, tied: set[str]
                  ) -> None:
    assert sorted(served) == sorted(expected)  # every version, none skipped
    names = set(model.state_dict())
    for v, got in served.items():
        assert got["version"] == v and got["tag"] == f"step{v}"
        assert got["paths"] and all(p.endswith(".safetensors") for p in got["paths"])
        assert names - set(got["loaded"]) == tied, v  # every weight but the tied ones
        logits, tokens = expected[v]
        assert got["logits"].dtype == logits.dtype and got["logits"].shape == logits.shape
        assert torch.equal(got["logits"], logits), f"version {v}: the logits differ"
        assert torch.equal(got["tokens"], tokens), f"version {v}: generate() differs"
        assert got["prev_intact"] is (None if v == 1 else True), v
    # The versions differ: each swap changed what the reader served.
    assert all(not torch.equal(served[v]["logits"], served[v + 1]["logits"]) for v in sorted(served)[:-1])


@pytest.mark.slow
def test_a_gpt2_server_swaps_in_each_version_saved_over_one_directory(server, tmp_path):
    """save_pretrained into one directory every step: each save of
    model.safetensors lands while the reader still leases the previous
    version of that path, so it must go to another buffer."""
    served, expected, _ = _serve_while_training(server, tmp_path, "gpt2", same_path=True)
    assert {p for v in served.values() for p in v["paths"]} == {
        str(tmp_path / "ckpt" / "model" / "model.safetensors")}
    _check_served(served, expected, tiny_model("gpt2"), tied={"lm_head.weight"})


@pytest.mark.slow
def test_a_llama_server_swaps_in_each_version_saved_per_step(server, tmp_path):
    """save_pretrained into a directory per step: every version stays
    readable, each its own file."""
    served, expected, saved = _serve_while_training(server, tmp_path, "llama", same_path=False)
    for v, got in served.items():
        assert got["paths"] == [str(tmp_path / "ckpt" / f"step{v}" / "model.safetensors")]
    _check_served(served, expected, tiny_model("llama"), tied=set())
    for v, sd in saved.items():  # and every version is still there to read
        with weights.open(version=v) as w:
            got = w.state_dict()
            assert got.keys() == sd.keys()
            assert all(torch.equal(got[n], sd[n]) for n in sd), v
            del got


@pytest.mark.slow
@pytest.mark.deepspeed
def test_a_rank_killed_inside_a_save_never_publishes_it_and_readers_keep_the_previous(tmp_path):
    """Two DeepSpeed ranks save global_step1 and global_step2 (versions 1
    and 2); inside the save of global_step3 rank 1 stops, and is SIGKILLed
    there while rank 0, its own files of that tag committed, waits for it in
    the engine's commit. The tag is never recorded: version 2 stays the
    newest, a reader waiting for a newer one is not answered, and version 2
    reads back as rank 0 saved it, bit for bit."""
    pytest.importorskip("deepspeed")
    from tce import client
    from tce.tools._ports import free_port
    from tce.tools._server import LocalServer

    srv = LocalServer(memory_budget="256MiB", state_dir=str(tmp_path / "state"),
                      extra_args=["--memory-backing", "4k"]).start()
    ckpt, out, job = tmp_path / "ckpt", str(tmp_path / "out"), "ds-killed"
    port, procs, logs = free_port(), [], []
    try:
        for rank in range(2):
            logs.append(open(f"{out}-{rank}.log", "w"))
            procs.append(subprocess.Popen(
                [sys.executable, str(HERE / "weights_ds_job.py"), str(ckpt), out, "3", "1"],
                env=dict(_env(srv.socket, job), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                         LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
                stdout=logs[-1], stderr=subprocess.STDOUT))

        def text() -> str:
            return "\n".join(Path(f"{out}-{r}.log").read_text()[-3000:] for r in range(2))

        with _knobs.override(socket=srv.socket, job=job):
            def rank0_committed_step3() -> bool:
                return sorted(os.path.basename(f.path) for f in client.files(job, tag="global_step3")
                              if f.rank == 0) == ["mp_rank_00_model_states.pt",
                                                  "zero_pp_rank_0_mp_rank_00_optim_states.pt"]

            until(lambda: any(p.poll() is not None for p in procs) or
                  (os.path.exists(out + ".hang") and rank0_committed_step3()), timeout=240,
                  what="rank 1 inside its save of global_step3, rank 0's files of it committed")
            assert all(p.poll() is None for p in procs), text()
            procs[1].send_signal(signal.SIGKILL)
            assert procs[1].wait(60) == -signal.SIGKILL
            # Rank 0 waited for rank 1 in the engine's commit: the collective fails.
            assert procs[0].wait(60) != 0, text()
            assert "saved step 3" not in text()

            info = weights.latest()
            assert (info.version, info.tag) == (2, "global_step2"), info
            assert "global_step3" not in [t.tag for t in client.tags(job)]
            with pytest.raises(DeadlineExceededError, match="newer than 2"):
                weights.wait_newer(after=2, timeout=1)
            saved = torch.load(f"{out}-step2.pt", weights_only=True)
            with weights.open() as w:
                assert w.version == 2
                assert w.paths == [str(ckpt / "global_step2" / "mp_rank_00_model_states.pt")]
                got = w.state_dict()
                assert got.keys() == saved.keys()
                assert all(torch.equal(got[n], saved[n]) for n in saved)
                del got
            with weights.open(version=1) as w:  # and the one before is still there too
                got = w.state_dict()
                step1 = torch.load(f"{out}-step1.pt", weights_only=True)
                assert all(torch.equal(got[n], step1[n]) for n in step1)
                assert not all(torch.equal(got[n], saved[n]) for n in saved)
                del got
            tce.close()
    finally:
        end_processes(procs, logs)
        code = srv.stop()
        srv.cleanup()
    assert code == 0, srv.log()


_FROZEN_READER = r"""
import sys
import torch
from tce import weights
from tce.errors import NotCachedError

w = weights.open()  # the server's lease: a few seconds unless renewed
view = w.state_dict()["w"]
copy = view.clone()
print("leased", w.version, flush=True)
for line in sys.stdin:  # the test says when to renew; after SIGCONT the lease is gone
    try:
        w.renew()
    except NotCachedError as e:
        gone = str(e)
        break
    print("renewed", flush=True)
print(gone, flush=True)
print("VIEW", torch.unique(view).tolist(), "COPY", torch.unique(copy).tolist(), flush=True)
"""


def test_a_frozen_reader_s_lease_runs_out_and_its_memory_comes_back(tmp_path):
    """A reader leases version 1 of model.pt, then freezes (SIGSTOP). The
    trainer saves model.pt again (version 2, into a new buffer: version 1's is
    leased); a third save has no memory for it (two buffers' budget, nothing
    on storage to evict) while the lease is renewed. Once the frozen reader's
    lease runs out (3 s), the server drops it and destroys version 1's buffer:
    the bytes come back to the budget and the third save succeeds (into a new
    buffer). The reader, thawed, finds its lease gone, and its view of
    version 1 reads zeros, never version 3's bytes (a buffer whose lease
    expired is destroyed, never reused)."""
    from tce.errors import CacheFullError
    from tce.tools._server import LocalServer

    n = 1 << 18  # 1 MiB of float32: a buffer a bit above it
    srv = LocalServer(memory_budget="2700KiB", state_dir=str(tmp_path / "state"),
                      extra_args=["--memory-backing", "4k", "--version-lease-s", "3",
                                  "--version-lease-max-s", "3"]).start()
    path = tmp_path / "ckpt" / "model.pt"
    reader = None
    try:
        with _knobs.override(socket=srv.socket, job="frozen", on_unavailable="raise"):
            def stat(key: str) -> int:
                return int(tce.status()[key])  # (uint64 fields come as strings)

            tce.save({"w": torch.full((n,), 1.0)}, path, tag="v1")
            assert weights.publish("v1", [path]).version == 1
            one_buffer = stat("used_bytes")
            assert stat("buffers") == 1 and 2 * one_buffer <= 2700 << 10 < 3 * one_buffer
            reader = subprocess.Popen([sys.executable, "-c", _FROZEN_READER],
                                      env=_env(srv.socket, "frozen"), stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

            def renew() -> None:  # the lease runs 3 s from each renewal the reader acknowledges
                reader.stdin.write("renew\n")
                reader.stdin.flush()
                assert reader.stdout.readline().strip() == "renewed"

            assert reader.stdout.readline().split() == ["leased", "1"]
            renew()
            tce.save({"w": torch.full((n,), 2.0)}, path, tag="v2")  # version 1 is leased
            assert weights.publish("v2", [path]).version == 2
            assert (stat("version_leases"), stat("buffers"), stat("used_bytes")) == (1, 2, 2 * one_buffer)
            renew()
            with pytest.raises(CacheFullError, match=r"cache full: need .*\(memory only: never evicted\)"
                               r", 1\.\d+ MiB read by loads \(leased\)"):
                tce.save({"w": torch.full((n,), 3.0)}, path, tag="v3")
            assert stat("version_leases") == 1

            reader.send_signal(signal.SIGSTOP)  # it never renews nor releases again
            until(lambda: stat("version_leases") == 0, what="the frozen reader's lease to run out")
            assert stat("leases") == 0
            # Version 1's buffer is destroyed, not kept for reuse: its bytes leave the budget.
            until(lambda: stat("used_bytes") == one_buffer, what="version 1's buffer to be freed")
            assert (stat("cached_bytes"), stat("free_bytes")) == (one_buffer, 0)

            created, reused = stat("buffers_created"), stat("buffers_reused")
            tce.save({"w": torch.full((n,), 3.0)}, path, tag="v3")  # the memory it needs is back
            assert (stat("buffers_created"), stat("buffers_reused")) == (created + 1, reused)
            assert weights.publish("v3", [path]).version == 3
            with weights.open() as w:
                t = w.state_dict()["w"]
                assert torch.equal(t, torch.full((n,), 3.0))
                del t

            reader.send_signal(signal.SIGCONT)
            out, err = reader.communicate("renew\n", timeout=60)
            assert reader.returncode == 0, out + err
            gone, seen = out.strip().splitlines()[-2:]
            assert "no version lease 1 in this session (released, expired, revoked, or never granted)" in gone
            # Its pages went with the buffer, mapped by the frozen reader or not (that is how
            # the memory came back), and were never reused: it reads zeros, never version 3.
            assert seen == "VIEW [0.0] COPY [1.0]", out
            tce.close()
    finally:
        if reader is not None and reader.poll() is None:
            reader.kill()
            reader.wait()
        code = srv.stop()
        srv.cleanup()
    assert code == 0, srv.log()
