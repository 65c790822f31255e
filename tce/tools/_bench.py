"""``tce bench``: TCE's save/load against torch.save/torch.load, in one run.

Every figure comes from the same process, the same state dict and the same
machine minutes, so the ratios between them hold even on a noisy machine.
Times are medians over ``--repeats`` runs (after warm-up where noted).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any, Callable

import torch

import tce
from tce import api, client
from tce.tools import _coldbench, _dcpbench, _ringbench, _s3bench
from tce.tools._server import LocalServer
from tce.tools._persistbench import FIO_NOTE, persistence, torch_save_fsync
from tce.tools._workload import TINY, gpt_state_dict, median_s, parse_size, time_s


def _nbytes(sd: dict[str, torch.Tensor]) -> int:
    return sum(v.untyped_storage().nbytes() for v in sd.values())


@contextlib.contextmanager
def _part(name: str):
    """Says on stderr how long a part of the run took, as each ends: a run
    cut short by a time limit still tells which part held it."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        print(f"tce bench: {name} took {time.perf_counter() - t0:.1f} s", file=sys.stderr,
              flush=True)


def _restore_into(dst: dict[str, torch.Tensor], src: dict[str, torch.Tensor]) -> None:
    for k, v in dst.items():
        v.copy_(src[k])


class _Skipped(Exception):
    pass


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _pinned_copy_s(sd: dict[str, torch.Tensor], nbytes: int, repeats: int) -> float:
    """The PCIe floor: one device-to-host copy of the same bytes into pinned memory."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=next(iter(sd.values())).device)
    dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def copy() -> None:
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()

    seconds = median_s(copy, repeats)
    del src, dst
    return seconds


def _dcp(sd: dict[str, torch.Tensor], directory: str, repeats: int) -> dict[str, Any]:
    """PyTorch DCP, one process (no_dist): save, async_save (default and with
    its pinned-memory stager where this torch has one), load in place."""
    import torch.distributed.checkpoint as dcp  # only for the DCP rows (--skip dcp)

    res: dict[str, Any] = {}
    where = os.path.join(directory, "dcp")

    def fresh() -> str:
        shutil.rmtree(where, ignore_errors=True)
        return where

    def save() -> None:
        dcp.save(sd, checkpoint_id=fresh(), no_dist=True)

    res["dcp_save_s"] = median_s(save, repeats)

    def async_run(stager: Any) -> tuple[float, float, float]:
        fresh()
        t0 = time.perf_counter()
        kwargs = {"async_stager": stager} if stager is not None else {}
        r = dcp.async_save(sd, checkpoint_id=where, no_dist=True, **kwargs)
        blocked = time.perf_counter() - t0
        staged = blocked
        if hasattr(r, "staging_completion"):  # AsyncSaveResponse (a stager that stages in the background)
            r.staging_completion.result()
            staged = time.perf_counter() - t0
            r = r.upload_completion
        r.result()
        return blocked, staged, time.perf_counter() - t0

    runs = [async_run(None) for _ in range(repeats)]
    res["dcp_async_blocking_s"] = statistics.median(r[0] for r in runs)
    res["dcp_async_durable_s"] = statistics.median(r[2] for r in runs)
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        if not next(iter(sd.values())).is_cuda:
            raise ImportError("the pinned stager stages GPU tensors")

        def pinned() -> Any:
            return DefaultStager(StagingOptions(use_pinned_memory=True, use_shared_memory=False,
                                                use_async_staging=True, use_non_blocking_copy=True))
    except ImportError:
        pinned = None
    if pinned is not None:
        runs = []
        for _ in range(repeats + 1):  # the first allocates the pinned staging memory
            stager = pinned()
            runs.append(async_run(stager))
            stager.close()
        runs = runs[1:] if len(runs) > 1 else runs
        res["dcp_async_pinned_blocking_s"] = statistics.median(r[0] for r in runs)
        res["dcp_async_pinned_modifiable_s"] = statistics.median(r[1] for r in runs)
        res["dcp_async_pinned_durable_s"] = statistics.median(r[2] for r in runs)
    save()
    target = {k: torch.empty_like(v) for k, v in sd.items()}

    def load() -> None:
        dcp.load(target, checkpoint_id=where, no_dist=True)
        _sync(str(next(iter(sd.values())).device))

    res["dcp_load_s"] = median_s(load, repeats)
    shutil.rmtree(where, ignore_errors=True)
    return res


def run(size: int, *, repeats: int, directory: str, socket_path: str | None,
        persist_repeats: int = 5, device: str = "cpu", dtype: torch.dtype = torch.float32,
        skip: tuple[str, ...] = (), layers: int | None = None,
        memory_backing: str = "auto") -> dict[str, Any]:
    sd = gpt_state_dict(size, dtype=dtype, device=device, layers=layers)
    nbytes = _nbytes(sd)
    model = {k: torch.empty_like(v).fill_(0) for k, v in sd.items()}  # warm restore target
    res: dict[str, Any] = {"bytes": nbytes, "tensors": len(sd), "repeats": repeats,
                           "torch": torch.__version__, "threads": torch.get_num_threads(),
                           "device": device, "dtype": str(dtype).replace("torch.", "")}
    if device.startswith("cuda"):
        res["gpu"] = torch.cuda.get_device_name()
        res["pinned_copy_s"] = _pinned_copy_s(sd, nbytes, repeats)

    # Floor: a warm-to-warm copy of the same number of bytes (the copy TCE does).
    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8).fill_(0)
    res["memcpy_s"] = median_s(lambda: dst.copy_(src), repeats)
    del src, dst

    def restore(load: Callable[[], Any]) -> Callable[[], None]:
        def go() -> None:
            _restore_into(model, load())
            _sync(device)
        return go

    server = None
    pages = contextlib.ExitStack()  # huge pages the run reserves, given back at its end
    pages.enter_context(_part("tce"))
    try:
        if socket_path is None and "tce" not in skip:
            budget = 3 * nbytes + (256 << 20)
            if memory_backing == "hugetlb":
                # The budget, and a load's copy-on-write reservation of the
                # file (see _coldbench.run).
                pages.enter_context(_coldbench.huge_pages(
                    (budget + nbytes) // (2 << 20) + 64, "tce bench --memory-backing hugetlb"))
            # Pre-faulted at start (prealloc), as a node's server is long before a
            # job's first save: the bench starts timing once the pool is full.
            server = LocalServer(memory_budget=str(budget), extra_args=[
                "--prealloc", str(2 * nbytes + (256 << 20)), "--memory-backing", memory_backing]).start()
            socket_path = server.socket
            _coldbench.wait_pool(server)
        with client.override(socket=socket_path, on_unavailable="raise"):
            if "tce" in skip:
                raise _Skipped
            path = os.path.join(directory, "tce_bench_cache.pt")
            res["tce_save_first_s"] = time_s(lambda: tce.save(sd, path, tag="bench"))
            res["memory_backing"] = api.status()["memory_backing"]
            # The steady state: the two buffers the saves alternate between,
            # and the pool refilled after them (between a job's checkpoints
            # it is; its zero-filling is not what a save costs).
            for _ in range(2):
                tce.save(sd, path, tag="bench")
            if server is not None:
                _coldbench.wait_pool(server, close=False)
            res["tce_save_s"] = median_s(lambda: tce.save(sd, path, tag="bench"), repeats, warmup=0)
            blocked, modifiable = [], []
            for _ in range(repeats + 1):
                t0 = time.perf_counter()
                tce.save(sd, path, tag="bench", blocking=False)
                blocked.append(time.perf_counter() - t0)
                tce.wait_staged()
                modifiable.append(time.perf_counter() - t0)
            res["tce_async_blocking_s"] = statistics.median(blocked[1:])
            res["tce_async_modifiable_s"] = statistics.median(modifiable[1:])

            def tce_load():
                return tce.load(path, weights_only=True, map_location=device)

            res["tce_load_s"] = median_s(tce_load, repeats)
            res["tce_restore_s"] = median_s(restore(tce_load), repeats)
            tce.remove(path)
            tiny = os.path.join(directory, "tce_bench_tiny.pt")
            tce.save(TINY, tiny)
            res["tiny_load_s"] = median_s(lambda: tce.load(tiny), 200)
            tce.remove(tiny)
            api.close()
    except _Skipped:
        pass
    finally:
        if server is not None:
            server.stop()
            server.cleanup()
        pages.close()

    if "cold" not in skip and "tce" not in skip:
        with _part("cold"):
            res.update(_coldbench.run(sd, size, directory=directory, dtype=dtype, layers=layers,
                                      repeats=repeats, device=device))
    if "persist" not in skip:
        with _part("persist"):
            res.update(persistence(sd, nbytes, repeats=persist_repeats, directory=directory))
    if "torch" not in skip:
        with _part("torch"):
            res.update(_torch(sd, model, restore, repeats=repeats, directory=directory,
                              device=device))
    if "dcp" not in skip:
        with _part("dcp"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DCP's single-process notices
            res.update(_dcp(sd, directory, repeats))

    gb = nbytes / 1e9
    res["memcpy_GBps"] = gb / res["memcpy_s"]
    if "tce_save_s" in res:
        res["tce_save_GBps"] = gb / res["tce_save_s"]
        res["tce_save_vs_memcpy"] = res["memcpy_s"] / res["tce_save_s"]
    if "torch_save_s" in res and "tce_save_s" in res:
        res["tce_save_speedup_vs_torch_save"] = res["torch_save_s"] / res["tce_save_s"]
        res["tce_load_speedup_vs_torch_load"] = res["torch_load_s"] / res["tce_load_s"]
        res["tce_restore_speedup_vs_torch"] = res["torch_restore_s"] / res["tce_restore_s"]
    return res


def _torch(sd: dict[str, torch.Tensor], model: dict[str, torch.Tensor], restore: Callable, *,
           repeats: int, directory: str, device: str) -> dict[str, Any]:
    """torch.save (+fsync) and torch.load of the same state dict."""
    res: dict[str, Any] = {}
    fpath = os.path.join(directory, "tce_bench_torch.pt")

    res["torch_save_s"] = median_s(lambda: torch.save(sd, fpath), repeats)
    res["torch_save_fsync_s"] = median_s(lambda: torch_save_fsync(sd, fpath), repeats)
    res["torch_load_s"] = median_s(lambda: torch.load(fpath, weights_only=True, map_location=device),
                                  repeats)
    res["torch_restore_s"] = median_s(
        restore(lambda: torch.load(fpath, weights_only=True, map_location=device)), repeats
    )
    os.unlink(fpath)
    return res


def rows(res: dict[str, Any]) -> list[tuple[str, str, float, str]]:
    """(group, name, seconds, note) for the table and the chart."""
    out = []

    def add(group: str, name: str, key: str, note: Callable[[], str] = lambda: "") -> None:
        if key in res:  # the note only where its figures exist
            out.append((group, name, res[key], note()))

    add("floor", "pinned device-to-host copy (PCIe)", "pinned_copy_s")
    add("floor", "memcpy (warm, same bytes)", "memcpy_s")
    add("floor", "dd conv=fsync, same bytes, same fs", "dd_fsync_s")
    add("floor", "fio O_DIRECT 4 MiB x16, same bytes, same fs", "fio_direct_s",
        lambda: "libaio, --end_fsync=1; fio's own bandwidth")
    add("stall", "tce.save, blocking, steady state", "tce_save_s",
        lambda: f"{res['tce_save_vs_memcpy']:.0%} of memcpy"
        + (f", {res['tce_save_speedup_vs_torch_save']:.1f}x torch.save" if "torch_save_s" in res else ""))
    add("stall", "tce.save, blocking, first (new buffer)", "tce_save_first_s",
        lambda: f"{res['tce_save_first_s'] / res['tce_save_s']:.1f}x steady state (pre-faulted pool, "
        f"{res.get('memory_backing', '4k')} pages)" if "tce_save_s" in res else "")
    for b, pages in (("4k", "4 KiB pages"), ("hugetlb", "2 MiB pages")):
        add("cold", f"first tce.save in a new process, {pages}", f"cold_{b}_first_save_s",
            lambda b=b: f"{res[f'cold_{b}_first_vs_steady']:.1f}x its steady state "
            f"({res[f'cold_{b}_steady_save_s']:.3f} s)")
    for b, pages in (("4k", "4 KiB pages"), ("hugetlb", "2 MiB pages")):
        add("cold", f"restore in a new process: tce, {pages}", f"cold_{b}_restore_s",
            lambda b=b: f"{res[f'cold_{b}_restore_speedup_vs_torch']:.1f}x torch.load + copy, new process")
    add("cold", "restore in a new process: torch.load + copy", "cold_torch_restore_s",
        lambda: "page cache warm")
    add("cold", "  the same, page cache dropped", "cold_torch_restore_dropped_s",
        lambda: "echo 1 > /proc/sys/vm/drop_caches")
    add("stall", "tce.save, async: call returns", "tce_async_blocking_s")
    add("stall", "tce.save while another file persists", "tce_save_while_persisting_s",
        lambda: f"{res['tce_save_s'] / res['tce_save_while_persisting_s']:.0%} of the steady-state speed"
        if "tce_save_s" in res else "")
    add("stall", "torch.save (page cache)", "torch_save_s")
    add("stall", "torch.save + fsync", "torch_save_fsync_s")
    add("stall", "DCP save", "dcp_save_s")
    add("stall", "DCP async_save: call returns", "dcp_async_blocking_s")
    add("stall", "DCP async_save, pinned stager: returns", "dcp_async_pinned_blocking_s")
    add("modifiable", "tce.save, async: tensors free (fence)", "tce_async_modifiable_s")
    add("modifiable", "DCP async_save, pinned stager: staged", "dcp_async_pinned_modifiable_s")
    add("durable", "tce: commit -> persisted", "tce_persist_s",
        lambda: (f"{res['persist_vs_fio']:.0%} of {FIO_NOTE}, " if "persist_vs_fio" in res else
                 f"no {FIO_NOTE} figure: {res['fio_missing']}; " if "fio_missing" in res else "")
        + f"{res['persist_vs_dd']:.0%} of dd conv=fsync (median of paired runs)")
    add("durable", "tce.save + wait (patch_torch durable=True)", "tce_durable_s",
        lambda: f"{res['durable_vs_torch_fsync']:.2f}x torch.save + fsync (median of paired runs)")
    add("durable", "DCP async_save: durable", "dcp_async_durable_s")
    add("durable", "DCP async_save, pinned stager: durable", "dcp_async_pinned_durable_s")
    add("restore", "tce.load (from cache)", "tce_load_s",
        lambda: f"{res['tce_load_speedup_vs_torch_load']:.1f}x torch.load" if "torch_load_s" in res else "")
    add("restore", "torch.load (page cache)", "torch_load_s")
    add("per file", "tce.load of 1 KiB, memory-only server", "tiny_load_s")
    add("per file", "tce.load of 1 KiB, checked against storage", "tiny_load_checked_s",
        lambda: f"+{(res['tiny_load_checked_s'] - res['tiny_load_s']) * 1e6:.0f} us for the storage check"
        if "tiny_load_s" in res else "")
    add("restore", "DCP load (in place)", "dcp_load_s")
    add("restore", "restore from cache: tce.load + copy", "tce_restore_s",
        lambda: f"{res['tce_restore_speedup_vs_torch']:.1f}x torch" if "torch_restore_s" in res else "")
    add("restore", "restore from storage: torch.load + copy", "torch_restore_s")
    return out


def render(res: dict[str, Any]) -> str:
    gb = res["bytes"] / 1e9
    where = res.get("gpu", "CPU")
    out = [
        f"state dict: {res['tensors']} tensors, {res['bytes'] / 2**30:.2f} GiB {res.get('dtype', '')} "
        f"on {res.get('device', 'cpu')} ({where}); median of {res['repeats']} runs; "
        f"torch {res['torch']}, {res['threads']} threads",
        f"{'':11s}{'':42s} {'seconds':>9s} {'GB/s':>8s}",
    ]
    for group, name, s, note in rows(res):
        rate = "" if group == "per file" else f"{gb / s:8.2f}"  # a 1 KiB file: no rate
        out.append(f"{group:11s}{name:42s} {s:9.4f} {rate:>8s}  {note}")
    return "\n".join(out)


def plot(res: dict[str, Any], path: str) -> None:
    """A horizontal bar chart of every row, grouped, log-scaled seconds."""
    try:  # optional: the bench extra
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise SystemExit("--plot needs matplotlib (pip install matplotlib)") from None
    data = rows(res)
    colors = {"floor": "#999999", "stall": "#d62728", "cold": "#8c564b", "modifiable": "#ff7f0e",
              "durable": "#1f77b4", "restore": "#2ca02c", "per file": "#9467bd"}
    fig, ax = plt.subplots(figsize=(10, 0.38 * len(data) + 1.5))
    names = [f"{n}" for _, n, _, _ in data][::-1]
    secs = [s for _, _, s, _ in data][::-1]
    ax.barh(names, secs, color=[colors[g] for g, _, _, _ in data][::-1])
    for i, s in enumerate(secs):
        ax.text(s, i, f" {s:.3g} s", va="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("seconds (log scale; shorter is better)")
    ax.set_title(f"tce bench: {res['bytes'] / 2**30:.1f} GiB {res.get('dtype', '')} on "
                 f"{res.get('gpu', res.get('device', 'cpu'))}")
    ax.legend(handles=[Patch(color=c, label=g) for g, c in colors.items()], loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size", default=None,
                   help="state dict size (default 1GiB; with --restore: the tag's, 512MiB)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed runs per figure (median; default 5, 3 with --s3)")
    p.add_argument("--persist-repeats", type=int, default=5,
                   help="timed runs of the persistence figures (they write to disk)")
    p.add_argument("--dir", default=None,
                   help="directory for torch.save, dd, fio and persisted files "
                        "(default: a temp dir under /tmp)")
    p.add_argument("--use-running-server", action="store_true",
                   help="use the server on --socket / $TCE_SOCKET instead of starting one")
    p.add_argument("--device", default="cpu",
                   help="where the state dict lives: cpu (default) or cuda[:N]")
    p.add_argument("--layers", type=int, default=None,
                   help="transformer layers (12 tensors each; default: as many as --size "
                        "holds); with a small --size, a large model's tensor count; with "
                        "--engine vllm: the served model's (default 12)")
    p.add_argument("--dtype", default=None,
                   help="float32 (default on cpu) or bfloat16 (default on cuda), float16")
    p.add_argument("--skip", default="", metavar="PARTS",
                   help="comma list of parts to leave out: tce (the cache rows), cold (a new "
                        "process's first save and restore), persist, torch, dcp; with --s3: "
                        "boto3, tce")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="also draw the figures as a bar chart (needs matplotlib)")
    p.add_argument("--dcp", action="store_true",
                   help="instead: PyTorch DCP with 2 ranks (CPU, gloo): FileSystemWriter and "
                        "DCP's async_save against TCE's writer and reader")
    p.add_argument("--memory-backing", default="auto", choices=["auto", "hugetlb", "thp", "4k"],
                   help="the private server's memory_backing, for the cache rows, --dcp and --weights "
                        "(hugetlb: the run reserves the huge pages, as root, and puts the old "
                        "count back; the cold rows always run with 4k and hugetlb)")
    p.add_argument("--ring", action="store_true",
                   help="instead: ring backup throughput between two network namespaces "
                        "against a plain TCP stream (root)")
    p.add_argument("--nodes", type=int, default=0, metavar="N",
                   help="with --weights: spread each version to N inference nodes (network "
                        "namespaces, links limited with tc; root) instead of one node's readers; "
                        "with --restore: the job's nodes (default 3)")
    p.add_argument("--link-rate", default="1gbit",
                   help="with --weights --nodes: each node's link, each way (tc rate; default 1gbit)")
    _s3bench.add_arguments(p)
    p.add_argument("--weights", action="store_true",
                   help="instead: published versions read by inference processes: publish to "
                        "reader latency, read bandwidth against memcpy, save-to-served against "
                        "the storage path (docs/weights.md)")
    p.add_argument("--engine", default=None, choices=["vllm"],
                   help="with --weights: instead, a real engine takes each version: vLLM (its CPU "
                        "build, in its own environment, tce.tools._vllm_env) through TCE's backend "
                        "against its floor, vLLM's reload_weights from storage and HTTP; "
                        "a Qwen2 model of --hidden x --layers")
    p.add_argument("--hidden", type=int, default=None,
                   help="with --engine vllm: the served model's hidden size (default 1024)")
    p.add_argument("--restore", action="store_true",
                   help="instead: a whole job restarting on --nodes nodes with empty caches, "
                        "from storage paced by a FUSE filesystem: bytes read from storage against "
                        "the tag's unique bytes, load time against unique bytes / --storage-rate "
                        "(root)")
    p.add_argument("--ranks-per-node", type=int, default=2,
                   help="with --restore: rank processes on each node (default 2)")
    p.add_argument("--storage-rate", default="200MB",
                   help="with --restore: the storage's read bandwidth, shared by all readers, "
                        "per second (default 200MB)")
    p.add_argument("--model-share", type=float, default=None,
                   help="with --restore: the model states' share of the tag, the file every rank "
                        "loads (default 1/7, mixed-precision Adam: 2 of 14 bytes per parameter)")


def main(args: argparse.Namespace) -> int:
    if args.size is None:
        args.size = "512MiB" if args.restore else "1GiB"
    if args.s3:
        repeats = 3 if args.repeats is None else args.repeats
        return _s3bench.main(parse_size(args.size), repeats, args.json, args.dir, args.skip,
                             args.s3_server_arg)
    if args.engine:
        if not args.weights:
            raise SystemExit("--engine goes with --weights")
        from tce.tools import _vllmbench
        return _vllmbench.main(args.hidden or _vllmbench.HIDDEN, args.layers or _vllmbench.LAYERS,
                               args.repeats or 5, args.json, args.dir,
                               memory_backing=args.memory_backing)
    if args.repeats is None:
        args.repeats = 5
    if args.ring:
        return _ringbench.main(parse_size(args.size), args.repeats, args.json)
    if args.restore:
        from tce.tools import _restorebench
        return _restorebench.main(parse_size(args.size), args.repeats, args.json, args.nodes or 3,
                                  args.ranks_per_node, parse_size(args.storage_rate),
                                  args.model_share or _restorebench.MODEL_SHARE)
    if args.weights and args.nodes:
        from tce.tools import _weightsnodes
        return _weightsnodes.main(parse_size(args.size), args.repeats, args.json, args.nodes, args.link_rate)
    if args.weights:
        from tce.tools import _weightsbench
        return _weightsbench.main(parse_size(args.size), args.repeats, args.json, args.dir,
                                  memory_backing=args.memory_backing)
    if args.dcp:
        return _dcpbench.main(parse_size(args.size), args.repeats, args.json, args.dir,
                              memory_backing=args.memory_backing)

    socket_path = (args.socket or client.setting("socket")) if args.use_running_server else None
    dtype_name = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise SystemExit(f"--dtype: unknown dtype {dtype_name!r}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: this torch sees no CUDA device")
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        res = run(parse_size(args.size), repeats=args.repeats, directory=d,
                  socket_path=socket_path, persist_repeats=args.persist_repeats,
                  device=args.device, dtype=dtype,
                  skip=tuple(x for x in args.skip.split(",") if x), layers=args.layers,
                  memory_backing=args.memory_backing)
    print(json.dumps(res, indent=2) if args.json else render(res))
    if args.plot:
        plot(res, args.plot)
    sys.stdout.flush()
    return 0
