"""Cooperative restore (docs/ring.md): a job restarted on empty nodes reads
each byte of its checkpoint from storage once. Three "nodes" (network
namespaces, tce.tools._netns), a tce-server in each with one shared storage
root, in one job's ring; a DeepSpeed-like tag on storage that no server has
in memory: a model file every rank loads, and one shard per rank. Two rank
processes per node (tests/restore_rank.py) load what a ZeRO-2 restart loads.
The storage read counters of the servers (tce status: job_loads) prove the
one-read property; the ranks prove the bytes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid

import pytest
import torch

from tce import _service, api, client
from tce.tools._server import LocalServer
from tce.v1 import tce_pb2 as pb

from helpers import call_on, faulty_server_binary, state_digest, until, wait_metadata_written

pytestmark = [pytest.mark.multinode]

TOKEN = "restore-token"
RANK_SCRIPT = os.path.join(os.path.dirname(__file__), "restore_rank.py")


class Cluster:
    """A server per node on its node's address, storage root `store`, in
    the ring of job `job` (told by the test, as tce.join_ring would)."""

    def __init__(self, tmp_path, nodes, store, *, faulty: dict[int, str] | None = None, job: str = "",
                 join: bool = True, extra: list[str] | None = None, sqlite: bool = False) -> None:
        self.tmp_path, self.nodes, self.store = tmp_path, nodes, store
        self.sqlite = sqlite  # metadata in each server's state directory (kept across a restart)
        self.extra = ["--peer-timeout-ms", "5000", *(extra or [])]
        self.job = job or f"restore-{uuid.uuid4().hex[:8]}"
        self.started = 0
        self.servers = [self._start(i, (faulty or {}).get(i)) for i in range(len(nodes.names))]
        self.endpoints = [self.status(i)["peer_endpoint"] for i in range(len(self.servers))]
        for i in range(len(self.servers) if join else 0):
            self.call(i, lambda i=i: _service.client().set_ring(self.job, i, self.endpoints))
        self.ranks: list[subprocess.Popen] = []

    def replace(self, i: int) -> None:
        """Node i's server killed and started again, empty (the ranks join the ring)."""
        self.servers[i].kill()
        self.servers[i].cleanup()
        self.servers[i] = self._start(i, None)

    def _start(self, i: int, fault: str | None) -> LocalServer:
        self.started += 1
        state = self.tmp_path / f"server{self.started}-node{i}"
        state.mkdir()
        extra = ["--ring-fault", fault] if fault else []
        return LocalServer(
            memory_budget="256MiB", socket_path=str(state / "tce.sock"), netns=self.nodes.names[i],
            storage_roots=[str(self.store)], binary=faulty_server_binary() if fault else None,
            extra_args=["--peer-listen", f"{self.nodes.addresses[i]}:7070", "--peer-token", TOKEN,
                        *self.extra, "--metadata-url", f"sqlite://{state / 'tce.db'}" if self.sqlite else "none",
                        *extra]).start()

    def call(self, i: int, fn):
        return call_on(self.servers[i].socket, self.job, fn)

    def status(self, i: int) -> dict:
        return self.call(i, api.status)

    def storage_reads(self, i: int) -> int:
        """Bytes node i's server read from storage for this job."""
        return _job_storage_reads(self.servers[i].socket, self.job)

    def start_rank(self, i: int) -> subprocess.Popen:
        p = _start_rank(self.servers[i].socket, self.job)
        self.ranks.append(p)
        return p

    def close(self) -> None:
        for p in self.ranks:
            p.kill()
            p.wait()
        for s in self.servers:
            s.stop()
            s.cleanup()


def _start_rank(socket: str, job: str, *, rpc_timeout: float | None = None) -> subprocess.Popen:
    """A rank process (tests/restore_rank.py) connected to the server at `socket`."""
    env = {**os.environ, "TCE_SOCKET": socket, "TCE_JOB": job, "TCE_ON_UNAVAILABLE": "raise"}
    if rpc_timeout is not None:
        env["TCE_RPC_TIMEOUT"] = str(rpc_timeout)
    p = subprocess.Popen([sys.executable, RANK_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=env)
    assert p.stdout.readline().strip() == "ready"
    return p


def _ask(rank: subprocess.Popen, paths: list[str]) -> None:
    rank.stdin.write(json.dumps(paths) + "\n")
    rank.stdin.flush()


def _answer(rank: subprocess.Popen) -> dict:
    line = rank.stdout.readline()
    assert line, f"rank exited ({rank.wait()})"
    return json.loads(line)


def _write_tag(store, ranks: int) -> dict[str, str]:
    """A ZeRO-2-like tag on storage, written as plain torch.save would
    (never cached): path -> digest."""
    tag = store / "step7"
    tag.mkdir(parents=True)
    files = {str(tag / "mp_rank_00_model_states.pt"): {"w": torch.randn(1 << 20), "step": 7}}
    for r in range(ranks):
        files[str(tag / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")] = {"m": torch.randn(1 << 19) + r}
    for path, state in files.items():
        torch.save(state, path)
    return {path: state_digest(state) for path, state in files.items()}


def _unique_bytes(digests: dict[str, str]) -> int:
    return sum(os.path.getsize(p) for p in digests)


@pytest.fixture
def store(tmp_path):
    s = tmp_path / "store"
    s.mkdir()
    return s


def test_a_restart_on_empty_nodes_reads_each_byte_from_storage_once(tmp_path, nodes3, store):
    digests = _write_tag(store, ranks=6)
    model = next(p for p in digests if "model_states" in p)
    cluster = Cluster(tmp_path, nodes3, store)
    try:
        ranks = [cluster.start_rank(node) for node in range(3) for _ in range(2)]
        for r, rank in enumerate(ranks):  # every rank: the model file and its own shard, at once
            _ask(rank, [model, str(store / "step7" / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")])
        answers = [_answer(rank) for rank in ranks]
        for r, a in enumerate(answers):
            for path, digest in a["digests"].items():
                assert digest == digests[path], (r, path)
            # Every byte came through the node's server: none read storage itself.
            mine = os.path.getsize(model) + os.path.getsize(
                store / "step7" / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
            assert sum(a["loaded"].values()) == mine, a["loaded"]
        reads = [cluster.storage_reads(i) for i in range(3)]
        assert sum(reads) == _unique_bytes(digests), reads  # each byte from storage once
        assert all(reads), reads  # and the work was shared
        assert sum(int(a["loaded"].get("peer", 0)) for a in answers) > 0
        # The split is in tce status (per job) and in the metrics.
        st = cluster.status(0)
        assert any(j["job"] == cluster.job for j in st["job_loads"]), st["job_loads"]
        # What a node read from storage or pulled needs no backup: a
        # shutdown has nothing to wait for (with drain_timeout_ms = 0, a
        # file it waited for would be named as unfinished).
        for s in cluster.servers:
            s.stop()
            assert "drained: 0 file(s) unfinished" in s.log(), s.log()[-2000:]
    finally:
        cluster.close()


def test_a_prefetch_has_each_node_read_its_share_before_the_ranks_ask(tmp_path, nodes3, store):
    """tce.client.prefetch(the tag's directory) on every node, what the
    DeepSpeed engine calls before it loads: each server reads its share of
    the tag from storage at once, with no load asking; the loads that follow
    read nothing more from storage, every byte from a node's memory."""
    digests = _write_tag(store, ranks=6)
    unique = _unique_bytes(digests)
    model = next(p for p in digests if "model_states" in p)
    cluster = Cluster(tmp_path, nodes3, store)
    try:
        tag = str(store / "step7")
        for i in range(3):
            assert cluster.call(i, lambda: client.prefetch(tag)) is True
        until(lambda: sum(cluster.storage_reads(i) for i in range(3)) == unique, what="every share read")
        reads = [cluster.storage_reads(i) for i in range(3)]
        assert all(reads), reads  # each node read its share, once
        ranks = [cluster.start_rank(node) for node in range(3) for _ in range(2)]
        for r, rank in enumerate(ranks):
            _ask(rank, [model, str(store / "step7" / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")])
        for r, rank in enumerate(ranks):
            a = _answer(rank)
            assert all(digest == digests[path] for path, digest in a["digests"].items()), r
            assert set(a["loaded"]) <= {"cache", "peer"}, (r, a["loaded"])
        assert [cluster.storage_reads(i) for i in range(3)] == reads
        # With the tag in memory, a prefetch of it reads nothing.
        assert cluster.call(0, lambda: client.prefetch(tag)) is True
        until(lambda: cluster.servers[0].log().count(f"for job={cluster.job} in {tag}") == 2,
              what="the second prefetch")
        assert [cluster.storage_reads(i) for i in range(3)] == reads
    finally:
        cluster.close()


def test_a_ring_set_on_restarted_servers_prefetches_the_newest_tag_they_know(tmp_path, nodes2, store):
    """The job's servers restart (their memory empty, their metadata kept in
    SQLite beside them). Setting the job's ring again, as tce.join_ring does
    after a restart, has each server read its share of the newest complete
    tag it knows from storage at once, before any load: each byte once."""
    digests = _write_tag(store, ranks=2)
    cluster = Cluster(tmp_path, nodes2, store, sqlite=True)
    try:
        # A tag names files its job holds where it is recorded: each node
        # saves one small file of the tag's through TCE (of another tag, so
        # that the others count as other nodes' ranks).
        extra = [str(store / "step7" / f"extra_{i}.pt") for i in range(2)]
        for i in range(2):
            cluster.call(i, lambda i=i: (api.save({"n": torch.full((8,), float(i))}, extra[i]),
                                         api.wait([extra[i]])))
        unique = _unique_bytes(digests) + sum(os.path.getsize(p) for p in extra)
        files = [pb.TagFile(rank=r, path=p, size=os.path.getsize(p)) for r, p in enumerate(sorted(digests))]
        files += [pb.TagFile(rank=i, path=p, size=os.path.getsize(p)) for i, p in enumerate(extra)]
        old = [pb.TagFile(rank=i, path=p, size=os.path.getsize(p)) for i, p in enumerate(extra)]
        old.append(pb.TagFile(rank=0, path=str(store / "gone.pt"), size=1))  # an older tag: not read
        for i in range(2):
            def commit():
                c = _service.client()
                c.commit_tag(pb.TagInfo(job=cluster.job, tag="step6", world_size=2, files=old))
                c.commit_tag(pb.TagInfo(job=cluster.job, tag="step7", world_size=len(digests), files=files))
                wait_metadata_written()
            cluster.call(i, commit)
        for s in cluster.servers:  # all down before any starts: no node holds another's copies
            s.kill()
        for s in cluster.servers:
            s.start()
        assert sum(cluster.storage_reads(i) for i in range(2)) == 0
        for i in range(2):
            cluster.call(i, lambda i=i: _service.client().set_ring(cluster.job, i, cluster.endpoints))
        until(lambda: sum(cluster.storage_reads(i) for i in range(2)) == unique, what="the newest tag read")
        reads = [cluster.storage_reads(i) for i in range(2)]
        assert all(reads), reads  # each node its share
        assert not any("gone.pt" in s.log() for s in cluster.servers)  # the older tag: not asked for
        rank = cluster.start_rank(1)
        _ask(rank, sorted(digests))
        a = _answer(rank)
        assert a["digests"] == digests
        assert set(a["loaded"]) <= {"cache", "peer"}, a["loaded"]
        assert [cluster.storage_reads(i) for i in range(2)] == reads
    finally:
        cluster.close()


@pytest.mark.parametrize("cooperative", [True, False])
def test_the_ranks_of_one_node_share_one_read_of_each_file(tmp_path, store, cooperative):
    """One node, no ring: two ranks load the same files at once. Their
    server reads each file from storage once and both ranks map that copy
    (one found it read for it, the other in the cache). With
    cooperative_restore off, each rank reads storage itself."""
    digests = _write_tag(store, ranks=2)
    unique = _unique_bytes(digests)
    job = "one-node"
    server = LocalServer(memory_budget="256MiB", socket_path=str(tmp_path / "tce.sock"),
                         storage_roots=[str(store)],
                         extra_args=["--metadata-url", "none",
                                     "--cooperative-restore", "true" if cooperative else "false"]).start()
    ranks = []
    try:
        ranks = [_start_rank(server.socket, job) for _ in range(2)]
        for rank in ranks:
            _ask(rank, sorted(digests))
        answers = [_answer(rank) for rank in ranks]
        assert [a["digests"] for a in answers] == [digests, digests]
        if not cooperative:
            assert [a["loaded"] for a in answers] == [{}, {}]
            assert _job_storage_reads(server.socket, job) == 0
            return
        assert _job_storage_reads(server.socket, job) == unique
        for a in answers:  # every byte through the server
            assert sum(a["loaded"].values()) == unique, a["loaded"]
        assert sum(a["loaded"].get("storage", 0) for a in answers) == unique
        assert sum(a["loaded"].get("cache", 0) for a in answers) == unique
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()
        server.stop()
        server.cleanup()


def test_a_file_larger_than_the_cache_is_read_by_the_rank_and_evicts_nothing(tmp_path, store):
    """A load of a file the whole memory budget cannot hold is left to the
    rank (as torch.load reads it); what the cache holds stays."""
    import tce
    from tce import client
    from tce.core import _knobs

    big = str(store / "big.pt")
    torch.save({"w": torch.ones(6 << 20)}, big)  # 24 MiB, for a 16 MiB cache
    server = LocalServer(memory_budget="16MiB", socket_path=str(tmp_path / "tce.sock"),
                         storage_roots=[str(store)], extra_args=["--metadata-url", "none"]).start()
    try:
        with _knobs.override(socket=server.socket, job="small-cache", on_unavailable="raise"):
            small = store / "small.pt"
            tce.save({"s": torch.arange(1000)}, small)
            tce.wait([small])  # persisted: evictable
            assert torch.equal(tce.load(big, weights_only=True)["w"], torch.ones(6 << 20))
            assert client.loaded_bytes() == {}  # read by the rank itself
            assert tce.cached(small)
            assert "does not fit in the memory budget" in server.log()
            api.close()
    finally:
        server.stop()
        server.cleanup()


def test_an_owner_that_dies_mid_restore_has_its_share_read_by_another_node(tmp_path, nodes3, store):
    """Node 2's server dies after the model file was restored: the shards
    the plan gave it are read by nodes 0 and 1, once each."""
    digests = _write_tag(store, ranks=6)
    model = next(p for p in digests if "model_states" in p)
    shards = sorted(p for p in digests if p != model)
    cluster = Cluster(tmp_path, nodes3, store)
    try:
        ranks = [cluster.start_rank(node) for node in range(3)]
        for rank in ranks:
            _ask(rank, [model])
        for rank in ranks:
            assert _answer(rank)["digests"] == {model: digests[model]}
        before = [cluster.storage_reads(i) for i in range(3)]
        assert sum(before) == os.path.getsize(model)
        cluster.servers[2].kill()
        for rank, half in zip(ranks[:2], (shards[:3], shards[3:])):
            _ask(rank, half)
        for rank, half in zip(ranks[:2], (shards[:3], shards[3:])):
            got = _answer(rank)["digests"]
            assert got == {p: digests[p] for p in half}
        after = [cluster.storage_reads(i) for i in range(2)]
        assert sum(after) - sum(before[:2]) == sum(os.path.getsize(p) for p in shards), (before, after)
        assert "did not answer for job=" + cluster.job in cluster.servers[0].log() + cluster.servers[1].log()
    finally:
        cluster.servers[2].cleanup()
        cluster.servers = cluster.servers[:2]
        cluster.close()


def test_a_reader_that_dies_costs_one_more_read_not_one_per_node(tmp_path, nodes3, store):
    """One file: node 0 is its plan's node. Node 1 asks first and reads it,
    then its server dies. Node 2, told node 1 reads it, finds node 1 dead
    and reads the file itself; node 0's own load then finds it in node 2's
    memory instead of reading storage a third time."""
    d = store / "step3"
    d.mkdir()
    path = str(d / "mp_rank_00_model_states.pt")
    state = {"w": torch.randn(1 << 18)}
    torch.save(state, path)
    size = os.path.getsize(path)
    cluster = Cluster(tmp_path, nodes3, store)
    try:
        ranks = [cluster.start_rank(node) for node in range(3)]
        _ask(ranks[1], [path])
        assert _answer(ranks[1])["digests"] == {path: state_digest(state)}
        assert cluster.storage_reads(1) == size
        cluster.servers[1].kill()
        loaded = {}
        for node in (2, 0):
            _ask(ranks[node], [path])
            a = _answer(ranks[node])
            assert a["digests"] == {path: state_digest(state)}, a
            loaded[node] = a["loaded"]
        assert [cluster.storage_reads(0), cluster.storage_reads(2)] == [0, size]
        assert loaded == {2: {"storage": size}, 0: {"peer": size}}, loaded
    finally:
        cluster.servers[1].cleanup()
        cluster.servers = [cluster.servers[0], cluster.servers[2]]
        cluster.close()


def test_a_corrupt_transfer_is_refused_and_read_again_from_storage(tmp_path, nodes2, store):
    """Node 1's transport corrupts everything it sends (the test build's
    fault). A rank on node 1 loads the tag first (node 1 reads each file
    from storage); then a rank on node 0: each copy node 1 sends fails node
    0's CRC check, and node 0 reads that file from storage itself. Every load
    is bitwise the saved one."""
    digests = _write_tag(store, ranks=4)
    cluster = Cluster(tmp_path, nodes2, store, faulty={1: "corrupt"})
    try:
        first = cluster.start_rank(1)
        _ask(first, sorted(digests))
        assert _answer(first)["digests"] == digests
        assert cluster.storage_reads(1) == _unique_bytes(digests)
        rank = cluster.start_rank(0)
        _ask(rank, sorted(digests))
        a = _answer(rank)
        assert a["digests"] == digests
        assert "peer" not in a["loaded"], a["loaded"]  # nothing corrupt was taken
        assert cluster.storage_reads(0) == _unique_bytes(digests)
        assert "corrupt" in cluster.status(0)["backup_error"]
    finally:
        cluster.close()


def test_a_file_storage_cannot_give_fails_alone_with_its_path(tmp_path, nodes2, store):
    """A shard missing from storage fails that load alone, naming the path;
    the others load, each read once."""
    digests = _write_tag(store, ranks=2)
    gone = sorted(digests)[-1]
    os.unlink(gone)
    cluster = Cluster(tmp_path, nodes2, store)
    try:
        ranks = [cluster.start_rank(0), cluster.start_rank(1)]
        ok = [p for p in sorted(digests) if p != gone]
        for rank in ranks:
            _ask(rank, [gone])
        for rank in ranks:
            err = _answer(rank)["error"]
            assert err.startswith("FileNotFoundError") and gone in err, err
        _ask(ranks[0], ok)
        assert _answer(ranks[0])["digests"] == {p: digests[p] for p in ok}
        assert cluster.storage_reads(0) + cluster.storage_reads(1) == sum(os.path.getsize(p) for p in ok)
    finally:
        cluster.close()


def _job_storage_reads(socket: str, job: str) -> int:
    """Bytes the server at `socket` read from storage for `job`."""
    st = call_on(socket, job, lambda: _service.client().status())
    return sum(j.storage_bytes for j in st.job_loads if j.job == job)


def _dir_bytes(d) -> int:
    return sum(f.stat().st_size for f in d.iterdir() if f.is_file())


@pytest.mark.deepspeed
@pytest.mark.slow
def test_deepspeed_zero2_resumes_on_three_empty_nodes_reading_each_byte_once(tmp_path, nodes3, store):
    """ZeRO-2 saved to storage; then every node's server is replaced (empty
    caches, as on a new allocation). The resumed job is bitwise the one
    that saved, no rank read storage itself, and the servers together read
    each byte of the tag once (the model file every rank loads included)."""
    from test_node_loss import JOB, RESUME_AT, Cluster as DsCluster, _assert_resumed, _first_run, _run

    ckpt = store / "ckpt"
    cluster = DsCluster(tmp_path, nodes3, storage=store)
    try:
        reference = _first_run(cluster, 2, ckpt, tmp_path, ["--wait-persisted"])
        cluster.lose(0, 1, 2)
        run = _run(cluster, 2, ckpt, tmp_path / "resumed", ["--load"])
        resumed = run.wait()
        _assert_resumed(reference, resumed)
        assert [r["loads"]["storage"] for r in resumed] == [0, 0, 0]
        reads = [_job_storage_reads(s, JOB) for s in cluster.sockets]
        assert sum(reads) == _dir_bytes(ckpt / f"global_step{RESUME_AT}"), reads
        logs = "\n".join(p.read_text() for p in run.log_paths)  # one line per rank's load
        assert logs.count(f"[TCE] loaded tag global_step{RESUME_AT}: ") == 3, logs
        assert logs.count("0.0 MiB read from storage by this rank") == 3, logs
    finally:
        cluster.close()


@pytest.mark.slow
def test_dcp_replicated_items_are_read_from_storage_once_on_empty_nodes(tmp_path, nodes2, store):
    """A DCP checkpoint (sharded and replicated tensors) saved to storage by
    four ranks on two nodes; both servers replaced. Four ranks load it: their
    ranged reads come from the memory of the node that read each file, and
    the servers read each byte of the checkpoint once."""
    from test_dcp_ring import JOB, run, sources

    cluster = Cluster(tmp_path, nodes2, store, job=JOB, join=False)
    try:
        ckpt = store / "ckpt" / "step1"
        os.environ["TCE_TEST_DURABLE"] = "1"
        try:
            run(cluster, [0, 0, 1, 1], "save", str(ckpt))
        finally:
            del os.environ["TCE_TEST_DURABLE"]
        for i in range(2):
            cluster.replace(i)
        outs = run(cluster, [0, 0, 1, 1], "load", str(ckpt))  # every tensor checked by each rank
        assert all(sources(out) for out in outs)
        reads = [cluster.storage_reads(i) for i in range(2)]
        assert sum(reads) == _dir_bytes(ckpt), reads
    finally:
        cluster.close()


def test_an_asker_waits_out_a_storage_read_longer_than_the_peer_timeout(tmp_path, nodes2):
    """Storage paced so one file takes about 2 s to read, the peer timeout
    500 ms: node 1 reads the file for its rank; node 0's rank asks while
    that read is under way and waits for it (node 1 says it is at storage
    within each timeout) instead of taking node 1 for dead. The file is
    read from storage once."""
    from tce.tools._pacedfs import PacedMount
    from helpers import until

    backing = tmp_path / "backing"
    (backing / "step1").mkdir(parents=True)
    state = {"w": torch.randn(1 << 19)}  # 2 MiB
    path_in = backing / "step1" / "model.pt"
    torch.save(state, path_in)
    size = os.path.getsize(path_in)
    with PacedMount(str(backing), str(tmp_path / "store"), rate=size / 2, burst=4096) as mount:
        store = tmp_path / "store"
        cluster = Cluster(tmp_path, nodes2, store, extra=["--peer-timeout-ms", "500"])
        try:
            path = str(store / "step1" / "model.pt")
            first, second = cluster.start_rank(1), cluster.start_rank(0)
            _ask(first, [path])
            until(lambda: mount.stats()["bytes_read"] > 0, what="node 1's read to begin")
            _ask(second, [path])
            for rank in (first, second):
                assert _answer(rank)["digests"] == {path: state_digest(state)}
            assert mount.stats()["bytes_read"] == size
            assert cluster.storage_reads(0) == 0 and cluster.storage_reads(1) == size
        finally:
            cluster.close()


def _single_file_dirs(store, n: int) -> dict[str, str]:
    """n directories holding one file each: the restore plan of each names
    node 0 (a directory's one file goes to its first live node). path -> digest."""
    out = {}
    for i in range(n):
        d = store / f"d{i}"
        d.mkdir()
        state = {"w": torch.randn(1 << 16) + i}
        torch.save(state, d / "model.pt")
        out[str(d / "model.pt")] = state_digest(state)
    return out


def _stopped(server: LocalServer) -> None:
    """SIGSTOP: the server hangs, its sockets open (not dead)."""
    os.kill(server.proc.pid, signal.SIGSTOP)
    until(lambda: open(f"/proc/{server.proc.pid}/stat").read().split(") ")[1][0] == "T",
          what="the server to stop")


def test_a_claimer_that_hangs_costs_one_timeout_and_its_claims_go(tmp_path, nodes3, store):
    """Node 2 loads three files first: node 0, the plan's node of each,
    records node 2's claims, and node 2 reads them. Then node 2's server
    hangs (SIGSTOP). A rank on node 1 loads the three files: it waits for
    node 2 once (one peer timeout), marks it down for the job, tells node 0,
    which drops node 2's claims, and reads the files from storage itself;
    no later load waits for node 2 again."""
    digests = _single_file_dirs(store, 3)
    cluster = Cluster(tmp_path, nodes3, store, extra=["--peer-timeout-ms", "2000"])
    hung = cluster.endpoints[2]
    try:
        claimer = cluster.start_rank(2)
        _ask(claimer, sorted(digests))
        assert _answer(claimer)["digests"] == digests
        assert cluster.storage_reads(2) == _unique_bytes(digests)
        _stopped(cluster.servers[2])
        rank = cluster.start_rank(1)
        _ask(rank, sorted(digests))
        a = _answer(rank)
        assert a["digests"] == digests
        assert a["loaded"] == {"storage": _unique_bytes(digests)}, a["loaded"]
        log = cluster.servers[1].log()
        waits = [ln for ln in log.splitlines()
                 if hung in ln and ("too slow to authenticate" in ln or "said nothing for" in ln)]
        assert len(waits) == 1, waits  # one timeout, then node 2 is asked nothing
        assert log.count(f"{hung} did not answer for job={cluster.job}") == 1, log
        assert f"dropped 3 claim(s) of {hung} on files of job={cluster.job}" in cluster.servers[0].log()
        assert cluster.storage_reads(0) == 0
    finally:
        os.kill(cluster.servers[2].proc.pid, signal.SIGCONT)
        cluster.close()


def test_a_load_waiting_on_a_hung_node_answers_by_its_callers_deadline(tmp_path, nodes3, store):
    """The peer timeout is a minute, the rank's RPC deadline 4 s: a load on
    node 1 that must wait for node 2 (hung, SIGSTOP) gets the server's
    DEADLINE_EXCEEDED naming node 2 before its own deadline passes, not its
    own timeout."""
    digests = _single_file_dirs(store, 1)
    cluster = Cluster(tmp_path, nodes3, store, extra=["--peer-timeout-ms", "60000"])
    hung = cluster.endpoints[2]
    try:
        claimer = cluster.start_rank(2)
        _ask(claimer, sorted(digests))
        assert _answer(claimer)["digests"] == digests
        _stopped(cluster.servers[2])
        rank = _start_rank(cluster.servers[1].socket, cluster.job, rpc_timeout=4)
        cluster.ranks.append(rank)
        _ask(rank, sorted(digests))
        err = _answer(rank)["error"]
        assert err.startswith("DeadlineExceededError"), err
        assert f"waited for {hung}" in err and "until the caller's deadline" in err, err
    finally:
        os.kill(cluster.servers[2].proc.pid, signal.SIGCONT)
        cluster.close()


def test_ranged_reads_ask_a_hung_node_once(tmp_path, nodes3, store):
    """Node 2 loads two files (node 0 records its claims, as their plan's
    node); then node 2's server hangs (SIGSTOP). Ranged reads on node 0 of
    both files wait for node 2 once: it is marked down, its claims dropped,
    and node 0 reads the files from storage itself."""
    digests = _single_file_dirs(store, 2)
    cluster = Cluster(tmp_path, nodes3, store, extra=["--peer-timeout-ms", "2000"])
    hung = cluster.endpoints[2]
    try:
        claimer = cluster.start_rank(2)
        _ask(claimer, sorted(digests))
        assert _answer(claimer)["digests"] == digests
        _stopped(cluster.servers[2])
        for path in sorted(digests):
            got = cluster.call(0, lambda path=path: _service.with_client(
                lambda c: c.read_range(cluster.job, path, 0, 64)))
            with open(path, "rb") as f:
                assert got.data == f.read(64)
        log = cluster.servers[0].log()
        waits = [ln for ln in log.splitlines()
                 if hung in ln and ("too slow to authenticate" in ln or "said nothing for" in ln)]
        assert len(waits) == 1, waits
        assert cluster.storage_reads(0) == _unique_bytes(digests)
    finally:
        os.kill(cluster.servers[2].proc.pid, signal.SIGCONT)
        cluster.close()
