"""``tce bench``'s cold rows: what a restarted process sees.

A restarted training process has nothing mapped: its first save maps and
faults in a new buffer, its restore maps and faults in the cached file
before ``tce.load`` and the copy into the model. Each figure is timed inside
a fresh interpreter (imports and building the state dict excluded), against a
server whose pre-faulted pool (``prealloc``) has filled, once with 4 KiB
pages and once with 2 MiB huge pages (``memory_backing = hugetlb``; root
reserves the huge pages in ``/proc/sys/vm/nr_hugepages`` for the run and puts
the old count back). The baseline is ``torch.load`` + copy in a new process,
with the page cache warm and, as root, dropped (``drop_caches``).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Iterator

import torch

import tce
from tce import api, client
from tce.tools._server import LocalServer

_NR_HUGEPAGES = "/proc/sys/vm/nr_hugepages"
_HUGE = 2 << 20

# Runs in the new process: argv = mode, size, path, dtype, layers, repeats, device.
# On a GPU the state dict and the model live on the device: the first save
# includes registering the new buffer with CUDA, a restore loads to the host
# (map_location="cpu", as a resuming job does) and copies into the model.
_CHILD = r"""
import json, statistics, sys, time
import torch
import tce
from tce.tools._workload import gpt_state_dict
mode, size, path, dtype, layers, repeats, device = sys.argv[1:8]
sd = gpt_state_dict(int(size), dtype=getattr(torch, dtype), device=device,
                    layers=int(layers) if layers != "-" else None)
sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
sync()
out = {}
if mode == "save":
    t0 = time.perf_counter(); tce.save(sd, path); sync(); out["first"] = time.perf_counter() - t0
    times = []
    for _ in range(int(repeats) + 2):  # two more buffers to map first: one is the parent's
        t0 = time.perf_counter(); tce.save(sd, path); sync(); times.append(time.perf_counter() - t0)
    out["steady"] = statistics.median(times[2:])
else:
    model = {k: torch.empty_like(v).fill_(0) for k, v in sd.items()}  # a built model, faulted in
    del sd
    sync()
    load = (lambda: tce.load(path, weights_only=True, map_location="cpu")) if mode == "tce" else \
           (lambda: torch.load(path, weights_only=True, map_location="cpu"))
    t0 = time.perf_counter()
    got = load()
    for k, v in model.items():
        v.copy_(got[k])
    sync()
    out["restore"] = time.perf_counter() - t0
print(json.dumps(out))
"""


def _child(mode: str, size: int, path: str, *, socket_path: str | None, dtype: torch.dtype,
           layers: int | None, repeats: int, device: str = "cpu") -> dict[str, float]:
    env = dict(os.environ, TCE_ON_UNAVAILABLE="raise")
    if socket_path:
        env["TCE_SOCKET"] = socket_path
    p = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, str(size), path, str(dtype).replace("torch.", ""),
         str(layers) if layers else "-", str(repeats), device],
        capture_output=True, text=True, env=env, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"bench child ({mode}) failed:\n{p.stderr[-4000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _reserve_huge_pages(n: int) -> tuple[int | None, str]:
    """Reserve n huge pages; (the old count to put back, "") or (None, why not)."""
    old = _read_int(_NR_HUGEPAGES)
    if old is None:
        return None, f"no {_NR_HUGEPAGES}"
    if os.geteuid() != 0:
        return None, "reserving huge pages needs root"
    try:
        with open(_NR_HUGEPAGES, "w") as f:
            f.write(str(max(n, old)))
    except OSError as e:
        return old, f"cannot reserve huge pages: {e}"
    got = _read_int(_NR_HUGEPAGES) or 0
    if got < n:
        return old, f"the kernel reserved {got} of {n} huge pages"
    return old, ""


def _restore_huge_pages(old: int | None) -> None:
    """Puts back the huge-page count _reserve_huge_pages found (None: nothing to do)."""
    if old is not None:
        with open(_NR_HUGEPAGES, "w") as f:
            f.write(str(old))


@contextlib.contextmanager
def huge_pages(n: int, what: str) -> Iterator[None]:
    """``n`` huge pages reserved for the block (0: none), the old count put
    back after; SystemExit naming ``what`` when the kernel does not give them."""
    if n <= 0:
        yield
        return
    old, why = _reserve_huge_pages(n)
    try:
        if why:
            raise SystemExit(f"{what}: {why}")
        yield
    finally:
        _restore_huge_pages(old)


def _drop_caches() -> bool:
    if os.geteuid() != 0:
        return False
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1")
        return True
    except OSError:
        return False


def wait_pool(server: LocalServer, timeout: float = 120.0, *, close: bool = True) -> dict[str, Any]:
    """Wait until the server's pool has filled as far as the budget lets it
    (its filler is idle), as a job that starts a while after the server finds it.
    ``close=False`` keeps this process's connection (and its mapped buffers)."""
    with client.override(socket=server.socket):
        deadline = time.monotonic() + timeout
        time.sleep(0.2)  # a take wakes the filler
        while True:
            st = api.status()
            if not st.get("pool_filling") or time.monotonic() > deadline:
                if close:
                    api.close()
                return st
            time.sleep(0.1)


def run(sd: dict[str, torch.Tensor], size: int, *, directory: str, dtype: torch.dtype,
        layers: int | None, repeats: int, device: str = "cpu") -> dict[str, Any]:
    """The cold rows: ``cold_<backing>_{first_save,steady_save,restore}_s`` for
    4k and hugetlb, ``cold_torch_restore_s`` (and ``_dropped_s`` as root);
    ``sd`` and the children's state dicts and models on ``device``."""
    res: dict[str, Any] = {}
    nbytes = sum(v.untyped_storage().nbytes() for v in sd.values())
    # The file cached, and the new version the child saves over it: two buffers.
    budget = 2 * nbytes + (256 << 20)
    path = os.path.join(directory, "tce_bench_cold.pt")
    for backing in ("4k", "hugetlb"):
        old = None
        if backing == "hugetlb":
            # The buffers, and a restore's copy-on-write reservation of the
            # file (the kernel reserves it when the file is mapped; with too
            # few free pages a load copies instead, which is not what is timed).
            old, why = _reserve_huge_pages((budget + nbytes) // _HUGE + 64)
            if why:
                res["cold_hugetlb_skipped"] = why
                _restore_huge_pages(old)
                continue
        try:
            server = LocalServer(memory_budget=str(budget), extra_args=[
                "--memory-backing", backing, "--prealloc", str(budget)]).start()
            try:
                st = wait_pool(server)
                res[f"cold_{backing}_pool_bytes"] = int(st["pool_bytes"])
                with client.override(socket=server.socket, on_unavailable="raise"):
                    tce.save(sd, path)  # the cached file the restores read
                    api.close()
                kw = dict(socket_path=server.socket, dtype=dtype, layers=layers, repeats=repeats,
                          device=device)
                wait_pool(server)  # refilled, as a job starting later finds it
                saved = _child("save", size, path, **kw)  # a new version: a new buffer
                res[f"cold_{backing}_first_save_s"] = saved["first"]
                res[f"cold_{backing}_steady_save_s"] = saved["steady"]
                res[f"cold_{backing}_restore_s"] = statistics.median(
                    [_child("tce", size, path, **kw)["restore"] for _ in range(max(1, repeats // 2))])
                with client.override(socket=server.socket):
                    st = api.status()
                    api.close()
                res[f"cold_{backing}_huge_page_buffers"] = int(st["huge_page_buffers"])
                res[f"cold_{backing}_pool_taken"] = int(st["pool_taken"])
            finally:
                server.stop()
                server.cleanup()
        finally:
            _restore_huge_pages(old)
    fpath = os.path.join(directory, "tce_bench_cold_torch.pt")
    torch.save(sd, fpath)
    kw = dict(socket_path=None, dtype=dtype, layers=layers, repeats=repeats, device=device)
    _child("torch", size, fpath, **kw)  # the page cache holds the file now
    res["cold_torch_restore_s"] = statistics.median(
        [_child("torch", size, fpath, **kw)["restore"] for _ in range(max(1, repeats // 2))])
    if _drop_caches():
        res["cold_torch_restore_dropped_s"] = _child("torch", size, fpath, **kw)["restore"]
    os.unlink(fpath)
    for backing in ("4k", "hugetlb"):
        if f"cold_{backing}_restore_s" in res:
            res[f"cold_{backing}_restore_speedup_vs_torch"] = (
                res["cold_torch_restore_s"] / res[f"cold_{backing}_restore_s"])
            res[f"cold_{backing}_first_vs_steady"] = (
                res[f"cold_{backing}_first_save_s"] / res[f"cold_{backing}_steady_save_s"])
    return res
