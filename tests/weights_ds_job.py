"""One rank of a DeepSpeed job (CPU, gloo, ZeRO 1) for
tests/test_weights_serving.py: a rank that is killed inside a save.

    python weights_ds_job.py CKPT OUT STEPS HANG_RANK

RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TCE_SOCKET and TCE_JOB come from
the environment. Every step is trained and saved with
``engine.save_checkpoint(CKPT)`` ("checkpoint_engine": "tce": the engine
records each tag on rank 0 once every rank committed, which publishes it).
Rank 0 writes the module's state as saved at each step to OUT-step<N>.pt
(plain torch.save, outside the cache). At the last step, rank HANG_RANK
stops inside its save: a value in the state it saves blocks when pickled,
after touching OUT.hang, until the test SIGKILLs the process.
"""

from __future__ import annotations

import os
import sys
import threading

import tce  # noqa: F401  (the DeepSpeed hook)
import deepspeed
import torch

ckpt, out, steps, hang_rank = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rank = int(os.environ["RANK"])
torch.manual_seed(1234)


class Hang:
    """Stops the save that pickles it: the process is inside tce.save (its
    checkpoint engine's save) until it is killed."""

    def __reduce__(self):
        open(out + ".hang", "w").close()
        threading.Event().wait()  # forever: the test SIGKILLs us here


model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
config = {
    "train_micro_batch_size_per_gpu": 4,
    "zero_optimization": {"stage": 1},
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 1000,
    "checkpoint_engine": "tce",
    "tce": {"job": os.environ["TCE_JOB"]},
}
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)

for step in range(1, steps + 1):
    g = torch.Generator().manual_seed(step * 100 + rank)
    x = torch.randn(4, 16, generator=g)
    loss = engine(x).square().mean()
    engine.backward(loss)
    engine.step()
    if step == steps and rank == hang_rank:
        save = engine.checkpoint_engine.save
        engine.checkpoint_engine.save = lambda sd, path: save({**sd, "hang": Hang()}, path)
    engine.save_checkpoint(ckpt)
    if rank == 0:
        torch.save({n: t.detach().clone() for n, t in engine.module.state_dict().items()},
                   f"{out}-step{step}.pt")
    print(f"rank {rank}: saved step {step}", flush=True)
os._exit(0)  # skip interpreter teardown of gloo/DeepSpeed state
