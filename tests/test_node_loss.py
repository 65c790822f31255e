"""A node lost in a multi-node DeepSpeed job, end to end.

Three "nodes" (network namespaces on a bridge, tce.tools._netns), one
memory-only `tce-server` per node in a ring, one training rank per node
launched as torchrun launches it (NODE_RANK / GROUP_RANK, gloo over the
namespace addresses), "checkpoint_engine": "tce". A first run trains, saves
twice and is SIGKILLed on every node; it is also the uninterrupted reference
(tests/ds_train.py dumps its state at every save and at the end). Then node
1's server is SIGKILLed and a replacement with empty memory takes its place;
the job restarts on every node and must resume bit for bit. Then nodes 1 and
2 are lost together: without storage the load raises naming the files that
are gone; with storage it resumes from storage and says so.
"""

from __future__ import annotations

import os
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
        for i in nodes:
            self.servers[i].kill()
            self.retired.append(self.servers[i])
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


def _assert_resumed(reference: list[dict], resumed: list[dict]) -> None:
    """Parameters and optimizer state at the load, the next steps' losses and
    the final state equal the uninterrupted run's, bit for bit."""
    for rank, (a, b) in enumerate(zip(reference, resumed)):
        assert f"/global_step{RESUME_AT}/" in b["loaded_path"], b["loaded_path"]
        _same_state(a["saved"][RESUME_AT], b["at_load"], f"rank {rank} at the load:")
        for step in range(RESUME_AT + 1, STEPS + 1):
            assert a["losses"][step] == b["losses"][step], f"rank {rank} step {step} loss"
        _same_state(a["final"], b["final"], f"rank {rank} at the end:")


def _first_run(cluster: Cluster, stage: int, ckpt, tmp_path, extra=()) -> list[dict]:
    """Trains, saves at SAVE_AT, then every rank is SIGKILLed (the node
    failure takes the job down). Returns its dumps: the reference."""
    run = _run(cluster, stage, ckpt, tmp_path / "first",
               ["--save-at", ",".join(map(str, SAVE_AT)), *extra], ready=True)
    reference = run.wait()
    cluster.wait_backed_up()
    return reference


def test_zero2_resumes_from_the_ring_after_losing_a_node(tmp_path, nodes3):
    """ZeRO-2, no storage at all: the model file lives only in node 0's cache
    (and its copy at node 1), every optimizer shard in its own node's."""
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

        # Nodes 1 and 2 together: node 1's copies died with node 2.
        cluster.lose(1, 2)
        failed = _run(cluster, 2, ckpt, tmp_path / "lost", ["--load"])
        failed.wait(fails=True)
        logs = failed.logs()
        assert "no recoverable checkpoint in " + str(ckpt) in logs, logs
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
        assert from_storage[1]["loads"]["cache"] == 0 and from_storage[1]["loads"]["storage"] > 0
        assert from_storage[2]["loads"]["storage"] == 0  # node 2's files came back from node 0
        assert f"[TCE] tag 'global_step{RESUME_AT}': " in run.logs(), run.logs()
        assert "load from storage: " + str(ckpt / f"global_step{RESUME_AT}" / "zero_pp_rank_1_") in run.logs()
    finally:
        cluster.close()
