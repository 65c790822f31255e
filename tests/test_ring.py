"""The ring: each server backs up what it caches to the next node's server.

Loopback tests run two servers side by side; the multinode tests give every
"node" its own network namespace (veth pairs on a bridge the test creates),
so the servers talk only over their namespace addresses.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
import torch

import tce
from tce import _service, api
from tce.core import _knobs
from tce.tools._netns import Nodes
from tce.tools._server import LocalServer
from tce.core._client import Client
from tce.errors import CacheFullError, DeadlineExceededError, FailedPreconditionError, InvalidArgumentError
from tce.v1 import tce_pb2 as pb

from helpers import faulty_server_binary, until, wait_metadata_written
from tce.tools._ports import free_port

TOKEN = "ring-test-token"


@pytest.fixture(params=["tcp", pytest.param("ofi", marks=pytest.mark.rdma)])
def transport(request):
    """Every ring test runs over both transports: ofi through libfabric's tcp
    provider, the same RMA code path a verbs or efa fabric takes (marked
    rdma: a server built without libfabric skips it)."""
    return request.param


def _ring_server(tmp_path, transport, name, *, token=TOKEN, listen="127.0.0.1:0", netns=None,
                 budget="512MiB", storage=None, extra=(), metadata=False, binary=None):
    state = tmp_path / name
    state.mkdir(exist_ok=True)
    args = ["--peer-listen", listen, "--peer-token", token, "--peer-timeout-ms", "2000",
            "--ring-transport", transport, "--ofi-provider", "tcp",
            *(["--state-dir", str(state)] if metadata else ["--metadata-url", "none"]), *extra]
    return LocalServer(memory_budget=budget, socket_path=str(state / "tce.sock"),
                       storage_roots=[str(storage)] if storage else [], extra_args=args,
                       netns=netns, binary=binary).start()


def _node_server(tmp_path, transport, nodes, i, name, **kw):
    """Node i's ring server: in its namespace, on its address, port 7070."""
    return _ring_server(tmp_path, transport, name, netns=nodes.names[i],
                        listen=f"{nodes.addresses[i]}:7070", **kw)


def _status(server) -> dict:
    with _knobs.override(socket=server.socket):
        st = api.status()
        api.close()
    return st


def _set_ring(servers, job="ring-job"):
    endpoints = [_status(s)["peer_endpoint"] for s in servers]
    for rank, s in enumerate(servers):
        with _knobs.override(socket=s.socket):
            _service.client().set_ring(job, rank, endpoints)
            api.close()
    return endpoints


def _files(server, job="ring-job") -> dict:
    with _knobs.override(socket=server.socket):
        out = {f.path: f for f in _service.client().list(job)}
        api.close()
    return out


def _stop(*servers):
    for s in servers:
        code = s.stop()
        # pytest shows this only for a failed test: what each server did.
        events = [ln for ln in s.log().splitlines() if " session: " not in ln]
        print(f"--- {s.socket} (exit {code}), last events:", *events[-80:], sep="\n")
        s.cleanup()
        assert code == 0, s.log()


def test_backup_reaches_the_successor_and_is_dropped_on_eviction(tmp_path, transport):
    storage = tmp_path / "storage"
    storage.mkdir()
    a = _ring_server(tmp_path, transport, "a", storage=storage, extra=["--keep-last", "1"])
    b = _ring_server(tmp_path, transport, "b")
    try:
        endpoints = _set_ring([a, b])
        obj = {"w": torch.randn(1 << 20), "step": 1}
        with _knobs.override(socket=a.socket, job="ring-job", on_unavailable="raise"):
            tce.save(obj, storage / "step1.pt", tag="step1")
            api.close()
        f = until(lambda: _files(a)[str(storage / "step1.pt")].backup_holder and
                  _files(a)[str(storage / "step1.pt")], what="the backup")
        assert f.backup_holder == endpoints[1]
        assert pb.FileState.Name(f.state) in ("FILE_STATE_BACKED_UP", "FILE_STATE_PERSISTED")
        held = _status(b)
        assert int(held["held_backups"]) == 1 and int(held["held_backup_bytes"]) == f.size
        assert int(_status(a)["backed_up_files"]) == 1
        # a newer tag evicts step1 once persisted (keep_last 1): its copy goes too
        with _knobs.override(socket=a.socket, job="ring-job", on_unavailable="raise"):
            tce.save(obj, storage / "step2.pt", tag="step2")
            tce.wait()
            api.close()
        until(lambda: _files(a)[str(storage / "step1.pt")].state == pb.FILE_STATE_EVICTED,
              what="eviction")
        until(lambda: int(_status(b)["held_backups"]) == 1 and
              int(_status(b)["held_backup_bytes"]) == _files(a)[str(storage / "step2.pt")].size,
              what="the successor to hold only step2")
    finally:
        _stop(a, b)


def _backups_failing_metric(server) -> int:
    endpoint = _status(server)["metrics_endpoint"]
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as r:
        text = r.read().decode()
    return int(re.search(r"^tce_backup_consecutive_failures (\d+)$", text, re.M).group(1))


def test_a_peer_without_the_token_is_refused(tmp_path, transport):
    """Refused on both sides; backups that keep failing say so (an error in
    the log, a metric, tce status) until one goes through."""
    a = _ring_server(tmp_path, transport, "a", extra=["--metrics-listen", "127.0.0.1:0"])
    b = _ring_server(tmp_path, transport, "b", token="another-token")
    good = None
    try:
        _set_ring([a, b])
        with _knobs.override(socket=a.socket, job="ring-job", on_unavailable="raise"):
            tce.save({"w": torch.ones(1000)}, "/ckpt/r/x.pt", tag="t")  # saves never wait for the ring
            api.close()
        st = until(lambda: int(_status(a)["backup_failures"]) >= 1 and _status(a), what="a failure")
        assert "refused our proof: it does not know our cluster token" in st["backup_error"], st["backup_error"]
        assert int(_status(b)["held_backups"]) == 0
        assert "does not know the cluster token" in b.log()  # refused and logged on both sides
        assert int(st["backup_queue"]) >= 0 and _files(a)["/ckpt/r/x.pt"].backup_holder == ""
        until(lambda: int(_status(a)["backup_failing"]) >= 3, what="three failures in a row")
        assert _backups_failing_metric(a) >= 3
        until(lambda: "ERROR ring: ring backups have failed" in a.log(), what="the error line")
        assert "files cached here have no copy on the next node" in a.log()
        out = subprocess.run([sys.executable, "-m", "tce.cli", "--socket", a.socket, "status"],
                             capture_output=True, text=True, timeout=60)
        assert "BACKUPS FAILING: " in out.stdout, out.stdout + out.stderr
        # A successor that knows the token: the next attempt goes through.
        good = _ring_server(tmp_path, transport, "good")
        _set_ring([a, good])
        until(lambda: _files(a)["/ckpt/r/x.pt"].backup_holder, what="the backup")
        # The replicator records the copy (FinishBackup) before it counts
        # the attempt a success (NoteRingAttempt), each under its own lock.
        until(lambda: int(_status(a)["backup_failing"]) == 0, what="the run of failures to end")
        assert _backups_failing_metric(a) == 0
        assert a.log().count("ERROR ring: ring backups have failed") == 1  # at most once a minute
    finally:
        _stop(a, b, *([good] if good else []))


def test_ring_settings_are_checked(tmp_path, make_server, transport):
    plain = make_server("64MiB")
    with _knobs.override(socket=plain.socket):
        with pytest.raises(FailedPreconditionError, match="takes part in no ring"):
            _service.client().set_ring("j", 0, ["10.0.0.1:7000"])
        api.close()
    a = _ring_server(tmp_path, transport, "a")
    try:
        me = _status(a)["peer_endpoint"]
        with _knobs.override(socket=a.socket):
            c = _service.client()
            with pytest.raises(InvalidArgumentError, match="node_rank 2 is outside the 2-node ring"):
                c.set_ring("j", 2, ["h:1", "h:2"])
            with pytest.raises(InvalidArgumentError, match="must be host:port, got 'nohost'"):
                c.set_ring("j", 0, ["nohost"])
            assert c.set_ring("j", 0, ["h:1"]) == ""  # one node: no ring, nothing to wait for
            with pytest.raises(InvalidArgumentError, match=f"endpoints\\[0\\] is h:1, but this server is {me}"):
                c.set_ring("j", 0, ["h:1", me])  # it would make this server someone else's node 0
            assert c.set_ring("j", 1, ["h:1", me]) == "h:1"
            api.close()
        p = subprocess.run([*a.args[:1], "--peer-listen", "127.0.0.1:0", "--socket",
                            str(tmp_path / "x.sock")], capture_output=True, text=True)
        assert p.returncode == 2 and "needs a cluster token" in p.stderr
        base = [*a.args[:1], "--peer-listen", "127.0.0.1:0", "--peer-token", "t", "--metadata-url", "none",
                "--socket", str(tmp_path / "x.sock")]
        p = subprocess.run([*base, "--ring-transport", "rdma"], capture_output=True, text=True)
        assert p.returncode == 2 and "ring_transport" in p.stderr and "tcp or ofi" in p.stderr, p.stderr
        p = subprocess.run([*base, "--ring-transport", "ofi", "--ofi-provider", "tcp"], capture_output=True,
                           text=True, env=dict(os.environ, TCE_RDMA_DEVICES="=no_such_hca"), timeout=30)
        assert p.returncode == 2, p.stderr
        assert "ring_transport ofi: no fabric device matches '=no_such_hca' (devices: " in p.stderr, p.stderr
    finally:
        _stop(a)


# ---- several nodes, one network namespace each (tce.tools._netns) ----

@pytest.mark.multinode
def test_three_nodes_back_up_around_the_ring(tmp_path, nodes3, transport):
    servers = [_ring_server(tmp_path, transport, f"n{i}", netns=name, listen=f"{addr}:7070")
               for i, (name, addr) in enumerate(zip(nodes3.names, nodes3.addresses))]
    try:
        endpoints = _set_ring(servers)
        assert endpoints == [f"{a}:7070" for a in nodes3.addresses]
        for i, s in enumerate(servers):
            with _knobs.override(socket=s.socket, job="ring-job", on_unavailable="raise"):
                tce.save({"w": torch.full((1 << 18,), float(i))}, f"/ckpt/step1/rank{i}.pt",
                         tag="step1", rank=i)
                api.close()
        for i, s in enumerate(servers):
            f = until(lambda: _files(s)[f"/ckpt/step1/rank{i}.pt"].backup_holder and
                      _files(s)[f"/ckpt/step1/rank{i}.pt"], what=f"node {i}'s backup")
            assert f.backup_holder == endpoints[(i + 1) % 3]
            assert pb.FileState.Name(f.state) == "FILE_STATE_BACKED_UP"
        for s in servers:  # each holds exactly its predecessor's file
            assert int(_status(s)["held_backups"]) == 1
    finally:
        _stop(*servers)


@pytest.mark.multinode
def test_a_cut_link_delays_the_backup_but_no_save(tmp_path, nodes3, transport):
    servers = [_ring_server(tmp_path, transport, f"n{i}", netns=name, listen=f"{addr}:7070")
               for i, (name, addr) in enumerate(zip(nodes3.names[:2], nodes3.addresses[:2]))]
    try:
        _set_ring(servers)
        nodes3.cut(1)  # node 1 unreachable
        with _knobs.override(socket=servers[0].socket, job="ring-job", on_unavailable="raise"):
            for step in range(3):
                tce.save({"w": torch.full((1 << 20,), float(step))}, f"/ckpt/s{step}.pt", tag=f"s{step}")
            api.close()
        # The saves returned while no backup could be made: none waited for the ring.
        files = _files(servers[0])
        assert len(files) == 3 and not any(f.backup_holder for f in files.values()), files
        st = until(lambda: int(_status(servers[0])["backup_failures"]) >= 1 and _status(servers[0]),
                   what="a failed attempt")
        assert int(st["backup_queue"]) >= 1 and int(st["backup_lag_bytes"]) > 0  # the lag shows
        nodes3.restore(1)
        until(lambda: all(f.backup_holder for f in _files(servers[0]).values()), timeout=60,
              what="the backups after the link came back")
        assert int(_status(servers[1])["held_backups"]) == 3
        assert int(_status(servers[0])["backup_queue"]) == 0
    finally:
        _stop(*servers)


@pytest.mark.multinode
def test_a_replaced_node_gets_its_files_back_from_the_ring(tmp_path, nodes3, transport):
    """Node 1 loses its server and memory: a fresh server there, told the
    ring again (as the restarted job does), pulls node 1's files back from
    node 2, bitwise, and node 0 backs its files up to node 1 again. There is
    no storage at all: the ring is the only other copy."""
    servers = [_ring_server(tmp_path, transport, f"n{i}", netns=name, listen=f"{addr}:7070")
               for i, (name, addr) in enumerate(zip(nodes3.names, nodes3.addresses))]
    try:
        endpoints = _set_ring(servers)
        saved = {}
        for i, s in enumerate(servers):
            saved[i] = {"w": torch.randn(1 << 18), "b": torch.arange(1000, dtype=torch.int16), "node": i}
            with _knobs.override(socket=s.socket, job="ring-job", on_unavailable="raise"):
                for part in range(2):
                    tce.save(saved[i], f"/ckpt/step1/rank{i}-{part}.pt", tag="step1", rank=i)
                api.close()
        for s in servers:
            until(lambda: all(f.backup_holder for f in _files(s).values()), what="backups")
        servers[1].kill()  # the node is gone, memory and all
        fresh = _ring_server(tmp_path, transport, "n1-again", netns=nodes3.names[1], listen=f"{nodes3.addresses[1]}:7070")
        servers[1] = fresh
        assert _files(fresh) == {}
        _set_ring(servers)  # the restarted job tells every server the ring again
        got = until(lambda: len(_files(fresh)) == 2 and _files(fresh), what="the recovery")
        for part in range(2):
            f = got[f"/ckpt/step1/rank1-{part}.pt"]
            assert pb.FileState.Name(f.state) == "FILE_STATE_BACKED_UP" and f.backup_holder == endpoints[2]
        with _knobs.override(socket=fresh.socket, job="ring-job", on_unavailable="raise"):
            out = tce.load("/ckpt/step1/rank1-1.pt", weights_only=True)  # no file on disk: the ring's copy
            assert out["node"] == 1 and torch.equal(out["w"], saved[1]["w"]) and torch.equal(out["b"], saved[1]["b"])
            api.close()
        # node 0's copies, lost with node 1's memory, are sent again
        until(lambda: int(_status(fresh)["held_backups"]) == 2, what="node 0's files re-sent")
        assert all(f.backup_holder == endpoints[1] for f in _files(servers[0]).values())
    finally:
        _stop(*servers)


@pytest.mark.multinode
def test_a_replaced_node_gets_its_complete_tags_back_from_the_ring(tmp_path, nodes3, transport):
    """Node 0 recorded the job's complete tags (rank 0 reports them to its
    own server) and is lost, memory and all. Its successor held the tags,
    and the fresh server, told the ring, lists them again with their
    completion times: a list that waits for the restore sees them."""
    start = functools.partial(_node_server, tmp_path, transport, nodes3)

    servers = [start(i, f"n{i}") for i in range(3)]
    try:
        endpoints = _set_ring(servers)
        recorded = []
        with _knobs.override(socket=servers[0].socket, job="ring-job", on_unavailable="raise"):
            for step in (1, 2):
                tce.save({"w": torch.full((10,), float(step))}, f"/ckpt/s{step}/rank0.pt",
                         tag=f"s{step}", rank=0)
                # rank 0's file as saved here; rank 1's is another node's (a recovered
                # tag must agree with this node's files, and cannot check the others')
                size0 = _service.client().lookup("ring-job", f"/ckpt/s{step}/rank0.pt").size
                files = [pb.TagFile(rank=0, path=f"/ckpt/s{step}/rank0.pt", size=size0),
                         pb.TagFile(rank=1, path=f"/ckpt/s{step}/rank1.pt", size=101)]
                recorded.append(_service.client().commit_tag(
                    pb.TagInfo(job="ring-job", tag=f"s{step}", world_size=2, files=files)))
            api.close()
        until(lambda: int(_status(servers[1])["held_tags"]) == 2, what="the tags held at node 1")
        assert int(_status(servers[2])["held_tags"]) == 0  # the successor only
        # The files too: a tag, a few bytes, may reach node 1 before them.
        until(lambda: (lambda fs: len(fs) == 2 and all(f.backup_holder for f in fs))(_files(servers[0]).values()),
              what="node 0's backups")

        servers[0].kill()
        servers[0] = start(0, "n0-again")
        _set_ring_on(servers[0], 0, endpoints)
        with _knobs.override(socket=servers[0].socket):
            got = _service.client().list_tags("ring-job", wait_for_restore=True)
            api.close()
        assert got == recorded  # names, completion times, files and sizes
        assert "recovered 2 complete tag(s) of job=ring-job from " + endpoints[1] in servers[0].log()
        assert "/ckpt/s2/rank0.pt" in _files(servers[0])  # and the files came back with them
    finally:
        _stop(*servers)


@pytest.mark.multinode
def test_a_restarted_server_rejoins_its_ring_from_metadata(tmp_path, nodes3, transport):
    """Node 1's server dies (SIGKILL, memory gone) and comes back on the same
    endpoint with its metadata. Nobody tells it the ring: it finds the ring in
    metadata, pulls its files back from node 2 bitwise (there is no storage),
    and node 0 backs up to it again."""
    servers = [_ring_server(tmp_path, transport, f"n{i}", netns=name, listen=f"{addr}:7070", metadata=True)
               for i, (name, addr) in enumerate(zip(nodes3.names, nodes3.addresses))]
    try:
        endpoints = _set_ring(servers)
        x = {"w": torch.randn(1 << 18), "i": torch.arange(77)}
        with _knobs.override(socket=servers[1].socket, job="ring-job", on_unavailable="raise"):
            tce.save(x, "/ckpt/step7/rank1.pt", tag="step7", rank=1)
            api.close()
        with _knobs.override(socket=servers[0].socket, job="ring-job", on_unavailable="raise"):
            tce.save({"n": 0}, "/ckpt/step7/rank0.pt", tag="step7", rank=0)
            api.close()
        for s in servers[:2]:
            until(lambda: all(f.backup_holder for f in _files(s).values()), what="backups")
        with _knobs.override(socket=servers[1].socket):
            wait_metadata_written()
            api.close()
        servers[1].kill()
        servers[1] = _ring_server(tmp_path, transport, "n1", netns=nodes3.names[1],
                                  listen=f"{nodes3.addresses[1]}:7070", metadata=True)
        f = until(lambda: _files(servers[1]).get("/ckpt/step7/rank1.pt"), what="the recovery")
        f = until(lambda: pb.FileState.Name(_files(servers[1])["/ckpt/step7/rank1.pt"].state)
                  == "FILE_STATE_BACKED_UP" and _files(servers[1])["/ckpt/step7/rank1.pt"], what="BACKED_UP")
        assert f.backup_holder == endpoints[2]
        assert "rejoining the ring of job=ring-job recorded in metadata" in servers[1].log()
        with _knobs.override(socket=servers[1].socket, job="ring-job", on_unavailable="raise"):
            out = tce.load("/ckpt/step7/rank1.pt", weights_only=True)
            assert torch.equal(out["w"], x["w"]) and torch.equal(out["i"], x["i"])
            assert int(tce.status()["recovered_files"]) == 1
            api.close()
        until(lambda: int(_status(servers[1])["held_backups"]) == 1, what="node 0's file re-sent")
    finally:
        _stop(*servers)


def _set_ring_on(server, rank, endpoints, job="ring-job"):
    with _knobs.override(socket=server.socket):
        _service.client().set_ring(job, rank, endpoints)
        api.close()


def _list_restored(server, job="ring-job"):
    with _knobs.override(socket=server.socket):
        try:
            return {f.path: f for f in _service.client().list(job, wait_for_restore=True)}
        finally:
            api.close()


@pytest.mark.multinode
def test_a_list_waits_for_the_ring_restore_in_flight(tmp_path, nodes3, transport):
    """A replaced node cannot reach its successor yet: a list that asks to
    wait for the restore fails after ring_restore_wait_ms, naming what it
    waited for; with the default it waits, and sees the files as soon as the
    link is back and they are."""

    def start(name, *extra):
        return _ring_server(tmp_path, transport, name, netns=nodes3.names[1],
                            listen=f"{nodes3.addresses[1]}:7070", extra=list(extra))

    servers = [_ring_server(tmp_path, transport, f"n{i}", netns=name, listen=f"{addr}:7070")
               for i, (name, addr) in enumerate(zip(nodes3.names, nodes3.addresses))]
    try:
        endpoints = _set_ring(servers)
        with _knobs.override(socket=servers[1].socket, job="ring-job", on_unavailable="raise"):
            for part in range(2):
                tce.save({"w": torch.randn(1 << 16)}, f"/ckpt/s1/rank1-{part}.pt", tag="s1", rank=1)
            api.close()
        until(lambda: all(f.backup_holder for f in _files(servers[1]).values()), what="backups")
        servers[1].kill()
        nodes3.cut(2)  # the successor is out of reach: the restore cannot end
        servers[1] = start("n1-impatient", "--ring-restore-wait-ms", "200")
        _set_ring_on(servers[1], 1, endpoints)
        with pytest.raises(DeadlineExceededError, match="ring restore of job ring-job: node 1's files are "
                           f"still being pulled back from {endpoints[2]}"):
            _list_restored(servers[1])
        servers[1].kill()
        # The default wait (two minutes) outlasts a client's rpc_timeout: the
        # server answers before the client's deadline, naming the restore.
        servers[1] = start("n1-deadline")
        _set_ring_on(servers[1], 1, endpoints)
        with _knobs.override(socket=servers[1].socket, job="ring-job", rpc_timeout=3.0):
            t0 = time.monotonic()
            with pytest.raises(DeadlineExceededError, match="the caller's deadline, before "
                               "ring_restore_wait_ms\\) for the ring restore of job ring-job"):
                tce.load("/ckpt/s1/rank1-0.pt", weights_only=True)
            # It waited, answering half a second before the 3 s deadline.
            assert time.monotonic() - t0 >= 2.0
            api.close()
        servers[1].kill()
        # One call may wait on a peer at a time: while the list waits for the
        # restore, holding that place, a second such call is refused.
        servers[1] = start("n1-again", "--max-peer-calls", "1")
        _set_ring_on(servers[1], 1, endpoints)
        result = {}

        def wait_for_the_list():
            while True:
                try:
                    return result.update(got=_list_restored(servers[1]))
                except CacheFullError:  # the probe below held the place a moment: again
                    continue

        waiter = threading.Thread(target=wait_for_the_list)
        waiter.start()
        probe = Client(servers[1].socket, rpc_timeout=60)

        def refused() -> bool:
            try:  # a deadline already past: answered at once when the place is free
                probe._call("List", pb.ListRequest(session=probe.session, job="ring-job", wait_for_restore=True),
                            timeout=0.1)
            except CacheFullError as e:
                assert "calls that wait on a peer" in str(e), e
                return True
            except DeadlineExceededError:
                pass
            return False

        until(refused, timeout=60, what="the list to wait for the restore")
        probe.close()
        assert waiter.is_alive() and not result  # waiting for the restore, not answering without it
        nodes3.restore(2)
        waiter.join(timeout=60)
        assert sorted(result["got"]) == ["/ckpt/s1/rank1-0.pt", "/ckpt/s1/rank1-1.pt"], result
    finally:
        _stop(*servers)


@pytest.mark.multinode
def test_a_replaced_node_whose_copies_are_gone_says_so(tmp_path, nodes3, transport):
    """Nodes 1 and 2 are lost together: node 1's copies died with node 2.
    Node 2's replacement gets its file back from node 0; node 1's finds
    nothing at node 2, which holds files of the job, and warns."""
    start = functools.partial(_node_server, tmp_path, transport, nodes3)

    servers = [start(i, f"n{i}") for i in range(3)]
    try:
        endpoints = _set_ring(servers)
        for i, s in enumerate(servers):
            with _knobs.override(socket=s.socket, job="ring-job", on_unavailable="raise"):
                tce.save({"w": torch.full((1000,), float(i))}, f"/ckpt/s1/rank{i}.pt", tag="s1", rank=i)
                api.close()
        for s in servers:
            until(lambda: all(f.backup_holder for f in _files(s).values()), what="backups")
        servers[1].kill()
        servers[2].kill()
        servers[1], servers[2] = start(1, "n1-again"), start(2, "n2-again")
        _set_ring_on(servers[0], 0, endpoints)
        _set_ring_on(servers[2], 2, endpoints)
        assert "/ckpt/s1/rank2.pt" in _list_restored(servers[2])  # node 0 held node 2's copy
        _set_ring_on(servers[1], 1, endpoints)
        assert _list_restored(servers[1]) == {}
        line = until(lambda: next((ln for ln in servers[1].log().splitlines()
                                   if "recovered 0 of 0 file(s) of job=ring-job" in ln), None),
                     what="the replacement's report")
        assert "WARN" in line.upper() and "node 1's files" in line and "gone" in line, line
        assert "recovered 1 of 1 file(s) of job=ring-job" in servers[2].log()
        with _knobs.override(socket=servers[1].socket, job="ring-job", on_unavailable="raise"):
            with pytest.raises(FileNotFoundError):
                tce.load("/ckpt/s1/rank1.pt", weights_only=True)
            api.close()
    finally:
        _stop(*servers)


@pytest.mark.multinode
def test_a_restarted_node_names_the_tags_it_lost(tmp_path, nodes3, transport):
    """Node 1 restarts with its metadata after its successor lost the
    copies too: the files metadata records did not come back, and the
    warning names their tags."""
    start = functools.partial(_node_server, tmp_path, transport, nodes3, metadata=True)

    servers = [start(i, f"n{i}") for i in range(3)]
    try:
        endpoints = _set_ring(servers)
        with _knobs.override(socket=servers[1].socket, job="ring-job", on_unavailable="raise"):
            for tag in ("step7", "step8"):
                tce.save({"w": torch.ones(100)}, f"/ckpt/{tag}/rank1.pt", tag=tag, rank=1)
            wait_metadata_written()
            api.close()
        until(lambda: all(f.backup_holder for f in _files(servers[1]).values()), what="backups")
        servers[1].kill()
        servers[2].kill()
        servers[2] = start(2, "n2-again")
        servers[1] = start(1, "n1")  # its metadata: rejoins the ring, and knows what it held
        _set_ring_on(servers[2], 2, endpoints)
        restarted = lambda: servers[1].log().split("re-indexed")[-1]  # noqa: E731 (its log goes on the first's)
        line = until(lambda: next((ln for ln in restarted().splitlines()
                                   if "recovered 0 of 0 file(s) of job=ring-job" in ln), None),
                     what="the restarted server's report")
        assert "WARN" in line.upper() and "2 file(s) this node held are gone" in line, line
        assert "(tags: step7, step8)" in line, line
    finally:
        _stop(*servers)


@pytest.mark.multinode
def test_a_rank_on_another_node_reads_its_shard_from_the_peer(tmp_path, nodes3, transport):
    """Node 0 saved rank 0's file, backed up to node 1. The rank now runs on
    node 2, whose server has never seen the file and no storage exists: its
    load is served by fetching the copy from the peer that holds it."""
    servers = [_ring_server(tmp_path, transport, f"n{i}", netns=name, listen=f"{addr}:7070")
               for i, (name, addr) in enumerate(zip(nodes3.names, nodes3.addresses))]
    try:
        endpoints = _set_ring(servers)
        x = {"w": torch.randn(1 << 18), "step": 12}
        with _knobs.override(socket=servers[0].socket, job="ring-job", on_unavailable="raise"):
            tce.save(x, "/ckpt/step12/rank0.pt", tag="step12", rank=0)
            api.close()
        until(lambda: _files(servers[0])["/ckpt/step12/rank0.pt"].backup_holder, what="the backup")
        servers[0].kill()  # the owner is gone too: only node 1's copy is left
        with _knobs.override(socket=servers[2].socket, job="ring-job", on_unavailable="raise"):
            assert "/ckpt/step12/rank0.pt" not in _files(servers[2])
            out = tce.load("/ckpt/step12/rank0.pt", weights_only=True)
            assert torch.equal(out["w"], x["w"]) and out["step"] == 12
            st = tce.status()
            assert int(st["remote_reads"]) == 1
            assert st["ring_transport"] == transport
            f = _files(servers[2])["/ckpt/step12/rank0.pt"]
            assert f.backup_holder == endpoints[1]
            for _ in range(2):  # held nowhere, on no storage: a clear miss
                with pytest.raises(FileNotFoundError):
                    tce.load("/ckpt/step12/nobody.pt", weights_only=True)
            # The peers were asked once: the second miss was remembered.
            assert int(tce.status()["remote_misses"]) == 1
            api.close()
    finally:
        servers[0].cleanup()
        _stop(*servers[1:])


@pytest.mark.multinode
def test_a_stale_ring_copy_is_refused_against_metadata(tmp_path, nodes3, transport):
    """Node 0's backup of x.pt (version 1) reached node 1; then the link was
    cut, and version 2 was saved and persisted (metadata records its CRCs)
    but never backed up. Node 0's server dies and comes back: the ring's
    copy is intact but is not the file metadata knows, so it is refused,
    counted, and version 2 loads from storage."""
    storage = tmp_path / "storage"
    storage.mkdir()
    servers = [_ring_server(tmp_path, transport, f"n{i}", netns=name, listen=f"{addr}:7070",
                            metadata=True, storage=storage)
               for i, (name, addr) in enumerate(zip(nodes3.names[:2], nodes3.addresses[:2]))]
    try:
        _set_ring(servers)
        path = storage / "x.pt"
        with _knobs.override(socket=servers[0].socket, job="ring-job", on_unavailable="raise"):
            tce.save({"v": torch.full((1 << 16,), 1.0)}, path, tag="t1")
            until(lambda: _files(servers[0])[str(path)].backup_holder, what="version 1's backup")
            nodes3.cut(1)
            tce.save({"v": torch.full((1 << 16,), 2.0)}, path, tag="t2")
            tce.wait()
            wait_metadata_written()
            assert not _files(servers[0])[str(path)].backup_holder
            api.close()
        # Version 2's attempt has failed (both ends timed out): its bytes,
        # still in flight on the cut link, can no longer land as a backup.
        until(lambda: int(_status(servers[0])["backup_failures"]) >= 1, what="a failed attempt")
        servers[0].kill()
        nodes3.restore(1)
        servers[0] = _ring_server(tmp_path, transport, "n0", netns=nodes3.names[0],
                                  listen=f"{nodes3.addresses[0]}:7070", metadata=True, storage=storage)
        st = until(lambda: int(_status(servers[0])["ring_checksum_mismatches"]) >= 1 and _status(servers[0]),
                   what="the refused copy")
        assert "does not match the checksums in metadata" in st["backup_error"], st["backup_error"]
        assert int(st["recovered_files"]) == 0
        with _knobs.override(socket=servers[0].socket, job="ring-job", on_unavailable="raise"):
            out = tce.load(path, weights_only=True)
            assert out["v"][0].item() == 2.0
            api.close()
    finally:
        _stop(*servers)


def test_a_server_serves_its_clients_the_copies_it_holds(tmp_path, transport):
    """Node 0 saved a file, backed up to node 1. A rank on node 1 loads it:
    node 1's server reads the copy it holds for node 0 (no peer is asked,
    no storage exists)."""
    a = _ring_server(tmp_path, transport, "a")
    b = _ring_server(tmp_path, transport, "b")
    try:
        endpoints = _set_ring([a, b])
        x = {"w": torch.randn(1 << 16), "step": 3}
        with _knobs.override(socket=a.socket, job="ring-job", on_unavailable="raise"):
            tce.save(x, "/ckpt/step3/mp_rank_00_model_states.pt", tag="step3", rank=0)
            api.close()
        until(lambda: _files(a)["/ckpt/step3/mp_rank_00_model_states.pt"].backup_holder, what="the backup")
        a.kill()  # no peer could answer: the copy held here must serve
        # The job tells b the ring again: b restores from a, which is gone.
        # After a few failed attempts loads stop waiting for that restore.
        _set_ring_on(b, 1, endpoints)
        # (A load that waited out ring_restore_wait_ms, two minutes, would
        # run into the client's 60 s deadline instead.)
        with _knobs.override(socket=b.socket, job="ring-job", on_unavailable="raise"):
            out = tce.load("/ckpt/step3/mp_rank_00_model_states.pt", weights_only=True)
            assert torch.equal(out["w"], x["w"]) and out["step"] == 3
            api.close()
        log = b.log()
        assert "loads no longer wait for it" in log and "from the copy held here" in log, log[-3000:]
        assert log.index("loads no longer wait for it") < log.index("from the copy held here")
    finally:
        a.cleanup()
        _stop(b)


def test_a_peer_serves_its_own_cached_files_to_ring_members_only(tmp_path, transport):
    """Node 0 saved a file, backed up to node 1, which then dies. A rank on
    node 2 loads the file: node 2's server asks its successor, node 0, which
    sends its own cached file. A server outside the job's ring gets nothing."""
    servers = [_ring_server(tmp_path, transport, f"n{i}") for i in range(3)]
    outsider = _ring_server(tmp_path, transport, "outsider")
    try:
        _set_ring(servers)
        x = {"w": torch.randn(1 << 16), "b": torch.arange(99)}
        with _knobs.override(socket=servers[0].socket, job="ring-job", on_unavailable="raise"):
            tce.save(x, "/ckpt/s1/mp_rank_00_model_states.pt", tag="s1", rank=0)
            api.close()
        until(lambda: _files(servers[0])["/ckpt/s1/mp_rank_00_model_states.pt"].backup_holder,
              what="the backup")
        servers[1].kill()  # the copy is gone: only node 0's own cache has the file
        with _knobs.override(socket=servers[2].socket, job="ring-job", on_unavailable="raise"):
            out = tce.load("/ckpt/s1/mp_rank_00_model_states.pt", weights_only=True)
            assert torch.equal(out["w"], x["w"]) and torch.equal(out["b"], x["b"])
            assert int(tce.status()["remote_reads"]) == 1
            api.close()
        until(lambda: "sent back job=ring-job path=/ckpt/s1/mp_rank_00_model_states.pt" in servers[0].log(),
              what="node 0 to log what it sent")  # logged once its send returned
        # The outsider names node 0 in a ring of its own for the same job:
        # node 0 does not count it a member, and sends nothing.
        _set_ring_on(outsider, 0, [_status(outsider)["peer_endpoint"], _status(servers[0])["peer_endpoint"]])
        with _knobs.override(socket=outsider.socket, job="ring-job", on_unavailable="raise"):
            with pytest.raises(FileNotFoundError):
                tce.load("/ckpt/s1/mp_rank_00_model_states.pt", weights_only=True)
            api.close()
        until(lambda: "is not a member of job ring-job's ring here" in servers[0].log(),
              what="node 0 to refuse the outsider")
    finally:
        servers[1].cleanup()
        _stop(servers[0], servers[2], outsider)


@pytest.fixture(params=["4k", "thp", "hugetlb"])
def backing(request):
    """Each memory backing, for real: huge pages reserved, shmem THP on
    'advise' (both root; put back after)."""
    if request.param == "hugetlb":
        request.getfixturevalue("huge_pages")(480)  # three servers' budgets, loads' copy-on-write, range buffers
    elif request.param == "thp":
        request.getfixturevalue("shmem_thp")
    return request.param


def test_every_transport_moves_every_memory_backing(tmp_path, transport, backing):
    """Servers whose buffers are on `backing`: a backup (node 0 to node 1),
    ranged reads node 2 asks of its peers (the bytes sent from their
    memory), and a whole file fetched for a load, each bit for bit."""
    # 256 MiB, half of it the cache's: node 2's range buffer (64 MiB, in the
    # budget) and the 12 MiB file its load fetches fit side by side
    servers = [_ring_server(tmp_path, transport, f"n{i}", budget="256MiB",
                            extra=["--memory-backing", backing]) for i in range(3)]
    try:
        _set_ring(servers)
        path = "/ckpt/m/model.pt"
        x = {"w": torch.randn(3 << 20), "b": torch.arange(1001)}  # 12 MiB: several transfer chunks
        with _knobs.override(socket=servers[0].socket, job="ring-job", on_unavailable="raise"):
            tce.save(x, path, tag="m", rank=0)
            info, mm = _service.client().open("ring-job", path)
            want = bytes(mm[:info.size])
            mm.close()
            assert api.status()["memory_backing"] == backing
            api.close()
        until(lambda: _files(servers[0])[path].backup_holder, what="the backup")
        assert int(_status(servers[1])["held_backup_bytes"]) == len(want)

        def read_ranges(c) -> None:
            for off, n in ((0, 4096), (len(want) - 5000, 5000), (1 << 20, 3 << 20)):
                assert c.read_range("ring-job", path, off, n).data == want[off:off + n]
            fd, _ = _service.range_buffer()
            c.read_range("ring-job", path, 7, 2 << 20, buffer_offset=0)
            assert os.pread(fd, 2 << 20, 0) == want[7:7 + (2 << 20)]

        with _knobs.override(socket=servers[2].socket, job="ring-job", on_unavailable="raise"):
            read_ranges(_service.client())  # node 1's copy may serve these
            servers[1].kill()  # now only node 0's own buffer (on `backing`) has the file
            read_ranges(_service.client())
            assert int(tce.status()["range_reads_peer"]) == 8
            out = tce.load(path, weights_only=True)  # the whole file, fetched from node 0
            assert torch.equal(out["w"], x["w"]) and torch.equal(out["b"], x["b"])
            assert int(tce.status()["remote_reads"]) == 1
            api.close()
    finally:
        servers[1].cleanup()
        _stop(servers[0], servers[2])


def test_a_missing_storage_root_stops_the_server(tmp_path):
    from tce.tools._server import server_binary

    root = tmp_path / "moved-away"
    p = subprocess.run([server_binary(), "--socket", str(tmp_path / "x.sock"), "--metadata-url", "none",
                        "--storage-roots", str(root)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2, p.stderr
    assert f"storage_roots: {root} does not exist" in p.stderr and "never creates" in p.stderr, p.stderr
    assert not root.exists()


def test_join_ring_tells_every_server_the_ring(tmp_path, transport):
    """Two "nodes" (one process each, NODE_RANK set as a launcher would) join
    the ring with torch.distributed; each node's file is then backed up to
    the other node's server."""
    import socket
    import sys

    servers = [_ring_server(tmp_path, transport, f"j{i}") for i in range(2)]
    try:
        port = free_port()
        procs = [subprocess.Popen(
            [sys.executable, os.path.join(os.path.dirname(__file__), "ring_job.py")],
            env=dict(os.environ, RANK=str(i), WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                     NODE_RANK=str(i), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                     TCE_SOCKET=servers[i].socket, TCE_JOB="ring-job", TCE_ON_UNAVAILABLE="raise"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
        outs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
        import json

        reports = [json.loads(o[0].strip().splitlines()[-1]) for o in outs]
        endpoints = [_status(s)["peer_endpoint"] for s in servers]
        assert [r["endpoints"] for r in reports] == [endpoints, endpoints]
        assert [r["node"] for r in reports] == [0, 1]
        for i, s in enumerate(servers):
            f = until(lambda: _files(s)[f"/ckpt/joined/rank{i}.pt"].backup_holder and
                      _files(s)[f"/ckpt/joined/rank{i}.pt"], what=f"node {i}'s backup")
            assert f.backup_holder == endpoints[1 - i]
    finally:
        _stop(*servers)


def test_tce_status_shows_the_ring(tmp_path, transport):
    a = _ring_server(tmp_path, transport, "a")
    try:
        p = subprocess.run(["python3", "-m", "tce.cli", "--socket", a.socket, "status"],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        assert f"ring      peer {_status(a)['peer_endpoint']} ({transport}); backup queue 0" in p.stdout
        assert "0 file(s) recovered from the ring, 0 copies refused against metadata's CRCs, 0 remote read(s)" \
            in p.stdout, p.stdout
        assert "holding 0 predecessor file(s), 0 B of 256.0 MiB, and 0 of its complete tag(s)" in p.stdout, p.stdout
    finally:
        _stop(a)


def test_corrupted_copies_are_refused_and_storage_serves(tmp_path, transport):
    """B's transport corrupts every transfer it sends (a fault-injecting
    transport, in the test build tce-server-faulty: wire corruption cannot be
    caused for real). B's backups to A are refused by A's CRC check; when A
    restarts, the copy B sends back is refused too, and the file loads from
    storage, correct."""
    faulty = faulty_server_binary()
    storage = tmp_path / "storage"
    storage.mkdir()
    a = _ring_server(tmp_path, transport, "a", storage=storage)
    b = _ring_server(tmp_path, transport, "b", extra=["--ring-fault", "corrupt"], binary=faulty)
    try:
        _set_ring([a, b])
        x = {"w": torch.randn(1 << 16), "n": 7}
        with _knobs.override(socket=a.socket, job="ring-job", on_unavailable="raise"):
            tce.save(x, storage / "x.pt", tag="t")
            tce.wait()
            api.close()
        until(lambda: _files(a)[str(storage / "x.pt")].backup_holder, what="A's backup")
        with _knobs.override(socket=b.socket, job="ring-job", on_unavailable="raise"):
            tce.save({"w": torch.ones(1000)}, "/ckpt/y.pt", tag="t")
            api.close()
        st = until(lambda: int(_status(b)["backup_failures"]) >= 1 and _status(b), what="a refusal")
        assert "checksum mismatch" in st["backup_error"], st["backup_error"]
        assert int(_status(a)["held_backups"]) == 0  # nothing corrupt was kept

        a.kill()
        a2 = _ring_server(tmp_path, transport, "a2", storage=storage)
        try:
            _set_ring([a2, b])
            st = until(lambda: "corrupt" in _status(a2)["backup_error"] and _status(a2),
                       what="the refused recovery")
            assert "checksum mismatch" in st["backup_error"]
            assert str(storage / "x.pt") not in _files(a2)  # never installed
            assert "not recovered" in a2.log()
            with _knobs.override(socket=a2.socket, job="ring-job", on_unavailable="raise"):
                out = tce.load(storage / "x.pt", weights_only=True)  # from storage
                assert torch.equal(out["w"], x["w"]) and out["n"] == 7
                api.close()
        finally:
            _stop(a2)
    finally:
        a.cleanup()
        _stop(b)


def _save_raw(server, path: str, data: bytes, job="ring-job") -> None:
    """A file that is not a torch zip (as a DCP data file is): raw bytes."""
    with _knobs.override(socket=server.socket):
        alloc = _service.client().allocate(job=job, tag="t", rank=0, path=path, size=len(data))
        alloc.view[:] = data
        alloc.commit()
        api.close()


def test_files_that_are_not_torch_zips_are_checked_on_the_ring_too(tmp_path, transport):
    """A raw file has no records to check, so it travels with byte ranges
    that carry CRCs: a good copy is held and comes back bitwise (and as the
    file it was: no records); a copy corrupted on the wire is refused, as a
    backup and when sent back for recovery."""
    faulty = faulty_server_binary()
    a = _ring_server(tmp_path, transport, "a")
    b = _ring_server(tmp_path, transport, "b", extra=["--ring-fault", "corrupt"], binary=faulty)
    try:
        _set_ring([a, b])
        good = os.urandom((5 << 20) + 123)
        _save_raw(a, "/ckpt/a.distcp", good)  # A -> B: a clean transport
        until(lambda: _files(a)["/ckpt/a.distcp"].backup_holder, what="A's backup")
        _save_raw(b, "/ckpt/b.distcp", os.urandom(1 << 20))  # B -> A: corrupted on the way
        st = until(lambda: int(_status(b)["backup_failures"]) >= 1 and _status(b), what="a refusal")
        assert "checksum mismatch in record range" in st["backup_error"], st["backup_error"]
        assert int(_status(a)["held_backups"]) == 0  # nothing corrupt was kept

        a.kill()
        a2 = _ring_server(tmp_path, transport, "a2")
        try:
            _set_ring([a2, b])  # B sends A's file back through its corrupting transport
            st = until(lambda: "checksum mismatch" in _status(a2)["backup_error"] and _status(a2),
                       what="the refused recovery")
            assert "/ckpt/a.distcp" not in _files(a2)  # never installed
        finally:
            a2.kill()
            a2.cleanup()
    finally:
        a.cleanup()
        _stop(b)

    # Between two sound servers the same file comes back whole, and as it was.
    c, d = (_ring_server(tmp_path, transport, name) for name in ("c", "d"))
    try:
        _set_ring([c, d])
        _save_raw(c, "/ckpt/c.distcp", good)
        until(lambda: _files(c)["/ckpt/c.distcp"].backup_holder, what="C's backup")
        c.kill()
        c2 = _ring_server(tmp_path, transport, "c2")
        try:
            _set_ring([c2, d])
            got = _list_restored(c2)["/ckpt/c.distcp"]
            assert got.size == len(good) and len(got.records) == 0
            with _knobs.override(socket=c2.socket, job="ring-job"):
                _, mm = _service.client().open("ring-job", "/ckpt/c.distcp")
                assert bytes(mm[:len(good)]) == good
                mm.close()
                api.close()
        finally:
            _stop(c2)
    finally:
        c.cleanup()
        _stop(d)


@pytest.mark.multinode
@pytest.mark.rdma  # the bench runs ofi too
def test_ring_bench_runs(tmp_path):
    import json

    p = subprocess.Popen(["python3", "-m", "tce.cli", "bench", "--ring", "--size", "16MiB", "--repeats", "2",
                          "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=300)
    finally:
        p.kill()
    assert p.returncode == 0, out + err
    res = json.loads(out)
    assert res["bytes"] == 16 << 20
    for run in ("floor", "tcp1", "tcp4", "ofi"):
        for key in (f"{run}_s", f"{run}_gbps") + ((f"{run}_vs_floor",) if run != "floor" else ()):
            assert res[key] > 0, key
    # The bench removed its namespaces and its bridge (named after its pid;
    # others' namespaces may come and go meanwhile).
    mine = Nodes.prefix(p.pid)
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert [n for n in ns if n.startswith(f"tce{mine}")] == []
    assert f"tcebr{mine}" not in links
