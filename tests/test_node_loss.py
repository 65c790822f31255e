"""A node lost in a multi-node DeepSpeed job, end to end.

Three "nodes" (network namespaces on a bridge, tce.tools._netns), one
memory-only `tce-server` per node in a ring, one training rank per node
launched as torchrun launches it (NODE_RANK / GROUP_RANK, gloo over the
namespace addresses), "checkpoint_engine": "tce". A first run trains, saves
twice and is SIGKILLed on every node; it is also the uninterrupted reference
(tests/ds_train.py dumps its state at every save and at the end). Then node
1's server is SIGKILLed and a replacement with empty memory takes its place;
the job restarts on every node and must resume bit for bit; then node 0, where
rank 0 recorded the complete tags, and the tags come back from the ring with
its files. Then nodes 1 and 2 are lost together: without storage the load raises naming the files that
are gone; with storage it resumes from storage and says so. Last, node 1
loses its ring link before the newest save and then dies: the newest tag's
copy never left it, and the job resumes from the tag before.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from tce import _service, api
from tce.core import _knobs
from tce.tools._netns import Nodes
from tce.tools._server import LocalServer
from test_deepspeed import Run, _same_state

pytestmark = [pytest.mark.multinode, pytest.mark.deepspeed, pytest.mark.slow]

TOKEN = "node-loss-token"
JOB = "gpt-nodes"
SAVE_AT, STEPS, RESUME_AT = (2, 4), 6, 4


class Cluster:
    """One tce-server per node, each on its namespace's address, port 7070."""

    def __init__(self, tmp_path, nodes: Nodes, storage=None) -> None:
        self.tmp_path, self.nodes, self.storage = tmp_path, nodes, storage
        self.started = 0
        self.retired: list[LocalServer] = []
        self.servers = [self._start(i) for i in range(len(nodes.names))]

    def _start(self, i: int) -> LocalServer:
        self.started += 1
        d = self.tmp_path / f"server{self.started}-node{i}"
        d.mkdir()
        args = ["--peer-listen", f"{self.nodes.addresses[i]}:7070", "--peer-token", TOKEN,
                "--peer-timeout-ms", "5000", "--metadata-url", "none"]
        return LocalServer(memory_budget="512MiB", socket_path=str(d / "tce.sock"), extra_args=args,
                           storage_roots=[str(self.storage)] if self.storage else [],
                           netns=self.nodes.names[i]).start()

    def lose(self, *nodes: int) -> None:
        """SIGKILL the nodes' servers (memory gone), then start replacements."""
        self.kill(*nodes)
        self.replace(*nodes)

    def kill(self, *nodes: int) -> None:
        for i in nodes:
            self.servers[i].kill()
            self.retired.append(self.servers[i])

    def replace(self, *nodes: int) -> None:
        for i in nodes:
            self.servers[i] = self._start(i)

    @property
    def sockets(self) -> list[str]:
        return [s.socket for s in self.servers]

    def files(self, i: int) -> list:
        with _knobs.override(socket=self.servers[i].socket):
            try:
                return _service.client().list(JOB)
            finally:
                api.close()

    def wait_backed_up(self, timeout: float = 60) -> None:
        """Every node's files have a copy at the next node."""
        deadline = time.monotonic() + timeout
        while not all(self.files(i) and all(f.backup_holder for f in self.files(i))
                      for i in range(len(self.servers))):
            assert time.monotonic() < deadline, "the backups did not complete"
            time.sleep(0.2)

    def wait_held_tags(self, i: int, n: int, timeout: float = 60) -> None:
        """Node i holds n complete tags of its predecessor's."""
        deadline = time.monotonic() + timeout
        while True:
            with _knobs.override(socket=self.servers[i].socket):
                held = int(api.status()["held_tags"])
                api.close()
            if held == n:
                return
            assert time.monotonic() < deadline, f"node {i} holds {held} tags, not {n}"
            time.sleep(0.2)

    def close(self) -> None:
        for s in self.servers:
            s.stop()
        for s in self.servers + self.retired:
            s.cleanup()

    def log(self, i: int) -> str:
        return self.servers[i].log()


def _run(cluster: Cluster, stage: int, ckpt, out, extra: list[str], *, ready: bool = False) -> Run:
    return Run(3, ["--stage", str(stage), "--ckpt", str(ckpt), "--steps", str(STEPS), *extra],
               out=out, job=JOB, ready=ready, nodes=cluster.nodes, sockets=cluster.sockets)


def _assert_resumed(reference: list[dict], resumed: list[dict], at: int = RESUME_AT) -> None:
    """Parameters and optimizer state at the load (of the tag saved at step
    ``at``), the next steps' losses and the final state equal the
    uninterrupted run's, bit for bit."""
    for rank, (a, b) in enumerate(zip(reference, resumed)):
        assert f"/global_step{at}/" in b["loaded_path"], b["loaded_path"]
        _same_state(a["saved"][at], b["at_load"], f"rank {rank} at the load:")
        for step in range(at + 1, STEPS + 1):
            assert a["losses"][step] == b["losses"][step], f"rank {rank} step {step} loss"
        _same_state(a["final"], b["final"], f"rank {rank} at the end:")


def _first_run(cluster: Cluster, stage: int, ckpt, tmp_path, extra=(), save_at=SAVE_AT) -> list[dict]:
    """Trains, saves at ``save_at``, then every rank is SIGKILLed (the node
    failure takes the job down). Returns its dumps: the reference."""
    run = _run(cluster, stage, ckpt, tmp_path / "first",
               ["--save-at", ",".join(map(str, save_at)), *extra], ready=True)
    reference = run.wait()
    cluster.wait_backed_up()
    return reference


def test_zero2_resumes_from_the_ring_after_losing_a_node(tmp_path, nodes3):
    """ZeRO-2, no storage at all: the model file lives only in node 0's cache
    (and its copy at node 1), every optimizer shard in its own node's. Node
    1 is lost, then node 0 (with the tags rank 0 recorded), then nodes 1 and
    2 together."""
    ckpt = tmp_path / "ckpt"
    cluster = Cluster(tmp_path, nodes3)
    try:
        reference = _first_run(cluster, 2, ckpt, tmp_path)
        assert not list(ckpt.glob("global_step*/*.pt"))  # nothing on disk: memory only

        cluster.lose(1)
        resumed = _run(cluster, 2, ckpt, tmp_path / "resumed", ["--load"]).wait()
        _assert_resumed(reference, resumed)
        assert [r["loads"]["storage"] for r in resumed] == [0, 0, 0]
        assert "recovered 2 of 2 file(s) of job=" + JOB in cluster.log(1)  # rank 1's two files
        log = cluster.log(1)  # the newest checkpoint came back first
        assert log.index("global_step4/zero_pp_rank_1_") < log.index("global_step2/zero_pp_rank_1_"), log

        # Node 0, where rank 0 recorded the complete tags: they come back
        # from node 1 (node 1's replacement was sent them again) with node
        # 0's files, and DeepSpeed's discovery finds every tag again.
        cluster.wait_backed_up()
        cluster.wait_held_tags(1, 2)
        cluster.lose(0)
        resumed = _run(cluster, 2, ckpt, tmp_path / "resumed-node0", ["--load"]).wait()
        _assert_resumed(reference, resumed)
        assert [r["loads"]["storage"] for r in resumed] == [0, 0, 0]
        assert "recovered 2 complete tag(s) of job=" + JOB in cluster.log(0), cluster.log(0)

        # Nodes 1 and 2 together: node 1's copies died with node 2.
        cluster.lose(1, 2)
        failed = _run(cluster, 2, ckpt, tmp_path / "lost", ["--load"])
        failed.wait(fails=True)
        logs = failed.logs()
        assert "TCEError: no recoverable checkpoint in " + str(ckpt) in logs, logs  # no code prefix
        assert "zero_pp_rank_1_mp_rank_00_optim_states.pt" in logs, logs  # names what is missing
    finally:
        cluster.close()


def test_zero3_resumes_from_the_ring_then_from_storage(tmp_path, nodes3):
    """ZeRO-3 with storage: losing node 1 resumes from the ring (nothing is
    read from storage); losing nodes 1 and 2 resumes from storage, and the
    log says which files came from there."""
    storage = tmp_path / "storage"
    storage.mkdir()
    ckpt = storage / "ckpt"
    cluster = Cluster(tmp_path, nodes3, storage=storage)
    try:
        reference = _first_run(cluster, 3, ckpt, tmp_path, ["--wait-persisted"])

        cluster.lose(1)
        resumed = _run(cluster, 3, ckpt, tmp_path / "resumed", ["--load"]).wait()
        _assert_resumed(reference, resumed)
        assert [r["loads"]["storage"] for r in resumed] == [0, 0, 0]

        cluster.lose(1, 2)
        run = _run(cluster, 3, ckpt, tmp_path / "from-storage", ["--load"])
        from_storage = run.wait()
        _assert_resumed(reference, from_storage)
        # Rank 1's files are in no node's memory: the servers read them from
        # storage once (the restore plan's node for each, docs/ring.md) and
        # rank 1 loads them through its node's cache, reading nothing itself.
        # (prefetched, or asked for by the load).
        assert from_storage[1]["loads"]["storage"] == 0
        assert sum(from_storage[1]["split"].values()) > 0, from_storage[1]["split"]
        servers = "".join(cluster.log(i) for i in range(3))
        assert f"fetched job={JOB} path={ckpt}/global_step{RESUME_AT}/zero_pp_rank_1_" in servers, servers
        assert from_storage[2]["loads"]["storage"] == 0  # node 2's files came back from node 0
        assert "MiB read from storage by this node's server" in run.logs()
        assert f"[TCE] tag 'global_step{RESUME_AT}': " in run.logs(), run.logs()
        assert "load from storage: " + str(ckpt / f"global_step{RESUME_AT}" / "zero_pp_rank_1_") in run.logs()
    finally:
        cluster.close()


def _iptables(nodes: Nodes, i: int, op: str, rule: list[str]) -> None:
    subprocess.run([*nodes.exec_prefix(i), "iptables", op, *rule], check=True, capture_output=True,
                   timeout=30)


def test_zero2_falls_back_to_the_newest_tag_the_ring_still_holds(tmp_path, nodes3):
    """ZeRO-2, no storage. global_step2 is backed up around the ring; then
    node 1's link to its successor is cut (the ring port only: gloo goes
    on), so its shard of global_step4 stays in its memory alone, and node 1
    dies. 'latest' names global_step4; load_checkpoint warns, naming the
    shard that is gone, and every rank loads global_step2 from the ring."""
    if shutil.which("iptables") is None:
        pytest.skip("needs iptables (make setup installs it)")
    ckpt = tmp_path / "ckpt"
    cluster = Cluster(tmp_path, nodes3)
    block = ["OUTPUT", "-p", "tcp", "-d", nodes3.addresses[2], "--dport", "7070",
             "-j", "REJECT", "--reject-with", "tcp-reset"]
    try:
        # Saves at 2 only, trains on to STEPS: the reference from step 2 on.
        reference = _first_run(cluster, 2, ckpt, tmp_path, save_at=(2,))

        _iptables(nodes3, 1, "-A", block)  # gone with the namespace at the end
        second = _run(cluster, 2, ckpt, tmp_path / "second", ["--load", "--save-at", "4"], ready=True).wait()
        assert all("/global_step2/" in r["loaded_path"] for r in second)
        assert (ckpt / "latest").read_text() == "global_step4"
        shard = str(ckpt / "global_step4" / "zero_pp_rank_1_mp_rank_00_optim_states.pt")
        peer = f"{nodes3.addresses[2]}:7070"
        deadline = time.monotonic() + 60  # nodes 0 and 2 back step 4 up; node 1 tries and fails
        while not (all(f.backup_holder for i in (0, 2) for f in cluster.files(i))
                   and f"backup of {shard} with {peer} failed" in cluster.log(1)):
            assert time.monotonic() < deadline, cluster.log(1)
            time.sleep(0.2)
        node1 = {f.path: f.backup_holder for f in cluster.files(1)}
        assert node1[shard] == "", node1  # the copy never left node 1
        assert node1[shard.replace("global_step4", "global_step2")] == peer, node1

        cluster.kill(1)
        _iptables(nodes3, 1, "-D", block)  # the rule outlives the server: the replacement needs the link
        cluster.replace(1)
        run = _run(cluster, 2, ckpt, tmp_path / "resumed", ["--load"])
        resumed = run.wait()
        _assert_resumed(reference, resumed, at=2)
        assert [r["loads"]["storage"] for r in resumed] == [0, 0, 0]
        assert "recovered 1 of 1 file(s) of job=" + JOB in cluster.log(1)  # step 2's shard only
        logs = "\n".join(p.read_text() for p in run.log_paths)
        assert (f"'latest' in {ckpt} names 'global_step4', whose files are lost (not cached and not "
                f"on storage: {shard}); loading 'global_step2', the newest recoverable tag") in logs, logs
    finally:
        cluster.close()
