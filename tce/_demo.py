"""``tce demo``: train, checkpoint through TCE, crash, resume from the cache.

The orchestrator starts a private tce-server, runs a training process that
checkpoints a small GPT-like model (weights + AdamW state) every few steps and
is killed with SIGKILL mid-run, starts a new training process that resumes
from the newest checkpoint in the cache, and checks the resumed run ends with
exactly the weights of an uninterrupted run. It prints save and restore times
next to plain torch.save / torch.load of the same state.
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


def train(args: argparse.Namespace) -> int:
    """One training process (the orchestrator runs this as a child)."""
    import tce

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    cfg = dict(vocab=args.vocab, dim=args.dim, layers=args.layers, heads=4, seq=args.seq)
    model = TinyGPT(**cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    start = 0
    report: dict[str, Any] = {"saves": []}
    latest = os.path.join(args.dir, "latest")
    if args.resume and os.path.exists(latest):
        with open(latest) as f:
            tag = f.read().strip()
        path = os.path.join(args.dir, tag, "state.pt")
        cmp_path = os.path.join(args.dir, "torch_compare.pt")
        if args.compare and os.path.exists(cmp_path):  # the same state via plain torch.load
            t0 = time.perf_counter()
            ckpt = torch.load(cmp_path, weights_only=True)
            model.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
            report["torch_restore_s"] = time.perf_counter() - t0
            del ckpt
        t0 = time.perf_counter()
        ckpt = tce.load(path, weights_only=True) if args.engine == "tce" else torch.load(path)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        report["restore_s"] = time.perf_counter() - t0
        report["resumed_from"] = tag
        report["restore_from_cache"] = args.engine == "tce" and tce.cached(path)
        start = ckpt["step"]
        del ckpt
    for step in range(start, args.steps):
        data = _batch(step, args.vocab, args.batch, args.seq)
        logits = model(data[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, args.vocab), data[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        done = step + 1
        if args.every and done % args.every == 0 and done < args.steps:
            tag = f"step{done}"
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": done}
            path = os.path.join(args.dir, tag, "state.pt")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            created = tce.status()["buffers_created"] if args.engine == "tce" else 0
            t0 = time.perf_counter()
            if args.engine == "tce":
                tce.save(state, path, tag=tag)
            else:
                torch.save(state, path)
            event = {"step": done, "save_s": time.perf_counter() - t0}
            if args.engine == "tce":  # did this save need a new buffer (first touch)?
                event["new_buffer"] = tce.status()["buffers_created"] != created
            if args.compare:  # the same state through plain torch.save, for the table
                cmp_path = os.path.join(args.dir, "torch_compare.pt")
                t0 = time.perf_counter()
                torch.save(state, cmp_path)
                event["torch_save_s"] = time.perf_counter() - t0
            report["saves"].append(event["save_s"])
            with open(args.dir + ".saves.jsonl", "a") as f:  # survives the SIGKILL
                f.write(json.dumps(event) + "\n")
            with open(latest + ".tmp", "w") as f:
                f.write(tag)
            os.replace(latest + ".tmp", latest)
            if args.engine == "tce" and args.keep:  # keep the newest checkpoints only
                old = done - args.keep * args.every
                if old > 0:
                    tce.remove(os.path.join(args.dir, f"step{old}", "state.pt"))
            print(f"  step {done:3d}  loss {loss.item():.4f}  checkpoint {tag} "
                  f"saved in {report['saves'][-1] * 1000:.1f} ms", flush=True)
        if args.crash_at and done == args.crash_at:
            print(f"  step {done:3d}  simulated crash: SIGKILL", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    report["digest"] = _digest(model)
    report["final_loss"] = loss.item()
    report["state_bytes"] = sum(
        t.untyped_storage().nbytes() for t in model.state_dict().values()
    ) * 3  # weights + two AdamW moments
    with open(args.report, "w") as f:
        json.dump(report, f)
    return 0


def _child(args: argparse.Namespace, socket_path: str, ckpt_dir: str, report: str,
           *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable, "-m", "tce._demo", "--socket", socket_path, "--dir", ckpt_dir,
        "--report", report, "--steps", str(args.steps), "--every", str(args.every),
        "--dim", str(args.dim), "--layers", str(args.layers), "--vocab", str(args.vocab),
        "--seq", str(args.seq), "--batch", str(args.batch), "--keep", str(args.keep),
        "--crash-at", "0", *extra,
    ]
    return subprocess.run(cmd, env=dict(os.environ, TCE_SOCKET=socket_path))


def main(args: argparse.Namespace) -> int:
    from tce._server import LocalServer

    print("TCE demo: a small GPT trained on CPU, checkpointed through the TCE cache.\n")
    with tempfile.TemporaryDirectory(prefix="tce-demo-") as work, \
            LocalServer(memory_budget=args.memory_budget) as server:
        print(f"started tce-server on {server.socket}")
        ckpt = os.path.join(work, "ckpt")
        ref = os.path.join(work, "reference")
        os.makedirs(ckpt)
        os.makedirs(ref)
        r_first, r_resume, r_ref = (os.path.join(work, n) for n in ("a.json", "b.json", "c.json"))
        # the checkpoint dir's sibling "<ckpt>.saves.jsonl" collects save timings

        print(f"\n[1] training, checkpoint every {args.every} steps, crash at step {args.crash_at}")
        p = _child(args, server.socket, ckpt, r_first, "--crash-at", str(args.crash_at), "--compare")
        if p.returncode != -signal.SIGKILL:
            print(f"expected the training process to die by SIGKILL, got {p.returncode}")
            return 1
        print("    training process killed; its checkpoints live only in the cache server:")
        on_disk = [f for _, _, fs in os.walk(ckpt) for f in fs if f.endswith(".pt") and
                   not f.startswith("torch_compare")]
        print(f"    {len(on_disk)} checkpoint file(s) on disk (the cache persists them in a later release)")

        print("\n[2] a new training process resumes from the newest checkpoint in the cache")
        p = _child(args, server.socket, ckpt, r_resume, "--resume", "--compare")
        if p.returncode != 0:
            return 1

        print("\n[3] reference: the same training without a crash")
        p = _child(args, server.socket, ref, r_ref, "--engine", "torch", "--every", "0")
        if p.returncode != 0:
            return 1

        with open(ckpt + ".saves.jsonl") as f:
            events = [json.loads(line) for line in f]
        resumed, reference = (json.load(open(r)) for r in (r_resume, r_ref))
    return _print_table(resumed, reference, events)


def _print_table(resumed, reference, events) -> int:
    ok = resumed["digest"] == reference["digest"]
    print(f"\nresumed from {resumed['resumed_from']} "
          f"(read from the cache: {resumed.get('restore_from_cache')})")
    print(f"final weights, resumed run:       {resumed['digest']}")
    print(f"final weights, uninterrupted run: {reference['digest']}  "
          f"{'(identical)' if ok else '(DIFFERENT)'}")
    mb = resumed["state_bytes"] / 2**20
    torch_save = statistics.median(e["torch_save_s"] for e in events)
    rows = [
        ("save stall, new buffer", [e["save_s"] for e in events if e.get("new_buffer")]),
        ("save stall, recycled buffer", [e["save_s"] for e in events if not e.get("new_buffer")]),
    ]
    print(f"\ncheckpoint: model + AdamW state, {mb:.0f} MiB; times in ms "
          f"(torch: torch.save/torch.load of the same state, local disk, page cache)")
    print(f"{'':36s} {'TCE':>8s} {'torch':>8s} {'speed-up':>9s}")
    for name, xs in rows:
        if xs:
            s = statistics.median(xs)
            print(f"{name + f' ({len(xs)}x)':36s} {s * 1e3:8.1f} {torch_save * 1e3:8.1f} "
                  f"{torch_save / s:8.1f}x")
    r, t = resumed["restore_s"], resumed["torch_restore_s"]
    print(f"{'restore: load + load_state_dict':36s} {r * 1e3:8.1f} {t * 1e3:8.1f} {t / r:8.1f}x")
    return 0 if ok else 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--every", type=int, default=5, help="checkpoint every N steps")
    p.add_argument("--crash-at", type=int, default=23, help="SIGKILL the trainer after this step")
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--keep", type=int, default=2,
                   help="checkpoints kept in the cache (older ones are removed, so their "
                        "buffers are recycled)")
    p.add_argument("--memory-budget", default="4GiB")


def _train_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tce._demo")
    add_arguments(p)
    p.add_argument("--socket", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--report", required=True)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--compare", action="store_true")
    p.add_argument("--engine", choices=("tce", "torch"), default="tce")
    args = p.parse_args(argv)
    return train(args)


if __name__ == "__main__":
    sys.exit(_train_main(sys.argv[1:]))
