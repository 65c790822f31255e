"""``tce bench --weights``: published versions read by inference processes.

One node, a private server (memory only), reader processes of their own.
In one run:

* notify: reader processes wait for a newer version (``wait_newer``); the
  trainer publishes ``--versions`` small versions one after another; each
  reader notes when its call returned. Latency: from just before the
  trainer's ``publish`` (its files are committed) to the reader's return,
  on the one system-wide monotonic clock; p50 and p99 over every reader and
  version.
* read: a ``--size`` version of transformer-shaped tensors; a reader opens
  it and copies it into its own preallocated model tensors (``open`` +
  ``load_into``; the first read, which maps and faults the buffers in, is
  shown apart), against a warm memcpy of the same bytes between two
  preallocated tensors (the floor). A second reader opens the same
  version: the server's buffers and bytes before and after (no copy in
  the server).
* end to end: the trainer saves a ``--size`` state dict and publishes it;
  a waiting reader loads it into its model. Against the storage path: the
  trainer ``torch.save``\\ s to a file and fsyncs it, the reader (told at
  once) ``torch.load``\\ s it and copies it into its model.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

from tce import api, client
from tce.tools._coldbench import huge_pages
from tce.tools._server import LocalServer
from tce.tools._workload import gpt_state_dict

JOB = "bench-weights"

# A reader process: waits for versions and reports, one JSON line each.
_READER = r"""
import json, sys, time, torch
from tce import weights
mode, job, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
print(json.dumps({"ready": True}), flush=True)
after = int(sys.argv[4])
model = None
for _ in range(count):
    info = weights.wait_newer(job, after=after, timeout=600)
    woke = time.monotonic()
    loaded = None
    if mode == "load":
        with weights.open(job, info.version) as w:
            if model is None:
                model = {n: torch.zeros_like(t) for n, t in w.tensors()}
            w.load_into(model)
        loaded = time.monotonic()
    print(json.dumps({"version": info.version, "woke": woke, "loaded": loaded}), flush=True)
    after = info.version
"""

_STORAGE_READER = r"""
import json, sys, time, torch
path = sys.argv[1]
model = None
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    t = time.monotonic()
    sd = torch.load(path, map_location="cpu", weights_only=True)
    if model is None:
        model = {n: torch.empty_like(v) for n, v in sd.items()}
    for n, v in sd.items():
        model[n].copy_(v)
    del sd
    print(json.dumps({"loaded": time.monotonic(), "read_s": time.monotonic() - t}), flush=True)
"""


def _spawn(code: str, *args: str, stdin: bool = False) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                         stdin=subprocess.PIPE if stdin else None, text=True,
                         env=dict(os.environ))
    line = json.loads(p.stdout.readline() or "{}")
    if not line.get("ready"):
        p.kill()
        raise RuntimeError(f"bench reader did not start (exit {p.wait()})")
    return p


def _line(p: subprocess.Popen) -> dict[str, Any]:
    out = p.stdout.readline()
    if not out:
        raise RuntimeError(f"bench reader exited ({p.wait()})")
    return json.loads(out)


def _end(p: subprocess.Popen) -> None:
    """A reader that finished exits; one left waiting (the run failed) is killed."""
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def _notify(directory: str, versions: int, readers: int) -> dict[str, Any]:
    from tce import weights
    job = JOB + "-notify"
    api.save({"w": torch.zeros(16)}, os.path.join(directory, "n0.pt"), job=job, tag="n0")
    first = weights.publish("n0", job=job).version
    procs = [_spawn(_READER, "wait", job, str(versions), str(first)) for _ in range(readers)]
    lat: list[float] = []
    try:
        for i in range(1, versions + 1):
            api.save({"w": torch.full((16,), float(i))}, os.path.join(directory, "n.pt"), job=job,
                     tag=f"n{i}")
            t0 = time.monotonic()
            weights.publish(f"n{i}", job=job)
            for p in procs:  # every reader saw this version before the next
                got = _line(p)
                lat.append(got["woke"] - t0)
    finally:
        for p in procs:
            _end(p)
    return {"notify_samples": len(lat), "notify_p50_ms": _percentile(lat, 0.5) * 1e3,
            "notify_p99_ms": _percentile(lat, 0.99) * 1e3, "notify_max_ms": max(lat) * 1e3}


def _read(sd: dict[str, torch.Tensor], directory: str, repeats: int, fmt: str) -> dict[str, Any]:
    from tce import weights
    from tce.integrations import safetensors
    job = f"{JOB}-read-{fmt}"
    if fmt == "safetensors":
        safetensors.save_file(sd, os.path.join(directory, "model.safetensors"), job=job, tag="r1")
    else:
        api.save(sd, os.path.join(directory, "model.pt"), job=job, tag="r1")
    weights.publish("r1", job=job)
    model = {n: torch.empty_like(t) for n, t in sd.items()}
    for t in model.values():
        t.zero_()  # faulted in, as a loaded model's are
    times = []
    for _ in range(repeats + 1):  # the first maps and faults the pages: not counted
        t0 = time.perf_counter()
        with weights.open(job) as w:
            w.load_into(model)
        times.append(time.perf_counter() - t0)
    for n in sd:
        if not torch.equal(model[n], sd[n]):
            raise RuntimeError(f"bench: {n} read back differs")
    src = torch.empty(sum(t.numel() * t.element_size() for t in sd.values()), dtype=torch.uint8)
    dst = torch.empty_like(src)
    src.fill_(1), dst.zero_()
    memcpy = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        dst.copy_(src)
        memcpy.append(time.perf_counter() - t0)
    before = {k: int(api.status()[k]) for k in ("buffers", "used_bytes")}
    with weights.open(job) as a, weights.open(job) as b:
        sum(t.numel() for _, t in a.tensors()) + sum(t.numel() for _, t in b.tensors())
        after = {k: int(api.status()[k]) for k in ("buffers", "used_bytes")}
    read_s, memcpy_s = statistics.median(times[1:]), statistics.median(memcpy[1:])
    nbytes = src.numel()
    return {f"{fmt}_read_s": read_s, f"{fmt}_read_first_s": times[0], f"{fmt}_memcpy_s": memcpy_s,
            f"{fmt}_read_vs_memcpy": memcpy_s / read_s, f"{fmt}_read_GBps": nbytes / read_s / 1e9,
            f"{fmt}_memcpy_GBps": nbytes / memcpy_s / 1e9,
            f"{fmt}_second_reader_new_buffers": after["buffers"] - before["buffers"],
            f"{fmt}_second_reader_new_bytes": after["used_bytes"] - before["used_bytes"]}


def _end_to_end(sd: dict[str, torch.Tensor], directory: str, repeats: int) -> dict[str, Any]:
    from tce import weights
    job = JOB + "-e2e"
    api.save({"w": torch.zeros(1)}, os.path.join(directory, "e0.pt"), job=job, tag="e0")
    first = weights.publish("e0", job=job).version
    reader = _spawn(_READER, "load", job, str(repeats + 1), str(first))
    tce_s = []
    try:
        for i in range(repeats + 1):  # one path, as an RL loop saves: buffers are reused
            t0 = time.monotonic()
            api.save(sd, os.path.join(directory, "e-model.pt"), job=job, tag=f"e{i + 1}")
            weights.publish(f"e{i + 1}", job=job)
            tce_s.append(_line(reader)["loaded"] - t0)
    finally:
        _end(reader)
    path = os.path.join(directory, "storage-model.pt")
    reader = _spawn(_STORAGE_READER, path, stdin=True)
    storage_s = []
    try:
        for _ in range(repeats + 1):
            t0 = time.monotonic()
            torch.save(sd, path)  # what save_pretrained does, then fsync
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            reader.stdin.write("go\n")
            reader.stdin.flush()
            storage_s.append(_line(reader)["loaded"] - t0)
    finally:
        reader.stdin.close()
        _end(reader)
    tce_med, storage_med = statistics.median(tce_s[1:]), statistics.median(storage_s[1:])
    return {"e2e_tce_s": tce_med, "e2e_storage_s": storage_med, "e2e_speedup": storage_med / tce_med}


def run(size: int, repeats: int, *, versions: int = 50, readers: int = 2,
        directory: str | None = None, memory_backing: str = "auto") -> dict[str, Any]:
    sd = gpt_state_dict(size)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    res: dict[str, Any] = {"size_bytes": nbytes, "tensors": len(sd), "repeats": repeats,
                           "readers": readers, "versions": versions}
    budget = max(6 * nbytes, 1 << 30)
    # hugetlb: the budget's pages, and as many again for the readers' private
    # (copy-on-write) mappings, which reserve their pages when made.
    pages = 2 * budget // (2 << 20) if memory_backing == "hugetlb" else 0
    with tempfile.TemporaryDirectory(prefix="tce-wbench-", dir=directory) as tmp, \
            huge_pages(pages, "tce bench --weights --memory-backing hugetlb"):
        server = LocalServer(memory_budget=str(budget),
                             extra_args=["--memory-backing", memory_backing]).start()
        try:
            with client.override(socket=server.socket):
                os.environ["TCE_SOCKET"] = server.socket  # for the reader processes
                res.update(_notify(tmp, versions, readers))
                for fmt in ("safetensors", "torch"):
                    res.update(_read(sd, tmp, repeats, fmt))
                res.update(_end_to_end(sd, tmp, repeats))
                res["memory_backing"] = api.status()["memory_backing"]
                api.close()
        finally:
            server.stop()
            server.cleanup()
    return res


def render(res: dict[str, Any]) -> str:
    gib = res["size_bytes"] / (1 << 30)
    rows = [
        ("the server's memory backing", res["memory_backing"]),
        ("notify: publish -> reader woken, p50",
         f"{res['notify_p50_ms']:.2f} ms ({res['readers']} readers x {res['versions']} versions)"),
        ("notify: p99 / max", f"{res['notify_p99_ms']:.2f} ms / {res['notify_max_ms']:.2f} ms"),
        *[row for fmt, what in (("safetensors", "safetensors"), ("torch", "torch.save")) for row in (
            (f"{what}: read {gib:.2f} GiB into a model (open + load_into)",
             f"{res[fmt + '_read_s']:.3f} s ({res[fmt + '_read_GBps']:.2f} GB/s; "
             f"first {res[fmt + '_read_first_s']:.3f} s)"),
            (f"{what}: memcpy of the same bytes (warm)",
             f"{res[fmt + '_memcpy_s']:.3f} s ({res[fmt + '_memcpy_GBps']:.2f} GB/s)"),
            (f"{what}: read / memcpy bandwidth", f"{res[fmt + '_read_vs_memcpy']:.0%}"),
            (f"{what}: a second reader: new server buffers, bytes",
             f"{res[fmt + '_second_reader_new_buffers']}, {res[fmt + '_second_reader_new_bytes']}"))],
        ("save start -> reader loaded: TCE", f"{res['e2e_tce_s']:.3f} s"),
        ("save start -> reader loaded: storage (torch.save+fsync, torch.load)",
         f"{res['e2e_storage_s']:.3f} s"),
        ("storage / TCE", f"{res['e2e_speedup']:.1f}x"),
    ]
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def main(size: int, repeats: int, as_json: bool, directory: str | None = None,
         memory_backing: str = "auto") -> int:
    res = run(size, repeats, directory=directory, memory_backing=memory_backing)
    print(json.dumps(res, indent=2) if as_json else render(res))
    return 0
