"""A small DeepSpeed training run on CPU, for the DeepSpeed tests and the demo.

One process per rank (the caller sets RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT). It optionally loads a checkpoint first (no tag:
"latest" as the engine resolves it), trains to --steps, saves at the steps
in --save-at, and dumps its state with plain torch.save to --out-<rank>.pt
(outside any TCE path): the loss of every step, and every local parameter
partition and optimizer-state tensor at each save, after the load and at the
end, so tests can compare runs bit for bit. With --ready it then touches
--ready-<rank> and waits to be SIGKILLed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--stage", type=int, default=0)
p.add_argument("--engine", default="tce",
               help="tce (config entry), tce-late (import tce after deepspeed), attach (tce.attach), "
                    "torch (DeepSpeed's default engine)")
p.add_argument("--ckpt", required=True)
p.add_argument("--load", action="store_true", help="load_checkpoint(--ckpt) before training")
p.add_argument("--load-tag", default="", help="with --load: the tag to load (default: DeepSpeed's choice)")
p.add_argument("--save-at", default="", help="comma-separated steps to save at")
p.add_argument("--steps", type=int, default=5)
p.add_argument("--out", required=True)
p.add_argument("--ready", default="")
p.add_argument("--wait-persisted", action="store_true")
p.add_argument("--async", dest="async_save", action="store_true",
               help='"tce": {"async": true}: saves return once the copies are enqueued')
p.add_argument("--local_rank", type=int, default=0)  # the deepspeed launcher passes it
args = p.parse_args()

if args.engine != "torch":
    import tce  # noqa: F401  (the hook; imported before deepspeed on purpose in one phase)
import deepspeed  # noqa: E402

if args.engine == "tce-late":
    import tce  # noqa: F401,F811  (imported after deepspeed: the hook must still apply)

rank = int(os.environ["RANK"])
torch.manual_seed(1234)
logging.basicConfig(level=logging.WARNING)
logging.getLogger("tce.deepspeed").setLevel(logging.INFO)  # the engine's line per load


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(64, 32)
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
        self.head = torch.nn.Linear(32, 64)
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += 1
        return self.head(self.body(self.emb(x)).mean(1))


config = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": args.stage},
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 1000,
    "wall_clock_breakdown": False,
}
if args.engine in ("tce", "tce-late"):
    config["checkpoint_engine"] = "tce"
    config["tce"] = {"job": os.environ.get("TCE_JOB", "ds-test")}
    if args.async_save:
        config["tce"]["async"] = True

model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
if args.engine == "attach":
    tce.attach(engine, job=os.environ.get("TCE_JOB", "ds-test"))
print(f"rank {rank}: checkpoint engine {type(engine.checkpoint_engine).__name__}", flush=True)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step * 100 + rank)
    x = torch.randint(0, 64, (4, 8), generator=g)
    return x, x[:, 0]


def train_step(step: int) -> float:
    x, y = batch(step)
    loss = torch.nn.functional.cross_entropy(engine(x), y)
    engine.backward(loss)
    engine.step()
    return loss.item()


def tensors(obj, prefix=""):
    """Every tensor (and plain number) in a nested state, by a stable key."""
    out = {}
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj.detach().clone()
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            out.update(tensors(obj[k], f"{prefix}/{k}"))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(tensors(v, f"{prefix}/{i}"))
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out[prefix] = obj
    return out


def snapshot() -> dict:
    params = {n: getattr(q, "ds_tensor", q).detach().clone() for n, q in engine.module.named_parameters()}
    optim = tensors(engine.optimizer.state_dict())
    return {"params": params, "optim": optim, "seen": engine.module.seen.clone(),
            "global_steps": engine.global_steps}


dump: dict = {"losses": {}, "saved": {}}
start = 0
if args.load:
    path, client_state = engine.load_checkpoint(args.ckpt, tag=args.load_tag or None)
    assert path is not None, "load_checkpoint found nothing"
    dump["loaded_path"] = path
    dump["at_load"] = snapshot()
    ce = engine.checkpoint_engine
    dump["loads"] = {"cache": getattr(ce, "loads_from_cache", -1),
                     "storage": getattr(ce, "loads_from_storage", -1)}
    if args.engine != "torch":  # where the bytes the node's server gave came from
        from tce import client as tce_client
        dump["split"] = tce_client.loaded_bytes()
    start = engine.global_steps
save_at = {int(x) for x in args.save_at.split(",") if x}
for step in range(start + 1, args.steps + 1):
    dump["losses"][step] = train_step(step)
    if step in save_at:
        engine.save_checkpoint(args.ckpt)
        dump["saved"][step] = snapshot()
        dump.setdefault("latest_after_save", {})[step] = (
            open(os.path.join(args.ckpt, "latest")).read() if os.path.exists(os.path.join(args.ckpt, "latest"))
            else None)
if args.wait_persisted:
    engine.checkpoint_engine.wait()
dump["final"] = snapshot()
torch.save(dump, f"{args.out}-{rank}.pt")
print(json.dumps({"rank": rank, "steps": args.steps}), flush=True)
if args.ready:
    open(f"{args.ready}-{rank}", "w").close()
    while True:  # the test kills us with SIGKILL
        time.sleep(1)
os._exit(0)  # skip interpreter teardown of gloo/DeepSpeed state
