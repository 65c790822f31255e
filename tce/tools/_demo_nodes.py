"""``tce demo --nodes N``: a node lost in a multi-node DeepSpeed job.

N "nodes" (network namespaces on a bridge; needs root), one memory-only
``tce-server`` per node in a ring, one training rank per node (gloo over the
namespace addresses, NODE_RANK as torchrun sets it), ``"checkpoint_engine":
"tce"``. The job crashes (every rank SIGKILLed) and restarts three times:

a. no node lost: every rank resumes from its own node's cache;
b. node 1 lost: its server is SIGKILLed (memory gone) and a replacement
   with empty memory starts; it pulls node 1's files back from node 2, and
   the job resumes from the ring;
c. the same job on DeepSpeed's default engine (``torch.save`` to local
   disk), resuming from storage.

It prints the time from each restart to the first training step, and
checks that (b) and (c) end with bitwise the same weights.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from tce.tools._netns import Nodes
from tce.tools._server import LocalServer

_TOKEN = "tce-demo-ring"


class _Job:
    """The demo's cluster: the nodes, their servers, the report."""

    def __init__(self, args: argparse.Namespace, work: str, nodes: Nodes) -> None:
        self.args, self.work, self.nodes = args, work, nodes
        self.report = os.path.join(work, "report.jsonl")
        self.servers: list[LocalServer] = []
        self.retired: list[LocalServer] = []
        self.started = 0
        self.launched = 0
        for i in range(args.nodes):
            self.servers.append(self.server(i))

    def server(self, i: int) -> LocalServer:
        self.started += 1
        d = os.path.join(self.work, f"server{self.started}")
        os.makedirs(d)
        return LocalServer(memory_budget=self.args.memory_budget, socket_path=os.path.join(d, "tce.sock"),
                           netns=self.nodes.names[i],
                           extra_args=["--peer-listen", f"{self.nodes.addresses[i]}:7070",
                                       "--peer-token", _TOKEN, "--metadata-url", "none"]).start()

    def lose(self, i: int) -> None:
        self.servers[i].kill()
        self.retired.append(self.servers[i])
        self.servers[i] = self.server(i)

    def close(self) -> None:
        """Stops the servers (again: nothing)."""
        for s in self.servers:
            s.stop()
        for s in self.servers + self.retired:
            s.cleanup()
        self.servers, self.retired = [], []

    def run(self, label: str, ckpt: str, *extra: str, crash_at: int = 0) -> float | None:
        """One launch of the job on every node; the launch time, or None
        when a rank ended other than as planned (its output is printed)."""
        a = self.args
        self.launched += 1  # a fresh port per launch (node 0's namespace is ours alone)
        port = 29400 + self.launched
        t0 = time.time()
        procs = []
        for rank in range(a.nodes):
            cmd = [*self.nodes.exec_prefix(rank), sys.executable, "-X", "faulthandler", "-m",
                   "tce.tools._demo", "--dir", ckpt, "--report", self.report, "--label", label,
                   "--steps", str(a.steps), "--every", str(a.every), "--dim", str(a.dim),
                   "--layers", str(a.layers), "--vocab", str(a.vocab), "--seq", str(a.seq),
                   "--batch", str(a.batch), "--zero-stage", str(a.zero_stage),
                   "--crash-at", str(crash_at), *extra]
            socket_path = self.servers[rank].socket if self.servers else os.path.join(self.work, "none.sock")
            env = dict(os.environ, TCE_SOCKET=socket_path, TCE_ON_UNAVAILABLE="raise",
                       RANK=str(rank), WORLD_SIZE=str(a.nodes), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                       NODE_RANK=str(rank), GROUP_RANK=str(rank), MASTER_ADDR=self.nodes.addresses[0],
                       MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        outs = [p.communicate()[0] for p in procs]
        expect = -signal.SIGKILL if crash_at else 0
        for line in outs[0].splitlines():  # rank 0's own lines (DeepSpeed is chatty)
            if a.verbose or line.startswith(("  step", "  resumed")) or "[TCE]" in line:
                print(line)
        bad = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != expect]
        if not bad:
            return t0
        for rank, code in bad:
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
            print(f"\nrank {rank} {how}:")
            for line in outs[rank].splitlines()[-40:]:
                print(f"  | {line}")
        return None


def main(args: argparse.Namespace) -> int:
    if args.nodes < 3:
        print("tce demo --nodes: at least 3 nodes (node 1 is lost, node 2 holds its copies)")
        return 2
    if os.geteuid() != 0:
        print("tce demo --nodes needs root: each node is a network namespace")
        return 2
    print(f"TCE demo: DeepSpeed trains a small GPT on {args.nodes} nodes (network namespaces, one "
          f"rank and one memory-only tce-server each, in a ring), and loses node 1.\n")
    first, second = args.crash_at, args.crash_at + args.every
    nodes = Nodes(args.nodes)
    job = None
    try:
        with tempfile.TemporaryDirectory(prefix="tce-demo-nodes-") as work:
            job = _Job(args, work, nodes)
            ckpt, ref = os.path.join(work, "ckpt"), os.path.join(work, "reference")
            launches = {}
            steps = [
                ("train", f"[1] DeepSpeed + TCE on every node, a checkpoint every {args.every} steps, "
                          f"all ranks killed at step {first} (the first run compiles a DeepSpeed "
                          f"extension once, ~45 s)", ckpt, [], first),
                ("a", "[a] restart, no node lost: every rank resumes from its node's cache "
                      f"(killed again at step {second})", ckpt, ["--resume"], second),
                ("b", "[b] node 1 lost: its server is SIGKILLed and replaced with empty memory; the "
                      "restarted job resumes from the ring", ckpt, ["--resume"], 0),
                ("c-train", f"[c] DeepSpeed's default engine (torch.save to local disk), killed at "
                            f"step {second}", ref, ["--engine", "torch"], second),
                ("c", "    restart: DeepSpeed's default engine loads from storage", ref,
                 ["--engine", "torch", "--resume"], 0),
            ]
            recovered: list[str] = []
            for label, title, directory, extra, crash in steps:
                print(f"\n{title}")
                if label == "b":
                    job.lose(1)
                    print("    node 1's server replaced")
                if label == "c-train":  # the TCE part is over: give its memory back
                    recovered = _restore_lines(job.servers[1].log())
                    job.close()
                launches[label] = job.run(label, directory, *extra, crash_at=crash)
                if launches[label] is None:
                    return 1
            with open(job.report) as f:
                events = [json.loads(line) for line in f]
    finally:
        if job is not None:
            job.close()
        nodes.close()
    for line in recovered:
        print(f"    node 1's new server: {line}")
    return _print_table(events, launches)


def _restore_lines(log: str) -> list[str]:
    """The replacement's restore, from its log: what it recovered, and how
    long after the job told it the ring."""
    def stamp(line: str) -> float:
        return datetime.datetime.fromisoformat(line.split(" ", 1)[0].replace("Z", "+00:00")).timestamp()

    lines = log.splitlines()
    told = next((ln for ln in lines if " ring: job=tce-demo node 1 of " in ln), None)
    out = []
    for ln in lines:
        if " ring: recovered " in ln and " file(s) of job=" in ln:
            text = ln.split(" ring: ", 1)[-1]
            if told is not None:
                text += f", {(stamp(ln) - stamp(told)) * 1e3:.0f} ms after the job told it the ring"
            out.append(text)
    return out


def _print_table(events: list[dict], launches: dict[str, float]) -> int:
    def of(label: str, kind: str) -> list[dict]:
        return [e for e in events if e["label"] == label and e["kind"] == kind]

    ends = {label: next(e for e in of(label, "end") if e["rank"] == 0) for label in ("b", "c")}
    same = ends["b"]["digest"] == ends["c"]["digest"]
    print(f"\nfinal weights after losing node 1:    {ends['b']['digest']}")
    print(f"final weights, DeepSpeed's default:   {ends['c']['digest']}  "
          f"{'(identical)' if same else '(DIFFERENT)'}")
    rows = [("a", "no node lost, TCE (each node's cache)"),
            ("b", "node 1 lost, TCE (recovered from the ring)"),
            ("c", "DeepSpeed's default engine (from storage)")]
    print("\ntime from restart to the first training step, and of load_checkpoint in it, in seconds "
          "(slowest rank)")
    print(f"{'':44s} {'restart':>8s} {'load':>8s}  files read from")
    ok = same
    for label, name in rows:
        first = max(e["t"] for e in of(label, "first_step")) - launches[label]
        restores = of(label, "restore")
        load = max(e["seconds"] for e in restores)
        cache = sum(e["from_cache"] for e in restores)
        storage = sum(e["from_storage"] for e in restores)
        source = f"cache {cache}, storage {storage}" if label != "c" else "storage (torch.load)"
        print(f"{name:44s} {first:8.2f} {load:8.3f}  {source}")
        ok = ok and (label == "c" or storage == 0)
    return 0 if ok else 1
