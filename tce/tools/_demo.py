"""``tce demo``: DeepSpeed trains with ``"checkpoint_engine": "tce"``, crashes, resumes.

The orchestrator starts a private tce-server that persists to a temporary
directory, then runs three DeepSpeed training processes (CPU, gloo, ZeRO):

1. with ``"checkpoint_engine": "tce"``, a checkpoint every few steps, killed
   with SIGKILL mid-run;
2. a new process that calls ``engine.load_checkpoint(dir)``: the newest
   complete checkpoint, read from the cache;
3. the same training without a crash, checkpointing with DeepSpeed's default
   engine (``torch.save``), and a final ``load_checkpoint`` of its own
   checkpoint.

It checks that the resumed run ends with bitwise the weights of the
uninterrupted one and prints the save stall and restore time of both engines.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch
from torch import nn

import tce  # also what makes "checkpoint_engine": "tce" work (tce.install_deepspeed)
from tce import client
from tce.tools._server import LocalServer
from tce.tools._ports import free_port


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        mask = torch.triu(torch.full((seq, seq), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos[: x.shape[1]]
        h = self.blocks(h, mask=self.mask[: x.shape[1], : x.shape[1]], is_causal=True)
        return self.head(self.norm(h))


def _batch(step: int, vocab: int, batch: int, seq: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, vocab, (batch, seq + 1), generator=g)


def _digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def _event(args: argparse.Namespace, **fields: Any) -> None:
    fields.update(rank=int(os.environ.get("RANK", "0")), label=args.label)
    with open(args.report, "a") as f:  # appended line by line: survives the SIGKILL
        f.write(json.dumps(fields) + "\n")


def train(args: argparse.Namespace) -> int:
    """One DeepSpeed training process (the orchestrator runs this as a child)."""
    import deepspeed  # only the training processes need it (seconds to import)

    _skip_shm_allreduce()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = TinyGPT(vocab=args.vocab, dim=args.dim, layers=args.layers, heads=4, seq=args.seq)
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": args.batch,
        "zero_optimization": {"stage": args.zero_stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**6,
    }
    if args.engine == "tce":
        config["checkpoint_engine"] = "tce"
        config["tce"] = {"job": "tce-demo"}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    start = 0
    if args.resume:
        t0 = time.perf_counter()
        path, _ = engine.load_checkpoint(args.dir)
        seconds = time.perf_counter() - t0
        ce = engine.checkpoint_engine
        _event(args, kind="restore", engine=args.engine, seconds=seconds, path=path,
               from_cache=getattr(ce, "loads_from_cache", 0),
               from_storage=getattr(ce, "loads_from_storage", 0))
        start = engine.global_steps
        print(f"  resumed at step {start} from {path} in {seconds * 1e3:.0f} ms", flush=True)
    loss = torch.zeros(())
    for step in range(start, args.steps):
        data = _batch(step, args.vocab, args.batch, args.seq)
        logits = engine(data[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, args.vocab), data[:, 1:].reshape(-1))
        engine.backward(loss)
        engine.step()
        done = step + 1
        if done == start + 1:  # restart to first training step (tce demo --nodes)
            _event(args, kind="first_step", engine=args.engine, t=time.time())
        if args.every and done % args.every == 0 and done < args.steps:
            before = _buffers() if args.engine == "tce" else (0, 0)
            t0 = time.perf_counter()
            engine.save_checkpoint(args.dir)
            seconds = time.perf_counter() - t0
            after = _buffers() if args.engine == "tce" else (0, 0)
            # new: the server created a buffer; mapped: this process mapped
            # (and faulted in) a recycled buffer for the first time.
            kind = "new" if after[0] != before[0] else "mapped" if after[1] != before[1] else "steady"
            _event(args, kind="save", engine=args.engine, step=done, seconds=seconds, buffer=kind)
            print(f"  step {done:3d}  loss {loss.item():.4f}  save_checkpoint "
                  f"({args.engine}) {seconds * 1e3:6.1f} ms", flush=True)
        if args.crash_at and done == args.crash_at:
            print(f"  step {done:3d}  simulated crash: SIGKILL", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    state_bytes = sum(p.numel() * p.element_size() for p in engine.module.parameters()) * 3
    _event(args, kind="end", engine=args.engine, digest=_digest(engine.module),
           loss=loss.item(), state_bytes=state_bytes)
    if args.restore_own:  # time DeepSpeed's own restore of the checkpoint it just wrote
        t0 = time.perf_counter()
        engine.load_checkpoint(args.dir)
        _event(args, kind="restore", engine=args.engine, seconds=time.perf_counter() - t0)
    torch.distributed.destroy_process_group()
    return 0


def _skip_shm_allreduce() -> None:
    """Keeps DeepSpeed from compiling its shared-memory allreduce (about 45 s
    on 2 cores, the first time on a machine) when it sets up communication.

    That op only speeds up collectives among ranks of one machine; every
    training process of the demo is one rank alone on its node, so gloo does
    the little communicating there is. DeepSpeed asks ``deepspeed.ops``'s
    table of compatible ops before it builds the op and skips it when that
    says no.
    """
    import deepspeed.ops

    try:
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    except (AttributeError, TypeError):  # a DeepSpeed without the table builds the op
        pass


def _buffers() -> tuple[int, int]:
    """(buffers the server created, buffers this process has mapped)."""
    return int(tce.status()["buffers_created"]), client.mapped_buffers()


def _child(args: argparse.Namespace, socket_path: str, ckpt_dir: str, report: str,
           *extra: str, expect: int = 0) -> bool:
    """Runs one training process; True if it exited with ``expect``. Otherwise
    prints how it ended and the end of its output, unfiltered."""
    cmd = [
        # faulthandler: a crash in native code still prints the Python stacks
        sys.executable, "-X", "faulthandler", "-m", "tce.tools._demo",
        "--dir", ckpt_dir, "--report", report,
        "--steps", str(args.steps), "--every", str(args.every), "--dim", str(args.dim),
        "--layers", str(args.layers), "--vocab", str(args.vocab), "--seq", str(args.seq),
        "--batch", str(args.batch), "--zero-stage", str(args.zero_stage), "--crash-at", "0",
        *extra,
    ]
    env = dict(os.environ, TCE_SOCKET=socket_path, TCE_ON_UNAVAILABLE="raise", RANK="0",
               WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()))
    p = subprocess.run(cmd, env=env, stdout=None if args.verbose else subprocess.PIPE,
                       stderr=None if args.verbose else subprocess.STDOUT, text=True)
    lines = (p.stdout or "").splitlines()
    if not args.verbose:  # DeepSpeed is chatty: show only the demo's own lines
        for line in lines:
            if line.startswith("  ") or "[TCE]" in line or "Error" in line or "error" in line:
                print(line)
    if p.returncode == expect:
        return True
    code = p.returncode
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    tail = ":" if lines else "" if args.verbose else ", printing nothing"
    print(f"\nthe training process {how}{tail}")
    for line in lines[-40:]:
        print(f"  | {line}")
    return False


def main(args: argparse.Namespace) -> int:
    if getattr(args, "engine", None) and not getattr(args, "weights", False):
        raise SystemExit("tce demo: --engine goes with --weights")
    if getattr(args, "weights", False):
        if getattr(args, "engine", None) == "vllm":
            from tce.tools import _demo_vllm  # weights to a vLLM server

            return _demo_vllm.main(args)
        from tce.tools import _demo_weights  # weights to inference
        return _demo_weights.main(args)
    if args.nodes > 1:
        from tce.tools import _demo_nodes  # the node-loss story

        return _demo_nodes.main(args)
    print("TCE demo: DeepSpeed trains a small GPT on CPU with \"checkpoint_engine\": \"tce\".\n")
    t0 = time.monotonic()

    def phase(text: str) -> None:
        print(f"\n[{time.monotonic() - t0:5.1f} s] {text}", flush=True)

    with tempfile.TemporaryDirectory(prefix="tce-demo-") as work:
        storage = os.path.join(work, "storage")
        os.makedirs(storage)
        with LocalServer(memory_budget=args.memory_budget, storage_roots=[storage],
                         state_dir=os.path.join(work, "state"),
                         extra_args=["--keep-last", str(args.keep), "--prealloc", args.prealloc,
                                     "--memory-backing", args.memory_backing]) as server:
            print(f"started tce-server on {server.socket}, persisting to {storage}")
            ckpt, ref = os.path.join(storage, "ckpt"), os.path.join(storage, "reference")
            report = os.path.join(work, "report.jsonl")

            phase(f"1. DeepSpeed + TCE, checkpoint every {args.every} steps, crash at step "
                  f"{args.crash_at}")
            if not _child(args, server.socket, ckpt, report, "--crash-at", str(args.crash_at),
                          expect=-signal.SIGKILL):
                return 1
            print("    training process killed")

            phase("2. a new process: engine.load_checkpoint(dir) reads the newest complete "
                  "checkpoint from the cache")
            if not _child(args, server.socket, ckpt, report, "--resume"):
                return 1

            phase("3. reference: the same run without a crash, DeepSpeed's default engine")
            if not _child(args, server.socket, ref, report, "--engine", "torch", "--restore-own"):
                return 1
            with open(report) as f:
                events = [json.loads(line) for line in f]
            phase("done")
    return _print_table(events)


def _print_table(events: list[dict]) -> int:
    ends = [e for e in events if e["kind"] == "end"]
    resumed = next(e for e in ends if e["engine"] == "tce")
    reference = next(e for e in ends if e["engine"] == "torch")
    restore = {e["engine"]: e for e in events if e["kind"] == "restore"}
    ok = resumed["digest"] == reference["digest"]
    tce_restore = restore["tce"]
    print(f"\nresumed from {tce_restore['path']}: {tce_restore['from_cache']} file(s) read from "
          f"the cache, {tce_restore['from_storage']} from storage")
    print(f"final weights, resumed run:       {resumed['digest']}")
    print(f"final weights, uninterrupted run: {reference['digest']}  "
          f"{'(identical)' if ok else '(DIFFERENT)'}")
    saves = [e for e in events if e["kind"] == "save"]
    torch_save = statistics.median(e["seconds"] for e in saves if e["engine"] == "torch")
    rows = [(f"save_checkpoint, {label}",
             [e["seconds"] for e in saves if e["engine"] == "tce" and e["buffer"] == kind])
            for kind, label in (("steady", "steady state"), ("new", "new buffers"),
                                ("mapped", "first in a process"))]
    mb = resumed["state_bytes"] / 2**20
    print(f"\ncheckpoint: model + AdamW state, {mb:.0f} MiB; median times in ms "
          f"(DeepSpeed default: torch.save/torch.load on local disk, page cache)")
    print(f"{'':42s} {'TCE':>8s} {'default':>8s} {'speed-up':>9s}")
    for name, xs in rows:
        if xs:
            s = statistics.median(xs)
            print(f"{name + f' ({len(xs)}x)':42s} {s * 1e3:8.1f} {torch_save * 1e3:8.1f} "
                  f"{torch_save / s:8.1f}x")
    r, t = tce_restore["seconds"], restore["torch"]["seconds"]
    print(f"{'load_checkpoint':42s} {r * 1e3:8.1f} {t * 1e3:8.1f} {t / r:8.1f}x")
    return 0 if ok and tce_restore["from_storage"] == 0 else 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--every", type=int, default=3, help="checkpoint every N steps")
    p.add_argument("--crash-at", type=int, default=23, help="SIGKILL the trainer after this step")
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--zero-stage", type=int, default=2, choices=(0, 1, 2, 3))
    p.add_argument("--keep", type=int, default=2,
                   help="the server's keep_last: older checkpoints leave the cache once "
                        "persisted, so their buffers are recycled")
    p.add_argument("--memory-budget", default="4GiB")
    p.add_argument("--prealloc", default="auto",
                   help="the server's prealloc: memory pre-faulted at start so the first "
                        "checkpoint costs what the steady state costs (auto: half the budget; 0: none)")
    p.add_argument("--memory-backing", default="auto",
                   help="the server's memory_backing: auto (huge pages where reserved), hugetlb, "
                        "thp or 4k")
    p.add_argument("--verbose", action="store_true", help="show DeepSpeed's own output")
    p.add_argument("--weights", action="store_true",
                   help="instead: a trainer on one node publishes a new version every --every steps; "
                        "inference processes on two other nodes serve each one (network namespaces, "
                        "root); a timeline per version and the storage path for comparison")
    p.add_argument("--versions", type=int, default=5, help="with --weights: versions to publish")
    p.add_argument("--engine", choices=("vllm",), default=None,
                   help="with --weights: the inference side is a vLLM server on another node, kept on "
                        "each version by tce vllm follow (the trainer fine-tunes a small Qwen2 model; "
                        "--dim and --layers size it); installs the vLLM environment on first use")
    p.add_argument("--nodes", type=int, default=1,
                   help="N >= 3: N nodes (network namespaces, root), one rank and one tce-server "
                        "each in a ring; node 1 is lost and the job resumes from the ring")


def _train_main(argv: list[str]) -> int:
    # resolve: this process's --engine (the checkpoint engine) replaces the
    # demo's (the inference engine of --weights)
    p = argparse.ArgumentParser(prog="python -m tce.tools._demo", conflict_handler="resolve")
    add_arguments(p)
    p.add_argument("--dir", required=True)
    p.add_argument("--report", required=True)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--restore-own", action="store_true")
    p.add_argument("--engine", choices=("tce", "torch"), default="tce")
    p.add_argument("--label", default="", help="names this process's events in the report")
    args = p.parse_args(argv)
    return train(args)


if __name__ == "__main__":
    code = _train_main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # No interpreter teardown: with torch's C++ threads (gloo, autograd) still
    # holding tensors it can crash now and then (pytorch/pytorch#190489),
    # which would fail a run that did everything right.
    os._exit(code)
