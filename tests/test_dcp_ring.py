"""tce.dcp across nodes: a resharded load reads the ranges it plans from
another node's file through the ring, and only those ranges.

Two "nodes" (network namespaces, tce.tools._netns), one memory-only
`tce-server` per node in a ring, ranks launched as torchrun would (NODE_RANK,
gloo over the namespace addresses; see dcp_job.py). Four ranks save (two per
node); two or three ranks load. Without storage, every byte loaded came from
a node's memory: this node's cache ("local") or another node's file as the
ring keeps it ("peer": the copy held here, or the other node's cache).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import tce
from tce import _service, api
from tce.core import _knobs
from tce.tools._netns import Nodes
from tce.tools._server import LocalServer

pytestmark = [pytest.mark.multinode, pytest.mark.slow]

JOB_SCRIPT = os.path.join(os.path.dirname(__file__), "dcp_job.py")
TOKEN = "dcp-ring-token"
JOB = "dcp-ring"


class Cluster:
    """One memory-only tce-server per node, on the node's address, port 7070."""

    def __init__(self, tmp_path, nodes: Nodes, budgets: list[list[str]]) -> None:
        self.tmp_path, self.nodes, self.budgets = tmp_path, nodes, budgets
        self.started = 0
        self.servers = [self._start(i) for i in range(len(nodes.names))]

    def _start(self, i: int) -> LocalServer:
        self.started += 1
        d = self.tmp_path / f"server{self.started}-node{i}"
        d.mkdir()
        budget, *extra = self.budgets[i]
        args = ["--peer-listen", f"{self.nodes.addresses[i]}:7070", "--peer-token", TOKEN,
                "--peer-timeout-ms", "5000", "--metadata-url", "none", *extra]
        return LocalServer(memory_budget=budget, socket_path=str(d / "tce.sock"), extra_args=args,
                           netns=self.nodes.names[i]).start()

    def lose(self, i: int) -> None:
        """SIGKILL node i's server (its memory is gone), then start an empty one."""
        self.servers[i].kill()
        self.servers[i] = self._start(i)

    def call(self, i: int, fn):
        with _knobs.override(socket=self.servers[i].socket):
            try:
                return fn(_service.client())
            finally:
                api.close()

    def files(self, i: int) -> list:
        return self.call(i, lambda c: c.list(JOB))

    def status(self, i: int):
        return self.call(i, lambda c: c.status())

    def wait_backed_up(self, nodes: list[int], timeout: float = 60) -> None:
        """The nodes' files have a copy at the next node."""
        deadline = time.monotonic() + timeout
        while not all(self.files(i) and all(f.backup_holder for f in self.files(i)) for i in nodes):
            assert time.monotonic() < deadline, "the backups did not complete"
            time.sleep(0.2)

    def close(self) -> None:
        tce.close()
        for s in self.servers:
            s.kill()
            s.cleanup()


def run(cluster: Cluster, placement: list[int], action: str, path: str,
        timeout: float = 240) -> list[str]:
    """dcp_job.py ACTION PATH with rank r on node placement[r]; each rank's stdout."""
    nodes = cluster.nodes
    per_node = {n: placement.count(n) for n in set(placement)}
    procs = []
    for rank, node in enumerate(placement):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(len(placement)),
                   LOCAL_RANK=str(placement[:rank].count(node)), LOCAL_WORLD_SIZE=str(per_node[node]),
                   NODE_RANK=str(node), GROUP_RANK=str(node), MASTER_ADDR=nodes.addresses[0],
                   MASTER_PORT="29533", TCE_SOCKET=cluster.servers[node].socket, TCE_JOB=JOB,
                   TCE_ON_UNAVAILABLE="raise", TCE_TEST_RING="1", TCE_TEST_BIG="1",
                   GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([*nodes.exec_prefix(node), sys.executable, JOB_SCRIPT,
                                       action, path], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for rank, (p, (out, err)) in enumerate(zip(procs, outs)):
        logs = "\n".join(s.log()[-3000:] for s in cluster.servers)
        assert p.returncode == 0, f"rank {rank} exited {p.returncode}\n{out}\n{err[-4000:]}\n{logs}"
    return [out for out, _ in outs]


def sources(out: str) -> dict[str, int]:
    line = next(l for l in out.splitlines() if l.startswith("SOURCES "))
    return json.loads(line[len("SOURCES "):])


def data_files(cluster: Cluster, i: int) -> dict[str, int]:
    return {os.path.basename(f.path): f.size for f in cluster.files(i)
            if f.path.endswith(".distcp")}


@pytest.mark.parametrize("placement", [[0, 1], [0, 0, 1]], ids=["2ranks", "3ranks"])
def test_resharded_load_reads_ranges_from_the_peer(tmp_path, nodes2, placement):
    # Node 0's backup share (1% of 16 MiB) is smaller than one of node 1's
    # files: it holds no copy, so what it needs of them comes over the ring
    # from node 1's cache. Node 1 holds node 0's files and reads those copies.
    cluster = Cluster(tmp_path, nodes2, [["16MiB", "--backup-share", "1"], ["512MiB"]])
    try:
        ckpt = str(tmp_path / "ckpt" / "step1")
        run(cluster, [0, 0, 1, 1], "save", ckpt)
        cluster.wait_backed_up([0])
        assert cluster.status(0).held_backups == 0
        remote = data_files(cluster, 1)
        assert sorted(remote) == ["__2_0.distcp", "__3_0.distcp"]

        outs = run(cluster, placement, "load", ckpt)  # every tensor checked by each rank
        for out in outs:
            assert set(sources(out)) <= {"local", "peer"}, out
        assert any("peer" in sources(out) for out in outs)
        st0, st1 = cluster.status(0), cluster.status(1)
        # Node 0 read ranges of node 1's files over the ring, never a whole file.
        assert st0.range_reads_peer > 0
        assert 0 < st0.range_peer_bytes < sum(remote.values()), (st0.range_peer_bytes, remote)
        assert st0.remote_reads == 0  # no whole-file fetch through the ring
        assert st1.range_reads_held > 0  # node 1 read node 0's files from the copies it holds
        assert st1.range_peer_bytes == 0
    finally:
        cluster.close()


def test_after_losing_a_node_the_load_reads_its_successors_copy(tmp_path, nodes2):
    cluster = Cluster(tmp_path, nodes2, [["512MiB"], ["512MiB"]])
    try:
        ckpt = str(tmp_path / "ckpt" / "step1")
        run(cluster, [0, 0, 1, 1], "save", ckpt)
        cluster.wait_backed_up([0, 1])
        cluster.lose(1)  # node 1's files survive only as node 0's copies

        outs = run(cluster, [0, 1], "load", ckpt)  # every tensor checked by each rank
        for out in outs:
            assert set(sources(out)) <= {"local", "peer"}, out
        st1 = cluster.status(1)
        # The replacement got node 1's files back from node 0's copies ...
        assert st1.recovered_files >= 2, st1
        assert sorted(data_files(cluster, 1)) == ["__2_0.distcp", "__3_0.distcp"]
        # ... and read what it needed of node 0's files as ranges (of the
        # copies node 0 sent it again, or over the ring from node 0's cache).
        assert "peer" in sources(outs[1]), outs[1]
        assert st1.range_reads_held + st1.range_reads_peer > 0, st1
    finally:
        cluster.close()
