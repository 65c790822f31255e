"""One rank of a DCP job for tests/test_dcp.py: CPU, gloo, DTensor-sharded state.

    python dcp_job.py ACTION DIR

RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT come from the environment, and so
do TCE_SOCKET and TCE_JOB; TCE_TEST_RING=1 joins the job's ring first, and
TCE_TEST_BIG=1 adds a 1 MiB row-sharded tensor. Actions:

* ``save``: dcp.save through tce.dcp.StorageWriter, then wait for storage
  when TCE_TEST_DURABLE=1;
* ``load``: dcp.load through tce.dcp.StorageReader at this world size;
  checks every tensor and prints ``SOURCES <json>``;
* ``async``: dcp.async_save through the writer, the fence, then the model
  changes; the future's result, then a load checks the values as of the call;
* ``fsdp_save`` / ``fsdp_load``: an FSDP2 model and its AdamW state through
  get_state_dict / set_state_dict; the load compares the unsharded state with
  what the save wrote beside the checkpoint (``DIR.ref``, plain torch.save);
* ``die``: a complete dcp.save, then another into the same directory where
  rank 1 is killed (SIGKILL) before it commits its data file; rank 0 prints
  ``RAISED`` when the save fails.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor


def expected() -> dict[str, torch.Tensor]:
    """The full tensors every run saves (independent of the world size)."""
    g = torch.Generator().manual_seed(17)
    out = {
        "w1": torch.arange(24 * 8, dtype=torch.float32).reshape(24, 8),
        "w2": torch.randn(30, 6, generator=g),
        "bias": torch.arange(5, dtype=torch.int64),
        "half": torch.randn(12, 4, generator=g).to(torch.bfloat16),
    }
    if os.environ.get("TCE_TEST_BIG") == "1":  # 1 MiB, sharded by rows
        out["big"] = torch.randn(1024, 256, generator=g)
    return out


def state(mesh, full: dict[str, torch.Tensor]) -> dict:
    """A state dict sharded over the mesh (Shard(0), Shard(1), Replicate)."""
    return {
        "model": {
            "w1": distribute_tensor(full["w1"], mesh, [Shard(0)]),
            "w2": distribute_tensor(full["w2"], mesh, [Shard(1)]),
            "bias": distribute_tensor(full["bias"], mesh, [Replicate()]),
            "half": distribute_tensor(full["half"], mesh, [Shard(0)]),
            **({"big": distribute_tensor(full["big"], mesh, [Shard(0)])} if "big" in full else {}),
        },
        "extra": {"step": 7, "plain": full["w1"][:3].clone()},
    }


def zeros_like_state(mesh) -> dict:
    return state(mesh, {k: torch.zeros_like(v) for k, v in expected().items()}) | {
        "extra": {"step": 0, "plain": torch.zeros(3, 8)}}


def check(sd: dict, full: dict[str, torch.Tensor]) -> None:
    for k, v in full.items():
        got = sd["model"][k].full_tensor()
        assert torch.equal(got, v), f"{k} differs after load: {got} != {v}"
    assert sd["extra"]["step"] == 7, sd["extra"]["step"]
    assert torch.equal(sd["extra"]["plain"], full["w1"][:3]), "extra.plain differs"


def fsdp_model(seed: int):
    """A small FSDP2 model (CPU, gloo) and its AdamW after one step."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    return model, opt


def full_state(model, opt) -> dict:
    """The unsharded model and optimizer state (collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True,
                                                                   cpu_offload=True))
    return {"model": msd, "optim": osd}


def equal(a, b, where: str = "") -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), (where, a.keys(), b.keys())
        for k in a:
            equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, (list, tuple)):
        for i, (x, y) in enumerate(zip(a, b)):
            equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def dying_writer(path: str):
    """A writer whose rank 1 dies (SIGKILL) before it commits its data file."""
    import tce.dcp

    class DyingWriter(tce.dcp.StorageWriter):
        def write_data(self, plan, planner):
            if dist.get_rank() == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            return super().write_data(plan, planner)

    return DyingWriter(path)


def main() -> None:
    import tce  # here, so that tests may import expected() without TCE
    import tce.dcp

    action, path = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    if os.environ.get("TCE_TEST_RING") == "1":
        tce.join_ring()
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    full = expected()
    if action == "save":
        writer = tce.dcp.StorageWriter(path)
        dcp.save(state(mesh, full), storage_writer=writer)
        if os.environ.get("TCE_TEST_DURABLE") == "1":
            writer.wait()
            dist.barrier()
    elif action == "load":
        sd = zeros_like_state(mesh)
        reader = tce.dcp.StorageReader(path)
        dcp.load(sd, storage_reader=reader)
        check(sd, full)
        print("SOURCES " + json.dumps(reader.sources()), flush=True)
    elif action == "async":
        sd = state(mesh, full)
        future = dcp.async_save(sd, storage_writer=tce.dcp.StorageWriter(path))
        tce.wait_staged()  # the fence: the model may change now
        for v in sd["model"].values():
            v.to_local().add_(100)
        sd["extra"]["plain"].add_(100)
        future.result()
        dist.barrier()
        loaded = zeros_like_state(mesh)
        dcp.load(loaded, storage_reader=tce.dcp.StorageReader(path))
        check(loaded, expected())  # (a replicated DTensor shares `full`'s memory)
    elif action == "fsdp_save":
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, opt = fsdp_model(0)
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, storage_writer=tce.dcp.StorageWriter(path))
        ref = full_state(model, opt)
        if rank == 0:  # the expected values, written by plain torch beside the checkpoint
            torch.save(ref, path + ".ref")
    elif action == "fsdp_load":
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model, opt = fsdp_model(1)  # other weights and optimizer state, this world size
        msd, osd = get_state_dict(model, opt)
        sd = {"model": msd, "optim": osd}
        reader = tce.dcp.StorageReader(path)
        dcp.load(sd, storage_reader=reader)
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        got = full_state(model, opt)
        if rank == 0:
            equal(got, torch.load(path + ".ref", weights_only=False))
        print("SOURCES " + json.dumps(reader.sources()), flush=True)
    elif action == "die":
        dcp.save(state(mesh, full), storage_writer=tce.dcp.StorageWriter(path))  # complete
        dist.barrier()
        try:
            dcp.save(state(mesh, full), storage_writer=dying_writer(path))
        except Exception as e:  # noqa: BLE001 (any failure of the collective will do)
            print(f"RAISED {type(e).__name__}", flush=True)
            os._exit(0)  # the process group is broken: no orderly teardown
        print("SAVED", flush=True)
        os._exit(0)
    else:
        raise SystemExit(f"unknown action {action}")
    print(f"OK rank {rank}", flush=True)
    tce.close()
    dist.destroy_process_group()
    # The device mesh and the DTensors keep gloo's process group (and its
    # worker threads) alive into interpreter finalization, where a worker that
    # drops a tensor takes the GIL and aborts the process: end here instead.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
