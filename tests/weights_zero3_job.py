"""One rank of a ZeRO-3 DeepSpeed job (CPU, gloo) for tests/test_weights_zero3.py.

    python weights_zero3_job.py CKPT OUT STEPS MODE

RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TCE_SOCKET and TCE_JOB come from
the environment. Every step is trained and saved with
``engine.save_checkpoint(CKPT)`` ("checkpoint_engine": "tce", which
publishes each tag). After each save every rank gathers the parameters
(``deepspeed.zero.GatheredParameters``) and rank 0 writes the module's
whole state dict to OUT-step<N>.pt (plain torch.save, outside the cache).

MODE ``consolidated``: ``"tce": {"consolidate_weights": true}``; at the end
the job loads the newest checkpoint back (``load_checkpoint(CKPT)``) and
checks every rank's partitions are as saved. MODE ``partitioned``: no such
setting; at the end ``engine.save_16bit_model(OUT-16bit)``
(``stage3_gather_16bit_weights_on_model_save``) saves through the engine.
"""

from __future__ import annotations

import os
import sys

import tce  # noqa: F401  (the DeepSpeed hook)
import deepspeed
import torch

ckpt, out, steps, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
assert mode in ("consolidated", "partitioned"), mode
rank = int(os.environ["RANK"])
torch.manual_seed(1234)


def model() -> torch.nn.Module:
    """Parameters of odd sizes (33, 231 and 7 elements: two ranks' partitions
    are padded), and a buffer."""
    m = torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.GELU(), torch.nn.Linear(33, 7))
    m.register_buffer("scale", torch.linspace(0.5, 1.5, 7))
    return m


config = {
    "train_micro_batch_size_per_gpu": 4,
    "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True},
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 1000,
    "checkpoint_engine": "tce",
    "tce": {"job": os.environ["TCE_JOB"], "consolidate_weights": mode == "consolidated"},
}
net = model()
opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
engine, _, _, _ = deepspeed.initialize(model=net, optimizer=opt, config=config)


def whole_state() -> dict[str, torch.Tensor] | None:
    """The module's parameters gathered whole (every rank takes part), and
    its buffers, as rank 0 sees them."""
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None):
        sd = {n: t.detach().clone() for n, t in engine.module.state_dict().items()}
    return sd if rank == 0 else None


for step in range(1, steps + 1):
    g = torch.Generator().manual_seed(step * 100 + rank)
    x = torch.randn(4, 16, generator=g)
    loss = (engine(x) * engine.module.scale).square().mean()
    engine.backward(loss)
    engine.step()
    engine.save_checkpoint(ckpt)
    sd = whole_state()
    if rank == 0:
        torch.save(sd, f"{out}-step{step}.pt")
    print(f"rank {rank}: saved step {step}", flush=True)

if mode == "consolidated":
    mine = {n: p.ds_tensor.detach().clone() for n, p in engine.module.named_parameters()}
    path, _ = engine.load_checkpoint(ckpt)
    print(f"rank {rank}: loaded {path}", flush=True)
    same = all(torch.equal(p.ds_tensor, mine[n]) for n, p in engine.module.named_parameters())
    print(f"rank {rank}: partitions as saved: {same}", flush=True)
else:
    assert engine.save_16bit_model(f"{out}-16bit") is True
    print(f"rank {rank}: saved the 16-bit model", flush=True)
os._exit(0)  # skip interpreter teardown of gloo/DeepSpeed state
