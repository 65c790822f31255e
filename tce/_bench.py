"""``tce bench``: TCE's save/load against torch.save/torch.load, in one run.

Every figure comes from the same process, the same state dict and the same
machine minutes, so the ratios between them hold even on a noisy machine.
Times are medians over ``--repeats`` runs (after warm-up where noted).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import torch

_UNITS = {"b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gib": 1 << 30, "kb": 10**3, "mb": 10**6, "gb": 10**9}


def parse_size(text: str) -> int:
    """'1GiB', '512MiB', '1e9', '4096' -> bytes."""
    s = text.strip().lower().replace(" ", "")
    for unit in sorted(_UNITS, key=len, reverse=True):
        if s.endswith(unit) and s[: -len(unit)]:
            return int(float(s[: -len(unit)]) * _UNITS[unit])
    return int(float(s))


def gpt_state_dict(nbytes: int, *, dtype: torch.dtype = torch.float32,
                   device: str = "cpu") -> dict[str, torch.Tensor]:
    """A GPT-2-shaped state dict of about ``nbytes`` (whole layers, random values).

    The width is the largest of 64..2048 whose token embedding (50304 x width)
    takes at most a quarter of the bytes, so small sizes still have layers.
    """
    el = torch.tensor([], dtype=dtype).element_size()
    vocab = 50304
    hidden = 64
    for h in (2048, 1536, 1024, 768, 512, 256, 128, 64):
        if vocab * h * el <= nbytes // 4:
            hidden = h
            break
    vocab = min(vocab, max(256, nbytes // 4 // (hidden * el)))
    layer = [
        ("ln_1.weight", (hidden,)), ("ln_1.bias", (hidden,)),
        ("attn.c_attn.weight", (3 * hidden, hidden)), ("attn.c_attn.bias", (3 * hidden,)),
        ("attn.c_proj.weight", (hidden, hidden)), ("attn.c_proj.bias", (hidden,)),
        ("ln_2.weight", (hidden,)), ("ln_2.bias", (hidden,)),
        ("mlp.c_fc.weight", (4 * hidden, hidden)), ("mlp.c_fc.bias", (4 * hidden,)),
        ("mlp.c_proj.weight", (hidden, 4 * hidden)), ("mlp.c_proj.bias", (hidden,)),
    ]
    per_layer = sum(math.prod(s) for _, s in layer) * el
    embed = (vocab * hidden + 1024 * hidden + 2 * hidden) * el
    n_layers = max(1, round((nbytes - embed) / per_layer))
    g = torch.Generator(device="cpu").manual_seed(0)

    def t(*shape: int) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype).uniform_(-0.1, 0.1, generator=g).to(device)

    sd = {"wte.weight": t(vocab, hidden), "wpe.weight": t(1024, hidden)}
    for i in range(n_layers):
        for name, shape in layer:
            sd[f"h.{i}.{name}"] = t(*shape)
    sd["ln_f.weight"], sd["ln_f.bias"] = t(hidden), t(hidden)
    return sd


def _nbytes(sd: dict[str, torch.Tensor]) -> int:
    return sum(v.untyped_storage().nbytes() for v in sd.values())


def _time(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _median(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    return statistics.median(_time(fn) for _ in range(repeats))


def _restore_into(dst: dict[str, torch.Tensor], src: dict[str, torch.Tensor]) -> None:
    for k, v in dst.items():
        v.copy_(src[k])


def _dd(path: str, nbytes: int) -> float:
    """Seconds for `dd conv=fsync` to write nbytes (16 MiB blocks) to path."""
    import subprocess

    count = max(1, nbytes // (16 << 20))
    t0 = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=16M", f"count={count}", "conv=fsync"],
                   check=True, capture_output=True)
    seconds = time.perf_counter() - t0
    os.unlink(path)
    return seconds * nbytes / (count * (16 << 20))


def _persistence(sd: dict[str, torch.Tensor], nbytes: int, *, repeats: int,
                 directory: str) -> dict[str, Any]:
    """Time-to-persisted through a server with `directory` as storage root,
    against dd conv=fsync of the same bytes on the same filesystem."""
    import tce
    from tce import _api, _knobs
    from tce._server import LocalServer

    res: dict[str, Any] = {}
    root = os.path.join(directory, "storage")
    os.makedirs(root)
    server = LocalServer(memory_budget=str(6 * nbytes + (256 << 20)), storage_roots=[root]).start()
    try:
        with _knobs.override(socket=server.socket, on_unavailable="raise"):
            a, b = os.path.join(root, "a.pt"), os.path.join(root, "b.pt")
            for p in (a, b):  # warm both buffers
                tce.save(sd, p)
            tce.wait()
            # Pairs (persist, dd) in turn: a disk's speed drifts, so only
            # ratios taken side by side mean something.
            persist, dd, during = [], [], []
            for _ in range(repeats):
                tce.save(sd, a)
                t0 = time.perf_counter()
                tce.wait([a])
                persist.append(time.perf_counter() - t0)
                dd.append(_dd(os.path.join(root, "dd.bin"), nbytes))
                tce.save(sd, a)  # a's persistence now runs in the background...
                t0 = time.perf_counter()
                tce.save(sd, b)  # ...while this save blocks the "training rank"
                during.append(time.perf_counter() - t0)
                tce.wait()
            res["tce_persist_s"] = statistics.median(persist)
            res["dd_fsync_s"] = statistics.median(dd)
            res["persist_vs_dd"] = statistics.median(d / p for p, d in zip(persist, dd))
            res["tce_save_while_persisting_s"] = statistics.median(during)
            _api.close()
    finally:
        server.stop()
        server.cleanup()
    return res


def run(size: int, *, repeats: int, directory: str, socket_path: str | None,
        persist_repeats: int = 5) -> dict[str, Any]:
    import tce
    from tce import _api, _knobs
    from tce._server import LocalServer

    sd = gpt_state_dict(size)
    nbytes = _nbytes(sd)
    model = {k: torch.empty_like(v).fill_(0) for k, v in sd.items()}  # warm restore target
    res: dict[str, Any] = {"bytes": nbytes, "tensors": len(sd), "repeats": repeats,
                           "torch": torch.__version__, "threads": torch.get_num_threads()}

    # Floor: a warm-to-warm copy of the same number of bytes (the copy TCE does).
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8).fill_(0)
    res["memcpy_s"] = _median(lambda: dst.copy_(src), repeats)
    del src, dst

    server = None
    if socket_path is None:
        server = LocalServer(memory_budget=str(4 * nbytes + (256 << 20))).start()
        socket_path = server.socket
    try:
        with _knobs.override(socket=socket_path, on_unavailable="raise"):
            path = os.path.join(directory, "tce_bench_cache.pt")
            res["tce_save_first_s"] = _time(lambda: tce.save(sd, path, tag="bench"))
            res["tce_save_s"] = _median(lambda: tce.save(sd, path, tag="bench"), repeats, warmup=2)

            def tce_load():
                return tce.load(path, weights_only=True)

            res["tce_load_s"] = _median(tce_load, repeats)
            res["tce_restore_s"] = _median(lambda: _restore_into(model, tce_load()), repeats)
            tce.remove(path)
            _api.close()
    finally:
        if server is not None:
            server.stop()
            server.cleanup()

    res.update(_persistence(sd, nbytes, repeats=persist_repeats, directory=directory))

    fpath = os.path.join(directory, "tce_bench_torch.pt")

    def torch_save_fsync() -> None:
        torch.save(sd, fpath)
        fd = os.open(fpath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    res["torch_save_s"] = _median(lambda: torch.save(sd, fpath), repeats)
    res["torch_save_fsync_s"] = _median(torch_save_fsync, repeats)
    res["torch_load_s"] = _median(lambda: torch.load(fpath, weights_only=True), repeats)
    res["torch_restore_s"] = _median(
        lambda: _restore_into(model, torch.load(fpath, weights_only=True)), repeats
    )
    os.unlink(fpath)

    gb = nbytes / 1e9
    res["memcpy_GBps"] = gb / res["memcpy_s"]
    res["tce_save_GBps"] = gb / res["tce_save_s"]
    res["tce_save_vs_memcpy"] = res["memcpy_s"] / res["tce_save_s"]
    res["tce_save_speedup_vs_torch_save"] = res["torch_save_s"] / res["tce_save_s"]
    res["tce_load_speedup_vs_torch_load"] = res["torch_load_s"] / res["tce_load_s"]
    res["tce_restore_speedup_vs_torch"] = res["torch_restore_s"] / res["tce_restore_s"]
    return res


def render(res: dict[str, Any]) -> str:
    gb = res["bytes"] / 1e9
    rows = [
        ("memcpy (warm, same bytes)", res["memcpy_s"], ""),
        ("tce.save, first (new buffer)", res["tce_save_first_s"], ""),
        ("tce.save, steady state", res["tce_save_s"],
         f"{res['tce_save_vs_memcpy']:.0%} of memcpy, "
         f"{res['tce_save_speedup_vs_torch_save']:.1f}x torch.save"),
        ("torch.save (page cache)", res["torch_save_s"], ""),
        ("torch.save + fsync", res["torch_save_fsync_s"], ""),
        ("tce.load (from cache)", res["tce_load_s"],
         f"{res['tce_load_speedup_vs_torch_load']:.1f}x torch.load"),
        ("torch.load (page cache)", res["torch_load_s"], ""),
        ("tce.save while another file persists", res["tce_save_while_persisting_s"],
         f"{res['tce_save_s'] / res['tce_save_while_persisting_s']:.0%} of the steady-state speed"),
        ("time to persisted (commit -> durable)", res["tce_persist_s"],
         f"{res['persist_vs_dd']:.0%} of dd conv=fsync (median of paired runs)"),
        ("dd conv=fsync, same bytes, same fs", res["dd_fsync_s"], ""),
        ("restore: tce.load + copy into model", res["tce_restore_s"],
         f"{res['tce_restore_speedup_vs_torch']:.1f}x torch"),
        ("restore: torch.load + copy into model", res["torch_restore_s"], ""),
    ]
    out = [
        f"state dict: {res['tensors']} tensors, {res['bytes'] / 2**30:.2f} GiB; "
        f"median of {res['repeats']} runs; torch {res['torch']}, {res['threads']} threads",
        f"{'':40s} {'seconds':>9s} {'GB/s':>8s}",
    ]
    for name, s, note in rows:
        out.append(f"{name:40s} {s:9.4f} {gb / s:8.2f}  {note}")
    return "\n".join(out)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size", default="1GiB", help="state dict size (default 1GiB)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per figure (median)")
    p.add_argument("--persist-repeats", type=int, default=5,
                   help="timed runs of the persistence figures (they write to disk)")
    p.add_argument("--dir", default=None,
                   help="directory for torch.save, dd and persisted files "
                        "(default: a temp dir under /tmp)")
    p.add_argument("--use-running-server", action="store_true",
                   help="use the server on --socket / $TCE_SOCKET instead of starting one")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--ring", action="store_true",
                   help="instead: ring backup throughput between two network namespaces "
                        "against a plain TCP stream (root)")


def main(args: argparse.Namespace) -> int:
    from tce import _knobs

    if args.ring:
        from tce import _ringbench

        return _ringbench.main(parse_size(args.size), args.repeats, args.json)

    socket_path = (args.socket or _knobs.get("socket")) if args.use_running_server else None
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        res = run(parse_size(args.size), repeats=args.repeats, directory=d,
                  socket_path=socket_path, persist_repeats=args.persist_repeats)
    print(json.dumps(res, indent=2) if args.json else render(res))
    sys.stdout.flush()
    return 0
