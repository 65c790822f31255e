"""Prefetches of a cooperative restore (docs/ring.md) are shared fairly
between the uids that own the jobs, and what they cannot read costs the
log a few lines, however much a user asks for. Real servers in a ring, real
users (tests/as_user.py), storage paced by a real FUSE filesystem
(tce.tools._pacedfs)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from helpers import call_on, until
from tce import _service, api, client
from tce.tools._ports import free_port
from tce.tools._server import LocalServer
from test_cooperative_restore import Cluster
from test_security_local import Node, _peer_endpoint, users  # noqa: F401  (users: a fixture)


@pytest.mark.multinode
def test_a_prefetch_of_thousands_of_missing_files_logs_a_few_lines(tmp_path, nodes2):
    """A prefetch naming 2000 files in 2000 directories that do not exist
    (a job probing, or a user flooding the log): the server logs a few
    lines (the next one allowed says how many were suppressed), where it
    logged one or two per path; a prefetch queued after it still runs."""
    store = tmp_path / "store"
    (store / "real").mkdir(parents=True)
    real = store / "real" / "model.pt"
    real.write_bytes(b"R" * 4096)  # a one-file directory: node 0 is its plan's node
    cluster = Cluster(tmp_path, nodes2, store)
    try:
        missing = [str(store / f"gone{i}" / "model.pt") for i in range(2000)]
        assert cluster.call(0, lambda: client.prefetch(paths=missing)) is True
        assert cluster.call(0, lambda: client.prefetch(paths=[str(real)])) is True
        # A uid's prefetches run in turn: the second one's read ends the first.
        until(lambda: f"fetched job={cluster.job} path={real} " in cluster.servers[0].log(),
              what="the prefetch after the flood")
        log = cluster.servers[0].log().splitlines()
        noisy = [ln for ln in log if "gone" in ln]
        assert 0 < len(noisy) <= 20, f"{len(noisy)} lines, e.g. {noisy[:3]}"
        assert any(" could not be read (the first: " in ln for ln in noisy), noisy
    finally:
        cluster.close()


@pytest.mark.security
def test_one_uids_large_prefetch_does_not_hold_up_another_uids(users, tmp_path):  # noqa: F811
    """Storage paced at 1 MiB/s. User a prefetches a directory of eight
    1 MiB files (four of them this node's share), then user b one 1 MiB
    file. The uids take turns a file at a time: b's file is in the cache
    while a's prefetch is still reading, not after it."""
    base = tempfile.mkdtemp(prefix="tce-prefetch-")
    os.chmod(base, 0o755)
    backing, mount = os.path.join(base, "backing"), os.path.join(base, "ckpt")
    for key in ("a", "b"):
        os.makedirs(os.path.join(backing, key), mode=0o700)
        os.chown(os.path.join(backing, key), users[key], -1)
    for i in range(8):
        _owned(os.path.join(backing, "a", f"shard{i}.bin"), users["a"], bytes([i]) * (1 << 20))
    _owned(os.path.join(backing, "b", "model.bin"), users["b"], b"B" * (1 << 20))
    from tce.tools._pacedfs import PacedMount

    peer = ["--peer-listen", "127.0.0.1:0", "--peer-token", "t", "--peer-timeout-ms", "5000"]
    nodes: list[Node] = []
    with PacedMount(backing, mount, rate=1 << 20, burst=4096):
        try:
            nodes = [Node(users, extra_args=peer, ckpt=mount) for _ in range(2)]
            ring = [_peer_endpoint(n) for n in nodes]
            for key, job in (("a", "ja"), ("b", "jb")):
                for i, node in enumerate(nodes):
                    r = node.run(key, f"""
s = Session(SOCK)
result["ring"] = s.call("SetRing", pb.SetRingRequest(session=s.id, job={job!r}, node_rank={i},
                                                     endpoints={ring!r}))[0]
""")
                    assert r["ring"] == "OK", r
            a = nodes[0]
            for key, job in (("a", "ja"), ("b", "jb")):
                r = a.run(key, f"""
s = Session(SOCK)
result["queued"] = s.call("Prefetch", pb.PrefetchRequest(session=s.id, job={job!r},
                                                         dir={os.path.join(mount, key)!r}))[2].queued
""")
                assert r["queued"] is True, r
            until(lambda: "fetched job=jb " in a.server.log(), what="b's file", timeout=60)
            log = a.server.log()
            assert "for job=ja in" not in log, "a's prefetch ended first: b's waited for it"
            assert log.count("fetched job=ja ") < 4, log
            until(lambda: "for job=ja in" in a.server.log(), what="a's prefetch", timeout=60)
            assert a.server.log().count("fetched job=ja ") == 4
        finally:
            for n in nodes:
                n.close()
    shutil.rmtree(base, ignore_errors=True)


def _owned(path: str, uid: int, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
    os.chown(path, uid, -1)
    os.chmod(path, 0o600)


def test_a_memory_only_server_queues_no_prefetch_and_warns_of_nothing(tmp_path):
    """A server with no storage root reads nothing from storage: the
    prefetch DeepSpeed's engine asks for at each resume (a tag's directory)
    is not queued, nor one naming files, and nothing is logged as wrong."""
    server = LocalServer(memory_budget="64MiB", socket_path=str(tmp_path / "tce.sock"),
                         extra_args=["--peer-listen", f"127.0.0.1:{free_port()}", "--peer-token", "t"]).start()
    try:
        job = "memory-only"
        endpoint = call_on(server.socket, job, api.status)["peer_endpoint"]
        other = f"127.0.0.1:{free_port()}"  # a ring of two: prefetches need one
        call_on(server.socket, job, lambda: _service.client().set_ring(job, 0, [endpoint, other]))
        tag_dir = str(tmp_path / "ckpt" / "global_step1")
        assert call_on(server.socket, job, lambda: client.prefetch(tag_dir, job=job)) is False
        assert call_on(server.socket, job,
                       lambda: client.prefetch(paths=[os.path.join(tag_dir, "model.pt")], job=job)) is False
        assert "prefetch" not in server.log(), server.log()
    finally:
        server.stop()
