"""``tce bench --restore``: a whole job restarting on nodes whose caches are empty.

``--nodes`` "nodes" (network namespaces on a bridge, root needed), a
tce-server in each, all in the job's ring (peer port, one cluster token,
``set_ring`` with every node's endpoint), ``--ranks-per-node`` rank
processes on each, connected to their node's server. Shared storage is a
paced FUSE filesystem (:mod:`tce.tools._pacedfs`): reads share one token
bucket of ``--storage-rate`` bytes/s, the mount uses ``direct_io`` so no
page cache answers for it, and it counts every byte it serves.

The checkpoint is one tag laid out as DeepSpeed ZeRO-2 saves it
(``torch.save``, zip format), of about ``--size`` bytes:

* ``mp_rank_00_model_states.pt``: the module's bf16 parameters, which every
  rank loads;
* ``zero_pp_rank_R_mp_rank_00_optim_states.pt``, one per rank: its
  partition of the fp32 master weights and Adam's two moments, which only
  rank R loads.

Mixed-precision Adam keeps 2 bytes per parameter in the model states and
12 (4 + 4 + 4) in the optimizer shards, so the model states are 1/7 of the
tag (``--model-share``) and each shard ``6/7 / ranks`` of it.

Each measured run starts fresh servers (new state directories, nothing
cached), starts the ranks and lets them import and connect; then, as a job
does once its ranks are up, it tells every server the job's ring (what
``tce.join_ring`` does) and releases the ranks at once (a line on stdin):
each loads the model states and its shard with ``tce.load`` and says when
it is done. Measured:

* bytes read from storage: the filesystem's counter over the run (from
  before the servers start to after they stop), against the tag's unique
  bytes (each byte read once: 1.00);
* load time: from setting the ring to the last rank done, against the floor
  ``unique bytes / storage rate`` (the time to read each byte once);
* the same load from a plain directory (no FUSE, no pacing, the page cache
  warm): what a restore costs when storage is not what it waits for.

Every rank checks what it loaded bitwise (a CRC-32 of every tensor's bytes
against the one taken when the tag was saved) once every rank is done, so
no rank's check takes the CPU from another's load; a mismatch fails the
bench. Figures are medians over ``--repeats`` runs.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from typing import Any

JOB = "restore-bench"
TAG = "global_step100"
MODEL_SHARE = 1 / 7  # bf16 parameters: 2 of the 14 bytes mixed-precision Adam keeps per parameter
_TIMEOUT = 600.0  # seconds any one step of a run may take


def digest(obj: Any, crc: int = 0) -> int:
    """CRC-32 of every tensor's bytes (and every other leaf's repr), in order."""
    import torch
    if isinstance(obj, torch.Tensor):
        return zlib.crc32(obj.detach().contiguous().reshape(-1).view(torch.uint8).numpy(), crc)
    if isinstance(obj, dict):
        for k, v in obj.items():
            crc = digest(v, zlib.crc32(repr(k).encode(), crc))
        return crc
    if isinstance(obj, (list, tuple)):
        for v in obj:
            crc = digest(v, crc)
        return crc
    return zlib.crc32(repr(obj).encode(), crc)


def _random(nbytes: int, dtype, gen):
    import torch
    item = torch.empty(0, dtype=dtype).element_size()
    return torch.empty(nbytes // item * item, dtype=torch.uint8).random_(generator=gen).view(dtype)


def write_tag(directory: str, size: int, ranks: int, model_share: float = MODEL_SHARE) -> list[dict]:
    """Saves the tag under ``directory``/JOB/TAG; returns its files:
    {"name", "bytes", "digest", "ranks"} (the ranks that load it)."""
    import torch

    from tce.tools._workload import gpt_state_dict

    gen = torch.Generator().manual_seed(28)
    tag_dir = os.path.join(directory, JOB, TAG)
    os.makedirs(tag_dir, exist_ok=True)
    model_bytes = max(1 << 20, int(size * model_share))
    shard_bytes = max(3 << 12, (size - model_bytes) // ranks)
    module = {k: _random(v.nbytes, torch.bfloat16, gen)[: v.numel()].view(v.shape)
              for k, v in gpt_state_dict(model_bytes, dtype=torch.bfloat16).items()}
    objects = [("mp_rank_00_model_states.pt", list(range(ranks)),
                {"module": module, "iteration": 100, "dp_world_size": ranks, "mp_world_size": 1})]
    part = shard_bytes // 3
    for r in range(ranks):
        objects.append((f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt", [r], {
            "optimizer_state_dict": {
                "zero_stage": 2, "partition_count": ranks,
                "state": {0: {"step": torch.tensor(100.0), "exp_avg": _random(part, torch.float32, gen),
                              "exp_avg_sq": _random(part, torch.float32, gen)}},
                "single_partition_of_fp32_groups": [_random(part, torch.float32, gen)]},
            "ds_version": "0.16.0"}))
    files = []
    for name, readers, obj in objects:
        path = os.path.join(tag_dir, name)
        torch.save(obj, path)
        files.append({"name": name, "bytes": os.path.getsize(path), "digest": digest(obj),
                      "ranks": readers})
    return files


def _rank(cfg: dict) -> None:
    """One rank of the restarted job (``python -m tce.tools._restorebench RANK_JSON``)."""
    import tce
    tce.status()  # connected to its node's server before the release
    print(json.dumps({"ready": True}), flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    loaded = [tce.load(f["path"], weights_only=True) for f in cfg["files"]]
    done = time.monotonic()
    print(json.dumps({"rank": cfg["rank"], "done": done,
                      "bytes": sum(f["bytes"] for f in cfg["files"])}), flush=True)
    # Checked once every rank is done, so no rank's check takes CPU from
    # another's load.
    if sys.stdin.readline().strip() != "check":
        return
    bad = [f["path"] for f, obj in zip(cfg["files"], loaded) if digest(obj) != f["digest"]]
    print(json.dumps({"rank": cfg["rank"], "bad": bad}), flush=True)


def _lines(procs: list[subprocess.Popen]) -> queue.Queue:
    """Every JSON line the processes print, as (index, object); (index, None) at EOF."""
    q: queue.Queue = queue.Queue()

    def pump(i: int, p: subprocess.Popen) -> None:
        for line in p.stdout:
            try:
                q.put((i, json.loads(line)))
            except ValueError:
                sys.stderr.write(line)
        q.put((i, None))

    for i, p in enumerate(procs):
        threading.Thread(target=pump, args=(i, p), daemon=True).start()
    return q


def _collect(q: queue.Queue, procs: list[subprocess.Popen], key: str) -> list[dict]:
    got: dict[int, dict] = {}
    deadline = time.monotonic() + _TIMEOUT
    while len(got) < len(procs):
        try:
            i, msg = q.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError(f"ranks {sorted(set(range(len(procs))) - set(got))} did not "
                               f"report {key!r} in {_TIMEOUT:.0f} s") from None
        if msg is None:
            if i in got:  # it reported, then exited
                continue
            raise RuntimeError(f"rank {i} exited (code {procs[i].wait()}) before reporting {key!r}")
        if key in msg:
            got[i] = msg
    return [got[i] for i in range(len(procs))]


def _restore(nodes, root: str, files: list[dict], rpn: int, work: str, size: int,
             mount=None, cooperative: bool = True) -> dict[str, Any]:
    """One cold restart: fresh servers with storage root `root`, the ranks
    released at once; the load time and (with a paced `mount`) the bytes
    the storage served."""
    from tce import client
    from tce.core import dist
    from tce.tools._server import LocalServer

    n = len(nodes.names)
    work = tempfile.mkdtemp(prefix="run-", dir=work)
    budget = f"{(2 * size + (256 << 20)) >> 20}MiB"
    servers: list[LocalServer] = []
    procs: list[subprocess.Popen] = []
    try:
        # Counted from before the servers start: whatever they read for the
        # restart, at start, at set_ring or behind the loads, is the run's.
        before = mount.stats() if mount else None
        for i in range(n):
            d = os.path.join(work, f"n{i}")
            os.makedirs(d)
            servers.append(LocalServer(
                socket_path=os.path.join(d, "tce.sock"), memory_budget=budget, netns=nodes.names[i],
                storage_roots=[root],
                extra_args=["--peer-listen", f"{nodes.addresses[i]}:7070", "--peer-token", "bench",
                            "--metadata-url", "none", "--log-level", "warning",
                            "--cooperative-restore", "true" if cooperative else "false"]).start())
        tag_dir = os.path.join(root, JOB, TAG)
        for r in range(n * rpn):
            mine = [dict(f, path=os.path.join(tag_dir, f["name"])) for f in files if r in f["ranks"]]
            cfg = {"rank": r, "files": [{k: f[k] for k in ("path", "bytes", "digest")} for f in mine]}
            env = dict(os.environ, TCE_SOCKET=servers[r // rpn].socket, TCE_JOB=JOB,
                       TCE_ON_UNAVAILABLE="raise", RANK=str(r), LOCAL_RANK=str(r % rpn),
                       WORLD_SIZE=str(n * rpn), NODE_RANK=str(r // rpn))
            procs.append(subprocess.Popen(
                [*nodes.exec_prefix(r // rpn), sys.executable, "-m", "tce.tools._restorebench",
                 json.dumps(cfg)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env))
        q = _lines(procs)
        _collect(q, procs, "ready")
        # The restart as a job does it once its ranks are up: it tells every
        # server the ring (tce.join_ring), then the ranks load. Timed from
        # the ring, so no server starts on the tag before the clock does.
        t0 = time.monotonic()
        endpoints = [f"{a}:7070" for a in nodes.addresses]
        for i, s in enumerate(servers):
            with client.session(s.socket):
                dist.set_ring(JOB, i, endpoints)
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        done = _collect(q, procs, "done")
        seconds = max(d["done"] for d in done) - t0
        for p in procs:
            p.stdin.write("check\n")
            p.stdin.flush()
        checked = _collect(q, procs, "bad")
        for p in procs:
            p.stdin.close()
            p.wait(60)
        for s in servers:
            s.stop()
        bad = [(d["rank"], path) for d in checked for path in d["bad"]]
        if bad:
            raise RuntimeError(f"ranks loaded bytes that differ from the saved tag: {bad}")
        out = {"load_s": seconds, "rank_bytes": sum(d["bytes"] for d in done)}
        if mount:
            after = mount.stats()
            out["bytes_read"] = after["bytes_read"] - before["bytes_read"]
            out["reads"] = after["reads"] - before["reads"]
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for s in servers:
            s.stop()
            s.cleanup()
        shutil.rmtree(work, ignore_errors=True)


def run(size: int, repeats: int, n: int = 3, rpn: int = 2, rate: float = 200e6,
        model_share: float = MODEL_SHARE) -> dict[str, Any]:
    from tce.tools._netns import Nodes
    from tce.tools._pacedfs import PacedMount

    if os.geteuid() != 0:
        raise SystemExit("tce bench --restore needs root (network namespaces, a FUSE mount)")
    if n < 2 or rpn < 1 or rate <= 0 or not 0 < model_share < 1:
        raise SystemExit("tce bench --restore: --nodes >= 2, --ranks-per-node >= 1, --storage-rate > 0, "
                         "0 < --model-share < 1")
    work = tempfile.mkdtemp(prefix="tce-restorebench-")
    nodes = None
    try:
        backing = os.path.join(work, "storage")
        files = write_tag(backing, size, n * rpn, model_share)
        unique = sum(f["bytes"] for f in files)
        res: dict[str, Any] = {
            "nodes": n, "ranks_per_node": rpn, "ranks": n * rpn, "repeats": repeats,
            "unique_bytes": unique, "model_states_bytes": files[0]["bytes"],
            "optim_shard_bytes": files[1]["bytes"], "files": len(files),
            "rank_bytes": sum(f["bytes"] * len(f["ranks"]) for f in files),
            "storage_rate_Bps": rate, "floor_s": unique / rate}
        nodes = Nodes(n)
        # Both ways in one run, interleaved: each node reading for itself
        # (cooperative_restore off: a rank reads its files from storage),
        # and the cooperative restore.
        modes = {"independent": False, "cooperative": True}
        paced: dict[str, list] = {m: [] for m in modes}
        plain: dict[str, list] = {m: [] for m in modes}
        with PacedMount(backing, os.path.join(work, "mnt"), rate=rate) as mount:
            for _ in range(repeats):
                for m, coop in modes.items():
                    paced[m].append(_restore(nodes, mount.mountpoint, files, rpn, work, size, mount, coop))
        for _ in range(repeats):
            for m, coop in modes.items():
                plain[m].append(_restore(nodes, backing, files, rpn, work, size, None, coop))
        for m in modes:
            out = res[m] = {}
            out["bytes_read"] = statistics.median(r["bytes_read"] for r in paced[m])
            out["reads"] = statistics.median(r["reads"] for r in paced[m])
            out["read_ratio"] = out["bytes_read"] / unique
            out["load_s"] = statistics.median(r["load_s"] for r in paced[m])
            out["load_vs_floor"] = out["load_s"] / res["floor_s"]
            out["load_s_runs"] = [r["load_s"] for r in paced[m]]
            out["read_ratio_runs"] = [r["bytes_read"] / unique for r in paced[m]]
            out["plain_load_s"] = statistics.median(r["load_s"] for r in plain[m])
            out["plain_load_s_runs"] = [r["load_s"] for r in plain[m]]
        res["paced_speedup"] = res["independent"]["load_s"] / res["cooperative"]["load_s"]
        res["plain_speedup"] = res["independent"]["plain_load_s"] / res["cooperative"]["plain_load_s"]
        return res
    finally:
        if nodes is not None:
            nodes.close()
        shutil.rmtree(work, ignore_errors=True)


def render(res: dict[str, Any]) -> str:
    mb = 1e6
    n, rpn = res["nodes"], res["ranks_per_node"]
    head = (f"cold restore of one tag on {n} nodes x {rpn} ranks, empty caches; median of "
            f"{res['repeats']}\n"
            f"tag: {res['unique_bytes'] / mb:.0f} MB unique = model states "
            f"{res['model_states_bytes'] / mb:.0f} MB (every rank loads it) + {res['ranks']} optimizer "
            f"shards of {res['optim_shard_bytes'] / mb:.0f} MB (one rank each); the ranks load "
            f"{res['rank_bytes'] / mb:.0f} MB in all")
    cols = f"{'storage':28s} {'restore':12s} {'read from storage':>18s} {'x unique':>9s} {'floor s':>8s} " \
           f"{'load s':>7s} {'x floor':>8s}"
    rows = [head, cols]
    paced_name = "paced FUSE, " + format(res["storage_rate_Bps"] / mb, ".0f") + " MB/s"
    for m in ("independent", "cooperative"):
        r = res[m]
        rows.append(f"{paced_name:28s} {m:12s} {r['bytes_read'] / mb:15.0f} MB {r['read_ratio']:8.2f}x "
                    f"{res['floor_s']:8.2f} {r['load_s']:7.2f} {r['load_vs_floor']:7.2f}x")
    for m in ("independent", "cooperative"):
        rows.append(f"{'plain directory (not paced)':28s} {m:12s} {'-':>18s} {'-':>9s} {'-':>8s} "
                    f"{res[m]['plain_load_s']:7.2f} {'-':>8s}")
    rows.append(f"cooperative vs independent: {res['paced_speedup']:.2f}x faster paced, "
                f"{res['plain_speedup']:.2f}x plain")
    return "\n".join(rows)


def main(size: int, repeats: int, as_json: bool, n: int, rpn: int, rate: float,
         model_share: float = MODEL_SHARE) -> int:
    # A SIGTERM (a time limit) unwinds, so the mount, servers and namespaces go.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    res = run(size, repeats, n, rpn, rate, model_share)
    print(json.dumps(res, indent=2) if as_json else render(res))
    return 0


if __name__ == "__main__":
    _rank(json.loads(sys.argv[1]))
