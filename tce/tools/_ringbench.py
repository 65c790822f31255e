"""``tce bench --ring``: backup throughput between two network namespaces.

Two "nodes" (network namespaces on a veth bridge, root needed), a tce-server
in each, a ring between them. In the same run, on the same link:

* the floor: a plain TCP stream of the same bytes, ``sendfile`` from a memfd
  into the socket and ``recv`` straight into a mapped memfd (what the tcp
  transport does, without TCE);
* TCE: save a file on node 0 and time until node 1 holds the verified copy
  (commit to ``backup_holder`` set), steady state: the copy replaces the
  previous one of the same path, and the first two runs, which create the
  buffers on both sides, are not counted.

Figures are medians over ``--repeats`` runs.
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

from tce import api, client
from tce.core import dist
from tce.tools._netns import Nodes
from tce.tools._server import LocalServer
from tce.tools._workload import gpt_state_dict


_RECEIVER = r"""
import mmap, os, socket, sys, time
size, port = int(sys.argv[1]), int(sys.argv[2])
fd = os.memfd_create("floor-rx")
os.ftruncate(fd, size)
buf = mmap.mmap(fd, size)
view = memoryview(buf)
buf[:: mmap.PAGESIZE]  # fault in, like a pre-faulted cache buffer
for i in range(0, size, mmap.PAGESIZE):
    buf[i] = 0
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[3], port))
srv.listen(1)
print("ready", flush=True)
while True:
    conn, _ = srv.accept()
    if conn.recv(1) != b"g":  # not the sender's start byte: not a run of ours
        conn.close()
        continue
    got = 0
    while got < size:
        n = conn.recv_into(view[got:], size - got, socket.MSG_WAITALL)
        if n == 0:
            break
        got += n
    conn.sendall(b"k")
    conn.close()
    if got == 0:
        break
"""

_SENDER = r"""
import os, socket, sys, time
size, host, port, repeats = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
fd = os.memfd_create("floor-tx")
os.ftruncate(fd, size)
os.pwrite(fd, os.urandom(1 << 20) * (size >> 20) + b"x" * (size & ((1 << 20) - 1)), 0)
times = []
for _ in range(repeats):
    s = socket.create_connection((host, port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0 = time.perf_counter()
    s.send(b"g")
    off = 0
    while off < size:
        off += os.sendfile(s.fileno(), fd, off, size - off)
    assert s.recv(1) == b"k"
    times.append(time.perf_counter() - t0)
    s.close()
print(" ".join(str(t) for t in times), flush=True)
"""


def _floor(nodes, size: int, repeats: int) -> list[float]:
    port = 7600
    rx = subprocess.Popen([*nodes.exec_prefix(1), sys.executable, "-c", _RECEIVER, str(size), str(port),
                           nodes.addresses[1]], stdout=subprocess.PIPE, text=True)
    try:
        assert rx.stdout.readline().strip() == "ready"
        out = subprocess.run([*nodes.exec_prefix(0), sys.executable, "-c", _SENDER, str(size),
                              nodes.addresses[1], str(port), str(repeats)],
                             capture_output=True, text=True, check=True, timeout=600)
        return [float(t) for t in out.stdout.split()]
    finally:
        rx.kill()
        rx.wait()


def _tce_backup(nodes, size: int, repeats: int, transport: str, streams: int) -> list[float]:
    work = tempfile.mkdtemp(prefix="tce-ringbench-")
    budget = f"{(4 * size + (256 << 20)) >> 20}MiB"
    servers = []
    try:
        for i in range(2):
            d = os.path.join(work, f"n{i}")
            os.makedirs(d)
            servers.append(LocalServer(
                socket_path=os.path.join(d, "tce.sock"), memory_budget=budget, netns=nodes.names[i],
                extra_args=["--peer-listen", f"{nodes.addresses[i]}:7070", "--peer-token", "bench",
                            "--ring-transport", transport, "--ofi-provider", _OFI_PROVIDER,
                            "--ring-streams", str(streams),
                            "--metadata-url", "none",
                            "--log-level", "warning"]).start())
        endpoints = [f"{a}:7070" for a in nodes.addresses]
        for i, s in enumerate(servers):
            with client.session(s.socket):
                dist.set_ring("ring-bench", i, endpoints)
        sd = gpt_state_dict(size)
        times = []
        with client.override(socket=servers[0].socket, job="ring-bench", on_unavailable="raise"):
            for _ in range(repeats + 2):  # the first two create the buffers (held + incoming)
                api.save(sd, "/ckpt/ring-bench/model.pt", tag="bench")
                t0 = time.perf_counter()
                while True:
                    (f,) = client.files("ring-bench")
                    if f.backup_holder:
                        break
                    if time.perf_counter() - t0 > 600:
                        raise TimeoutError("the backup did not complete in 600 s")
                    time.sleep(0.005)  # polling faster steals CPU from the transfer
                times.append(time.perf_counter() - t0)
            api.close()
        return times[2:]
    finally:
        for s in servers:
            s.stop()
            s.cleanup()


# What is measured: (key, transport, streams). The tcp transport stripes
# each file over `ring_streams` connections; one stream shows what striping adds.
RUNS = [("tcp1", "tcp", 1), ("tcp4", "tcp", 4), ("ofi", "ofi", 1)]


def run(size: int, repeats: int, runs=RUNS) -> dict[str, Any]:
    if os.geteuid() != 0:
        raise SystemExit("tce bench --ring needs root (it creates network namespaces)")
    nodes = Nodes(2)
    try:
        res: dict[str, Any] = {"bytes": size, "repeats": repeats}
        # The floor before and after TCE's runs: the link's speed drifts on a
        # shared machine, and the median of both halves is the fairer floor.
        floor = _floor(nodes, size, (repeats + 1) // 2)
        for t, transport, streams in runs:
            times = _tce_backup(nodes, size, repeats, transport, streams)
            res[f"{t}_s"] = statistics.median(times)
            res[f"{t}_gbps"] = size / res[f"{t}_s"] / 1e9
        floor += _floor(nodes, size, repeats // 2 + 1)
        res["floor_s"] = statistics.median(floor)
        res["floor_gbps"] = size / res["floor_s"] / 1e9
        for t, _, _ in runs:
            res[f"{t}_vs_floor"] = res["floor_s"] / res[f"{t}_s"]
        res["ofi_provider"] = _OFI_PROVIDER
        return res
    finally:
        nodes.close()


def render(res: dict[str, Any]) -> str:
    mib = res["bytes"] / 2**20
    lines = [f"ring backup between two network namespaces (veth), {mib:.0f} MiB, "
             f"median of {res['repeats']}",
             f"{'':52s} {'seconds':>8s} {'GB/s':>7s} {'of floor':>9s}",
             f"{'plain TCP stream (sendfile -> recv, floor)':52s} {res['floor_s']:8.3f} "
             f"{res['floor_gbps']:7.2f} {'100%':>9s}"]
    for key in res:
        if key.endswith("_vs_floor"):
            t = key[: -len("_vs_floor")]
            label = {"tcp1": "tcp, 1 stream", "tcp4": "tcp, 4 streams"}.get(
                t, f"ofi/{res.get('ofi_provider', '')}")
            lines.append(f"{'TCE backup, ' + label + ' (commit -> verified copy)':52s} {res[t + '_s']:8.3f} "
                         f"{res[t + '_gbps']:7.2f} {100 * res[key]:8.0f}%")
    return "\n".join(lines)


# The libfabric provider of the ofi run: the namespaces are joined by veth,
# so only the tcp provider reaches across (set TCE_OFI_PROVIDER on a fabric).
_OFI_PROVIDER = os.environ.get("TCE_OFI_PROVIDER", "tcp")


def main(size: int, repeats: int, as_json: bool) -> int:
    res = run(size, repeats)
    print(json.dumps(res, indent=2) if as_json else render(res))
    return 0
