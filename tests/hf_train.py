"""A Hugging Face Trainer run with DeepSpeed (ZeRO-2) and TCE, on CPU, for
tests/test_hf_trainer.py.

One process (the caller sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT, TCE_SOCKET, TCE_JOB). A 2-layer GPT-2 built from a config (no
download) trains on random tokens to --steps, saving every --save-steps with
save_total_limit=2; with --resume it resumes from the newest checkpoint in
--out-dir. It writes the loss of every step it ran, and where its DeepSpeed
states were loaded from, as JSON to --result.
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import tce  # noqa: F401,E402  (the DeepSpeed hook: "checkpoint_engine": "tce")
import torch  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

p = argparse.ArgumentParser()
p.add_argument("--out-dir", required=True)
p.add_argument("--steps", type=int, default=8)
p.add_argument("--save-steps", type=int, default=2)
p.add_argument("--resume", action="store_true")
p.add_argument("--result", required=True)
args = p.parse_args()

SEQ, VOCAB = 16, 128


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(7)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Losses(TrainerCallback):
    def __init__(self) -> None:
        self.by_step: dict[int, float] = {}

    def on_log(self, a, state, control, logs=None, **kw):
        if logs and "loss" in logs:
            self.by_step[state.global_step] = logs["loss"]


ds_config = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "zero_optimization": {"stage": 2},
    "zero_allow_untested_optimizer": True,
    "checkpoint_engine": "tce",
    "tce": {"job": os.environ["TCE_JOB"]},
    "steps_per_print": 1000,
}
targs = TrainingArguments(
    output_dir=args.out_dir, max_steps=args.steps, per_device_train_batch_size=4,
    learning_rate=1e-3, lr_scheduler_type="constant", logging_steps=1, save_steps=args.save_steps, save_total_limit=2,
    report_to=[], seed=0, data_seed=0, dataloader_num_workers=0, deepspeed=ds_config,
    disable_tqdm=True,
)
# On the CPU, accelerate counts each DeepSpeed rank as a world of its own
# (process_index 0 everywhere), so every rank would rotate the checkpoints
# and race the others' deletes. Only rank 0 rotates, as on GPUs.
if int(os.environ.get("RANK", "0")) != 0:
    targs.save_total_limit = None
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=VOCAB,
                                   n_positions=SEQ))
losses = Losses()
trainer = Trainer(model=model, args=targs, train_dataset=RandomTokens(256), callbacks=[losses])
trainer.train(resume_from_checkpoint=True if args.resume else None)
engine = trainer.model_wrapped.checkpoint_engine if hasattr(trainer.model_wrapped, "checkpoint_engine") \
    else None
result = {
    "losses": {str(k): v for k, v in sorted(losses.by_step.items())},
    "engine": type(engine).__name__ if engine is not None else None,
    "world": torch.distributed.get_world_size(),
    "loads_from_cache": getattr(engine, "loads_from_cache", None),
    "loads_from_storage": getattr(engine, "loads_from_storage", None),
}
rank = int(os.environ.get("RANK", "0"))
with open(f"{args.result}.{rank}", "w") as f:
    json.dump(result, f)
os._exit(0)  # torch's gloo/autograd threads may drop tensors while Python finalizes
