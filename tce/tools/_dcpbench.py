"""``tce bench --dcp``: PyTorch DCP through TCE against DCP's own writer, reader
and ``async_save``, with 2 ranks (CPU, gloo) on one node, in one run.

The bench starts a ``tce-server`` persisting to a temporary directory, then
the ranks (this module run as a script). Each holds its half of a
DTensor-sharded GPT-like state dict (``--size`` in total) and times, in turn:

* DCP ``save`` with ``FileSystemWriter`` (it fsyncs: that is durable);
* DCP ``async_save`` with DCP's own stager (pinned memory where CUDA is
  present, else a CPU copy): the call, then durable;
* TCE's writer: ``save`` (blocking), ``async_save`` (the call, the fence,
  durable);
* loads in place: TCE's reader from the cache and from storage (the cache
  dropped), and ``FileSystemReader`` (page cache);
* resharded loads (saved by 2 ranks, loaded whole by 1 process): TCE's
  reader from the cache, from a peer (root only: two network namespaces with
  a server each and a ring; the loading node's server holds no copy, so the
  planned ranges come over the link from the other node's memory) and from
  storage, and ``FileSystemReader`` (page cache).

A figure is the slowest rank's, the median of ``--repeats`` runs after one
warm-up run; saves go to a fresh directory each run.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any, Callable

import torch

from tce.tools import _coldbench
from tce.tools._server import LocalServer
from tce.tools._workload import gpt_state_dict
from tce.tools._ports import free_port

WORLD = 2
LAYERS = 12  # a 12-layer model at any --size: ~150 tensors per rank


def run(size: int, *, repeats: int, directory: str,
        memory_backing: str = "auto") -> dict[str, Any]:
    """Run the ranks against a private server (its buffers on
    ``memory_backing``); returns the slowest rank's figures."""
    storage = os.path.join(directory, "storage")
    os.makedirs(storage)
    budget = 4 * size + (512 << 20)
    pages = budget // (2 << 20) + 64 if memory_backing == "hugetlb" else 0
    with _coldbench.huge_pages(pages, "tce bench --dcp --memory-backing hugetlb"):
        # keep_last 2: the buffers of older checkpoints are recycled once they
        # are persisted, as in a training run, so a save is not a first save.
        server = LocalServer(memory_budget=str(budget), storage_roots=[storage],
                             state_dir=os.path.join(directory, "state"),
                             extra_args=["--keep-last", "2", "--memory-backing", memory_backing]).start()
        try:
            port = str(free_port())
            procs = []
            for rank in range(WORLD):
                env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=port, TCE_SOCKET=server.socket, TCE_JOB="dcp-bench")
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "tce.tools._dcpbench", str(size), str(repeats), storage],
                    env=env, stdout=subprocess.PIPE, text=True))
            outs = [p.communicate()[0] for p in procs]
            for rank, p in enumerate(procs):
                if p.returncode != 0:
                    raise SystemExit(f"tce bench --dcp: rank {rank} exited {p.returncode}")
        finally:
            server.stop()
            server.cleanup()
    line = next(l for l in outs[0].splitlines() if l.startswith("RESULT "))
    res = json.loads(line[len("RESULT "):])
    res["memory_backing"] = memory_backing
    if os.geteuid() != 0:
        res["peer_skipped"] = "not root (the peer load needs two network namespaces)"
    else:
        res.update(_peer_load(size, repeats, directory))
    return res


def _peer_load(size: int, repeats: int, directory: str) -> dict[str, Any]:
    """Two nodes (network namespaces), a memory-only server each, a ring: 2
    ranks save through node 0's server, then 1 process loads the whole state
    dict through node 1's server, which holds no copy of node 0's files."""
    from tce import client
    from tce.core import dist
    from tce.tools._netns import Nodes

    nodes = Nodes(2)
    servers: list[LocalServer] = []
    try:
        for i, budget in enumerate([str(2 * size + (256 << 20)), str(256 << 20)]):
            d = os.path.join(directory, f"node{i}")
            os.makedirs(d)
            # Node 1's backup share is too small for any of node 0's files.
            share = ["--backup-share", "1"] if i == 1 else []
            servers.append(LocalServer(
                memory_budget=budget, socket_path=os.path.join(d, "tce.sock"),
                netns=nodes.names[i],
                extra_args=["--peer-listen", f"{nodes.addresses[i]}:7070", "--peer-token", "bench",
                            "--metadata-url", "none", "--log-level", "warning", *share]).start())
        endpoints = [f"{a}:7070" for a in nodes.addresses]
        for i, s in enumerate(servers):
            with client.session(s.socket):
                dist.set_ring("dcp-bench", i, endpoints)
        path = os.path.join(directory, "peer", "step")
        port = str(free_port())
        procs = [subprocess.Popen(
            [sys.executable, "-m", "tce.tools._dcpbench", "peer-save", str(size), path],
            env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=port, TCE_SOCKET=servers[0].socket, TCE_JOB="dcp-bench"))
            for r in range(WORLD)]
        if any(p.wait() != 0 for p in procs):
            raise SystemExit("tce bench --dcp: a rank of the peer save failed")
        out = subprocess.run(
            [sys.executable, "-m", "tce.tools._dcpbench", "peer-load", str(size), str(repeats),
             path], env=dict(os.environ, TCE_SOCKET=servers[1].socket, TCE_JOB="dcp-bench"),
            stdout=subprocess.PIPE, text=True, check=True).stdout
    finally:
        for s in servers:
            s.stop()
            s.cleanup()
        nodes.close()
    line = next(l for l in out.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def render(res: dict[str, Any]) -> str:
    gb = res["bytes"] / 1e9
    out = [f"DCP, {WORLD} ranks (CPU, gloo), {res['bytes'] / 2**30:.2f} GiB DTensor-sharded "
           f"state dict; median of {res['repeats']} runs, slowest rank; torch {res['torch']}; "
           f"TCE's buffers: memory_backing={res.get('memory_backing', 'auto')}",
           f"{'':11s}{'':46s} {'seconds':>9s} {'GB/s':>8s}"]
    names = [
        ("stall", "DCP save, FileSystemWriter (fsync)", "fs_save_s"),
        ("stall", "DCP async_save, DCP's stager: returns", "dcp_async_blocking_s"),
        ("stall", "TCE writer, save: returns", "tce_save_s"),
        ("stall", "TCE writer, async_save: returns", "tce_async_blocking_s"),
        ("modifiable", "TCE writer, async_save: fence passed", "tce_async_modifiable_s"),
        ("durable", "DCP save, FileSystemWriter", "fs_save_s"),
        ("durable", "DCP async_save, DCP's stager: durable", "dcp_async_durable_s"),
        ("durable", "TCE writer, save: durable", "tce_save_durable_s"),
        ("durable", "TCE writer, async_save: durable", "tce_async_durable_s"),
        ("restore", "TCE reader, from the cache", "tce_load_cache_s"),
        ("restore", "TCE reader, from storage", "tce_load_storage_s"),
        ("restore", "FileSystemReader (page cache)", "fs_load_s"),
        ("reshard", "TCE reader, from the cache", "tce_reshard_cache_s"),
        ("reshard", "TCE reader, from a peer (ring)", "tce_reshard_peer_s"),
        ("reshard", "TCE reader, from storage", "tce_reshard_storage_s"),
        ("reshard", "FileSystemReader (page cache)", "fs_reshard_s"),
    ]
    for group, name, key in names:
        if key in res:
            s = res[key]
            out.append(f"{group:11s}{name:46s} {s:9.4f} {gb / s:8.2f}")
    if "dcp_async_blocking_s" in res and "tce_async_blocking_s" in res:
        out.append(f"TCE async stall: {res['tce_async_blocking_s'] * 1e3:.1f} ms, "
                   f"{res['tce_async_blocking_s'] / res['dcp_async_blocking_s']:.2f}x DCP's; "
                   f"load from cache {res['fs_load_s'] / res['tce_load_cache_s']:.1f}x "
                   "FileSystemReader")
    if "fs_reshard_s" in res:
        speed = [f"{where} {res['fs_reshard_s'] / res[key]:.1f}x"
                 for where, key in (("from cache", "tce_reshard_cache_s"),
                                    ("from a peer", "tce_reshard_peer_s"),
                                    ("from storage", "tce_reshard_storage_s")) if key in res]
        out.append(f"resharded load (saved by {WORLD} ranks, loaded by 1) vs FileSystemReader: "
                   + ", ".join(speed))
    if "peer_skipped" in res:
        out.append(f"resharded load from a peer: skipped, {res['peer_skipped']}")
    return "\n".join(out)


# ---------------------------------------------------------------------------
# One rank
# ---------------------------------------------------------------------------

def _rank_main(size: int, repeats: int, storage: str) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    import tce
    import tce.dcp

    warnings.simplefilter("ignore")
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=10))
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (WORLD,))
    local = gpt_state_dict(size // WORLD, layers=LAYERS)
    sd = {k: DTensor.from_local(v, mesh, [Shard(0)], run_check=False) for k, v in local.items()}
    nbytes = sum(v.untyped_storage().nbytes() for v in local.values()) * WORLD
    target = {k: DTensor.from_local(torch.zeros_like(v), mesh, [Shard(0)], run_check=False)
              for k, v in local.items()}
    counter = iter(range(1 << 30))

    def fresh(kind: str) -> str:
        return os.path.join(storage, f"{kind}{next(counter)}")

    def slowest(seconds: float) -> float:
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def timed(fn: Callable[[], Any]) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        return slowest(time.perf_counter() - t0)

    res: dict[str, Any] = {"bytes": nbytes, "repeats": repeats, "torch": torch.__version__}
    runs: dict[str, list[float]] = {}

    def note(key: str, seconds: float) -> None:
        runs.setdefault(key, []).append(seconds)

    last_fs = ""
    for i in range(repeats + 1):  # the first run warms up (buffers, page cache) and is dropped
        if i == 1:
            runs.clear()
        last_fs = fresh("fs")
        note("fs_save_s", timed(lambda: dcp.save(sd, storage_writer=dcp.FileSystemWriter(last_fs))))
        # DCP's async_save with its own stager (a copy into CPU memory; pinned with CUDA).
        path = fresh("fsasync")
        dist.barrier()
        t0 = time.perf_counter()
        future = dcp.async_save(sd, storage_writer=dcp.FileSystemWriter(path))
        blocked = time.perf_counter() - t0
        future.result()
        durable = time.perf_counter() - t0
        note("dcp_async_blocking_s", slowest(blocked))
        note("dcp_async_durable_s", slowest(durable))
        shutil.rmtree(path, ignore_errors=True) if rank == 0 else None
        # TCE's writer, blocking.
        path = fresh("tce")
        writer = tce.dcp.StorageWriter(path)
        dist.barrier()
        t0 = time.perf_counter()
        dcp.save(sd, storage_writer=writer)
        blocked = time.perf_counter() - t0
        writer.wait()
        dist.barrier()
        note("tce_save_s", slowest(blocked))
        note("tce_save_durable_s", slowest(time.perf_counter() - t0))
        # TCE's writer, async_save: stage into the cache buffer, fence, durable.
        path = fresh("tceasync")
        writer = tce.dcp.StorageWriter(path)
        dist.barrier()
        t0 = time.perf_counter()
        future = dcp.async_save(sd, storage_writer=writer)
        blocked = time.perf_counter() - t0
        tce.wait_staged()
        modifiable = time.perf_counter() - t0
        future.result()
        writer.wait()
        dist.barrier()
        note("tce_async_blocking_s", slowest(blocked))
        note("tce_async_modifiable_s", slowest(modifiable))
        note("tce_async_durable_s", slowest(time.perf_counter() - t0))
    # Loads, in place, of the last TCE checkpoint (cache, then storage) and
    # of the last FileSystemWriter one (page cache).
    # Each load runs once untimed first (DCP's and the allocator's first-use
    # costs), then --repeats times.
    def load(reader: Any) -> float:
        dcp.load(target, storage_reader=reader)
        return statistics.median(timed(lambda: dcp.load(target, storage_reader=reader))
                                 for _ in range(repeats))

    # Resharded: the whole state dict, loaded by rank 0 alone (rank 1 waits).
    full = _full_target(local)
    # The saves above left gigabytes of dirty pages: written back now, so no
    # load below shares the machine with the kernel's writeback.
    os.sync()
    dist.barrier()

    def reshard(key: str, reader: Any, source: str) -> None:
        if rank == 0:
            note(key, _load_alone(full, reader, repeats))
            assert set(getattr(reader, "sources", lambda: {source: 1})()) == {source}
        dist.barrier()

    reader = tce.dcp.StorageReader(path)
    note("tce_load_cache_s", load(reader))
    assert set(reader.sources()) == {"local"}, reader.sources()
    reshard("tce_reshard_cache_s", tce.dcp.StorageReader(path), "local")
    dist.barrier()
    if rank == 0:
        for name in os.listdir(path):
            tce.remove(os.path.join(path, name))
    dist.barrier()
    reader = tce.dcp.StorageReader(path)
    note("tce_load_storage_s", load(reader))
    assert set(reader.sources()) == {"storage"}, reader.sources()
    reshard("tce_reshard_storage_s", tce.dcp.StorageReader(path), "storage")
    note("fs_load_s", load(dcp.FileSystemReader(last_fs)))
    reshard("fs_reshard_s", dcp.FileSystemReader(last_fs), "fs")
    for k, v in runs.items():
        res[k] = statistics.median(v)
    if rank == 0:
        print("RESULT " + json.dumps(res), flush=True)
    tce.close()
    dist.destroy_process_group()


def _full_target(local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Zeros shaped as the whole (unsharded) state dict of ``gpt_state_dict``
    shards (``Shard(0)`` over ``WORLD`` ranks)."""
    return {k: torch.zeros((v.shape[0] * WORLD, *v.shape[1:]), dtype=v.dtype)
            for k, v in local.items()}


def _load_alone(target: dict[str, torch.Tensor], reader: Any, repeats: int) -> float:
    """The median time of ``repeats`` loads by this process alone, after an
    untimed one."""
    import torch.distributed.checkpoint as dcp

    times = []
    for i in range(repeats + 1):
        reader.reset()
        t0 = time.perf_counter()
        dcp.load(target, storage_reader=reader, no_dist=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def _peer_save_main(size: int, path: str) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    import tce
    import tce.dcp

    warnings.simplefilter("ignore")
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=10))
    mesh = init_device_mesh("cpu", (WORLD,))
    local = gpt_state_dict(size // WORLD, layers=LAYERS)
    sd = {k: DTensor.from_local(v, mesh, [Shard(0)], run_check=False) for k, v in local.items()}
    dcp.save(sd, storage_writer=tce.dcp.StorageWriter(path))
    dist.barrier()
    tce.close()
    dist.destroy_process_group()


def _peer_load_main(size: int, repeats: int, path: str) -> None:
    import tce
    import tce.dcp

    warnings.simplefilter("ignore")
    full = _full_target(gpt_state_dict(size // WORLD, layers=LAYERS))
    reader = tce.dcp.StorageReader(path)
    seconds = _load_alone(full, reader, repeats)
    assert set(reader.sources()) == {"peer"}, reader.sources()
    print("RESULT " + json.dumps({"tce_reshard_peer_s": seconds}), flush=True)
    tce.close()


def main(size: int, repeats: int, as_json: bool, directory: str | None = None,
         memory_backing: str = "auto") -> int:
    """``tce bench --dcp``."""
    with tempfile.TemporaryDirectory(dir=directory) as d:
        res = run(size, repeats=repeats, directory=d, memory_backing=memory_backing)
    print(json.dumps(res, indent=2) if as_json else render(res))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "peer-save":
        _peer_save_main(int(sys.argv[2]), sys.argv[3])
    elif sys.argv[1] == "peer-load":
        _peer_load_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    else:
        _rank_main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
    # The device mesh and DTensors keep gloo's process group and its worker
    # threads alive into interpreter finalization, where a worker dropping a
    # tensor takes the GIL and aborts the process: the results are out, end.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
