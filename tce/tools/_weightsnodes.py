"""``tce bench --weights --nodes N``: a version spread to N inference nodes.

N + 1 "nodes" (network namespaces on a bridge, root needed), a tce-server
in each; node 0 is the trainer's, nodes 1..N follow its job. Each node's
link is limited with ``tc`` (``--link-rate``, default 1gbit, both
directions), so that the links, not this machine's shared CPU, are what a
transfer waits for, as on a cluster. In one run, for a fresh version of
``--size`` (one safetensors file) each time, from the trainer's publish to
every inference node's reader having loaded it:

* floor: one inference node alone (one transfer over one link);
* chain: every node follows the one before it, then the trainer's node
  (``sources=[node i-1, ..., node 0]``): node i-1 serves node i as the
  ranges land (pipelined);
* star: every node follows the trainer's node only;
* for comparison, ``torch.distributed.broadcast`` (gloo) of a tensor of the
  same size from a rank on the trainer's node to one rank on each
  inference node, over the same links (the tensor alone: no cache, no
  load into a model).

Medians over ``--repeats`` runs of each.
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
from tce.tools._netns import Nodes
from tce.tools._server import LocalServer

JOB = "weights-bench"

# A reader process on an inference node: follows, then loads each version it
# is told of (a line on stdin: the version), and reports when it has.
_READER = r"""
import json, sys, time, torch
from tce import weights
job, sources = sys.argv[1], sys.argv[2].split(",")
weights.follow(job, sources=sources)
print(json.dumps({"ready": True}), flush=True)
model = None
for line in sys.stdin:
    version = int(line)
    with weights.open(job, version) as w:
        if model is None:
            model = {n: torch.zeros_like(t) for n, t in w.tensors()}
        w.load_into(model)
    print(json.dumps({"version": version, "loaded": time.monotonic()}), flush=True)
"""


# torch.distributed's broadcast over the same links, for comparison: rank 0
# on the trainer's node holds the tensor, every inference node receives it.
_BROADCAST = r"""
import json, os, sys, time, torch, torch.distributed as dist
size, repeats = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo")
t = torch.zeros(size // 4)
if dist.get_rank() == 0:
    t.fill_(1.0)
times = []
for _ in range(repeats):
    dist.barrier()
    t0 = time.monotonic()
    dist.broadcast(t, 0)
    dist.barrier()
    times.append(time.monotonic() - t0)
if dist.get_rank() == 0:
    print(json.dumps(times), flush=True)
assert float(t[-1]) == 1.0
dist.destroy_process_group()
"""


def _broadcast(nodes: Nodes, size: int, repeats: int) -> list[float]:
    from tce.tools._ports import free_port
    world = len(nodes.names)
    env = dict(os.environ, MASTER_ADDR=nodes.addresses[0], MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(world), GLOO_SOCKET_IFNAME="eth0")
    procs = [subprocess.Popen(["ip", "netns", "exec", nodes.names[r], sys.executable, "-c", _BROADCAST,
                               str(size), str(repeats)], stdout=subprocess.PIPE, text=True,
                              env=dict(env, RANK=str(r), LOCAL_RANK="0"))
             for r in range(world)]
    out = procs[0].communicate(timeout=900)[0]
    for p in procs[1:]:
        p.wait(timeout=120)
    if any(p.returncode for p in procs):
        raise RuntimeError(f"the broadcast ranks exited with {[p.returncode for p in procs]}")
    return json.loads(out.strip().splitlines()[-1])


def limit_link(nodes: Nodes, i: int, rate: str) -> None:
    """Limits node i's link to `rate` each way (its egress in its namespace,
    its ingress as the bridge side's egress), with tc's token bucket."""
    for cmd in (["ip", "netns", "exec", nodes.names[i], "tc", "qdisc", "add", "dev", "eth0", "root"],
                ["tc", "qdisc", "add", "dev", nodes.host_veths[i], "root"]):
        p = subprocess.run([*cmd, "tbf", "rate", rate, "burst", "1mb", "latency", "200ms"],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip()}")


def _tc(nodes: Nodes, rate: str) -> None:
    for i in range(len(nodes.names)):
        limit_link(nodes, i, rate)


def _publish(trainer: LocalServer, job: str, directory: str, version: int, size: int,
             nodes: list[str] = ()) -> float:
    """A new version of the job: one `size`-byte safetensors file, saved over
    the last one as a reinforcement learning loop saves; returns when it was
    published. `nodes`: the inference nodes the trainer grants the job to."""
    from tce import weights
    from tce.integrations import safetensors
    d = os.path.join(directory, job)
    os.makedirs(d, exist_ok=True)
    sd = {"w": torch.full((size // 4,), float(version))}
    with client.override(socket=trainer.socket, job=job, on_unavailable="raise"):
        if nodes:
            weights.grant(nodes=nodes)
        safetensors.save_file(sd, os.path.join(d, "model.safetensors"), tag=f"v{version}")
        t0 = time.monotonic()
        info = weights.publish(f"v{version}", [d])
        api.close()
    if info.version != version:
        raise RuntimeError(f"published version {info.version}, expected {version}")
    return t0


def _spread(servers: list[LocalServer], endpoints: list[str], followers: list[int], layout: str,
            directory: str, size: int, repeats: int) -> list[float]:
    """Each layout follows a job of its own: its nodes hold none of it yet."""
    job = f"{JOB}-{layout}-{len(followers)}"
    # The job exists, granted to the inference nodes, before anyone follows it.
    _publish(servers[0], job, directory, 1, 4096, [endpoints[i] for i in followers])
    readers = []
    try:
        for k, i in enumerate(followers):
            if layout == "chain":
                sources = [endpoints[j] for j in reversed(followers[:k])] + [endpoints[0]]
            else:
                sources = [endpoints[0]]
            p = subprocess.Popen([sys.executable, "-c", _READER, job, ",".join(sources)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 env=dict(os.environ, TCE_SOCKET=servers[i].socket))
            readers.append(p)
            if not json.loads(p.stdout.readline() or "{}").get("ready"):
                raise RuntimeError(f"the reader on node {i} did not start")
        times = []
        for r in range(repeats):
            version = 2 + r
            t0 = _publish(servers[0], job, directory, version, size)
            for p in readers:
                p.stdin.write(f"{version}\n")
                p.stdin.flush()
            done = [json.loads(p.stdout.readline())["loaded"] for p in readers]
            times.append(max(done) - t0)
        return times
    finally:
        for p in readers:
            p.stdin.close()
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


def run(size: int, repeats: int, n: int = 3, rate: str = "1gbit") -> dict[str, Any]:
    if os.geteuid() != 0:
        raise SystemExit("tce bench --weights --nodes needs root (network namespaces and tc)")
    nodes = Nodes(n + 1)
    work = tempfile.mkdtemp(prefix="tce-wnodes-")
    servers: list[LocalServer] = []
    res: dict[str, Any] = {"size_bytes": size, "inference_nodes": n, "link_rate": rate, "repeats": repeats}
    try:
        _tc(nodes, rate)
        budget = f"{(8 * size + (256 << 20)) >> 20}MiB"
        for i in range(n + 1):
            d = os.path.join(work, f"n{i}")
            os.makedirs(d)
            servers.append(LocalServer(
                socket_path=os.path.join(d, "tce.sock"), memory_budget=budget, netns=nodes.names[i],
                extra_args=["--peer-listen", f"{nodes.addresses[i]}:7070", "--peer-token", "bench",
                            "--metadata-url", "none", "--log-level", "warning"]).start())
        endpoints = [f"{a}:7070" for a in nodes.addresses]
        ckpt = os.path.join(work, "ckpt")
        floor = _spread(servers, endpoints, [1], "star", ckpt, size, repeats)
        chain = _spread(servers, endpoints, list(range(1, n + 1)), "chain", ckpt, size, repeats)
        star = _spread(servers, endpoints, list(range(1, n + 1)), "star", ckpt, size, repeats)
        bcast = _broadcast(nodes, size, repeats)
        res.update(floor_s=statistics.median(floor), chain_s=statistics.median(chain),
                   star_s=statistics.median(star), broadcast_s=statistics.median(bcast))
        res["broadcast_vs_floor"] = res["broadcast_s"] / res["floor_s"]
        res["chain_vs_floor"] = res["chain_s"] / res["floor_s"]
        res["star_vs_floor"] = res["star_s"] / res["floor_s"]
        res["link_MBps_seen"] = size / res["floor_s"] / 1e6
    finally:
        for s in servers:
            s.stop()
            s.cleanup()
        nodes.close()
    return res


def render(res: dict[str, Any]) -> str:
    mib = res["size_bytes"] / (1 << 20)
    n = res["inference_nodes"]
    rows = [
        (f"one version of {mib:.0f} MiB to 1 inference node (the floor)",
         f"{res['floor_s']:.2f} s ({res['link_MBps_seen']:.0f} MB/s; links limited to {res['link_rate']})"),
        (f"to {n} inference nodes, a chain (each serves the next as it lands)",
         f"{res['chain_s']:.2f} s: {res['chain_vs_floor']:.2f}x the floor"),
        (f"to {n} inference nodes, all from the trainer's node",
         f"{res['star_s']:.2f} s: {res['star_vs_floor']:.2f}x the floor"),
        (f"torch.distributed broadcast (gloo) from the trainer's node to {n}, the tensor alone",
         f"{res['broadcast_s']:.2f} s: {res['broadcast_vs_floor']:.2f}x the floor"),
    ]
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def main(size: int, repeats: int, as_json: bool, n: int, rate: str) -> int:
    res = run(size, repeats, n, rate)
    print(json.dumps(res, indent=2) if as_json else render(res))
    return 0
