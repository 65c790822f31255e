"""The ring's peer port against an attacker on the network: relayed
handshakes, length prefixes that ask for memory, connect/close floods, slow
connections, and a peer (one that holds the token) that lies in recovery.

Attack traffic stays on loopback (127.0.0.2 and 127.0.0.3 stand for other
hosts) and every loop is bounded in count and time.
"""

from __future__ import annotations

import struct
import threading
import time

import pytest
import torch

import tce
from tce import _service, api
from tce.core import _knobs

from helpers import until
from hostile_peer import (LyingPeer, Relay, closed_by_peer, connect_with_token, dial, frame, proc_status,
                          recv_msg)
from tce.v1 import tce_pb2 as pb
from test_ring import TOKEN, _ring_server, _status, _stop

JOB = "ring-job"


def _set_ring(server, node: int, endpoints: list[str]) -> None:
    with _knobs.override(socket=server.socket):
        _service.client().set_ring(JOB, node, endpoints)
        api.close()


def _save(server, path, obj) -> None:
    with _knobs.override(socket=server.socket, job=JOB, on_unavailable="raise"):
        tce.save(obj, path, tag="t")
        api.close()


def test_a_handshake_relayed_to_the_server_itself_gets_no_checkpoint_bytes(tmp_path):
    """The ring names an endpoint that relays to the server's own peer port.
    The server dialled the relay, so its proof names the relay, and its own
    acceptor refuses it: no bytes of the checkpoint go through."""
    a = _ring_server(tmp_path, "tcp", "a")
    relay = Relay(_status(a)["peer_endpoint"])
    try:
        _set_ring(a, 0, [_status(a)["peer_endpoint"], relay.endpoint])
        _save(a, "/ckpt/relay/x.pt", {"w": torch.randn(1 << 20)})
        st = until(lambda: int(_status(a)["backup_failures"]) >= 1 and _status(a), what="a failed backup")
        assert "was not dialled as" in a.log(), a.log()[-3000:]
        assert int(st["held_backups"]) == 0 and int(st["backed_up_files"]) == 0
        assert relay.connections >= 1
        assert relay.bytes_in < 4096, f"{relay.bytes_in} bytes went through the relay"
    finally:
        relay.close()
        _stop(a)


def test_length_prefixes_before_authentication_allocate_nothing(tmp_path):
    a = _ring_server(tmp_path, "tcp", "a")
    socks = []
    try:
        endpoint, pid = _status(a)["peer_endpoint"], a.proc.pid
        before = proc_status(pid)["VmRSS"]
        for _ in range(48):
            s = dial(endpoint, source="127.0.0.2")
            s.sendall(struct.pack("<I", 64 << 20))  # "a 64 MiB message follows"
            socks.append(s)
        # Each was refused at once (the server closed it without waiting for
        # the body): measured once the server has handled all 48.
        until(lambda: closed_by_peer(socks) == len(socks), timeout=60, what="the 48 refusals")
        grown_mib = (proc_status(pid)["VmRSS"] - before) / 1024
        assert grown_mib < 64, f"48 length prefixes grew the server by {grown_mib:.0f} MiB"
        for s in socks:
            assert s.recv(1) == b""
        assert "67108864-byte message (at most 4096 before authentication)" in a.log()
    finally:
        for s in socks:
            s.close()
        _stop(a)


def test_connect_close_floods_leave_no_threads_behind(tmp_path):
    a = _ring_server(tmp_path, "tcp", "a")
    b = _ring_server(tmp_path, "tcp", "b")
    try:
        eb = _status(b)["peer_endpoint"]
        pid = b.proc.pid
        deadline = time.monotonic() + 60

        def flood(n):
            for i in range(n):
                assert time.monotonic() < deadline, f"only {i} connections in 60 s"
                dial(eb, source="127.0.0.2").close()
            return until(lambda: (lambda s: s["Threads"] <= idle["Threads"] + 2 and s)(proc_status(pid)),
                         what="the connection threads to end")

        idle = proc_status(pid)
        before = flood(500)  # malloc's per-thread arenas reach their cap
        after = flood(2500)
        # A thread never joined keeps its 8 MiB stack mapped (2500 of them: 20 GiB);
        # malloc's per-thread arenas may still add up to 16 x 64 MiB.
        grown_mib = (after["VmSize"] - before["VmSize"]) / 1024
        assert grown_mib < 2048, f"2500 connections left {grown_mib:.0f} MiB of address space behind"
        # and the real peer is still served
        endpoints = [_status(a)["peer_endpoint"], eb]
        _set_ring(a, 0, endpoints)
        _set_ring(b, 1, endpoints)
        _save(a, "/ckpt/flood/x.pt", {"w": torch.ones(1000)})
        until(lambda: int(_status(a)["backed_up_files"]) >= 1, what="the backup after the flood")
    finally:
        _stop(a, b)


def test_slow_connections_do_not_lock_out_a_real_peer(tmp_path):
    """300 connections from one address, each sending a byte a second (each
    read sees progress within the 30 s peer timeout, and the handshake
    deadline is 10 minutes): the newest 8 (max_handshakes_per_source) hold
    their handshakes, the rest are pushed out, and the real peer, from
    another address, backs up while those 8 are still held. (The cap on
    handshakes from anyone is raised so that only the per-source one acts.)"""
    a = _ring_server(tmp_path, "tcp", "a")
    b = _ring_server(tmp_path, "tcp", "b", extra=["--peer-timeout-ms", "30000", "--peer-handshake-timeout-ms", "600000",
                                                  "--peer-max-handshakes-per-source", "8",
                                                  "--peer-max-handshakes", "1024"])
    stop = threading.Event()
    made: list = []
    slow: list = []
    hello = struct.pack("<I", 40) + b"\x0a" * 40  # a plausible first message, a byte at a time

    def drip():
        end = time.monotonic() + 25
        sent = 1
        while not stop.wait(1.0) and time.monotonic() < end and sent < len(hello):
            for s in list(slow):
                try:
                    s.send(hello[sent:sent + 1])
                except OSError:
                    slow.remove(s)
            sent += 1

    dripper = threading.Thread(target=drip)
    try:
        eb = _status(b)["peer_endpoint"]
        for _ in range(300):
            try:
                s = dial(eb, source="127.0.0.3")
                s.send(hello[:1])
                made.append(s)
            except OSError:
                break
        slow.extend(made)
        dripper.start()
        # B took every one in: each pushed out the oldest beyond 8, down to
        # the newest 8's predecessors (the last one pushed out that of the
        # 9th newest). The newest 8 hold their handshakes.
        pushed, held = made[:-8], made[-8:]
        until(lambda: closed_by_peer(pushed) == len(pushed), timeout=60, what="B to take in the slow connections")
        assert closed_by_peer(held) == 0
        endpoints = [_status(a)["peer_endpoint"], eb]
        _set_ring(a, 0, endpoints)
        _set_ring(b, 1, endpoints)
        _save(a, "/ckpt/slow/x.pt", {"w": torch.ones(1000)})
        until(lambda: int(_status(a)["backed_up_files"]) >= 1, timeout=60, what="the backup past the slow connections")
        # Not locked out until they ended: they are still being served.
        assert closed_by_peer(held) == 0, "the backup waited for the slow connections to end"
    finally:
        stop.set()
        if dripper.is_alive():
            dripper.join()
        for s in made:
            s.close()
        _stop(a, b)


def _b_holding_as_copy(tmp_path, path, *, hosts=("127.0.0.1", "127.0.0.1")):
    """A and B (on `hosts`) in a job's ring, and B holding A's copy of
    `path`: (a, b, A's endpoint, B's endpoint). Both stopped on failure."""
    a = _ring_server(tmp_path, "tcp", "a", listen=f"{hosts[0]}:0")
    b = _ring_server(tmp_path, "tcp", "b", listen=f"{hosts[1]}:0")
    try:
        ea, eb = _status(a)["peer_endpoint"], _status(b)["peer_endpoint"]
        _set_ring(a, 0, [ea, eb])
        _set_ring(b, 1, [ea, eb])
        _save(a, path, {"w": torch.ones(1000)})
        until(lambda: int(_status(b)["held_backups"]) == 1, what="B to hold A's copy")
    except BaseException:
        _stop(a, b)
        raise
    return a, b, ea, eb


def _member_lists(eb: str, ea: str, path: str, *, source: str = "127.0.0.1") -> None:
    """As A (from `source`), B lists A's copies: just `path`."""
    member = connect_with_token(eb, TOKEN, ea, source=source)
    try:
        member.sendall(frame(pb.PeerRequest(list=pb.PeerList(job=JOB, owner_node=0, job_uid=0))))
        listed = recv_msg(member, pb.PeerListReply)
        assert [f.path for f in listed.files] == [path] and listed.code == 0
    finally:
        member.close()


def test_a_token_holder_outside_the_jobs_ring_reads_none_of_its_copies(tmp_path):
    """B holds A's copy of a job whose ring is A and B. A third server with
    the token, but not in that ring, asks B for the list and the copy:
    refused, with the reason."""
    path = "/ckpt/members/x.pt"
    a, b, ea, eb = _b_holding_as_copy(tmp_path, path)
    try:
        outsider = connect_with_token(eb, TOKEN, "127.0.0.1:1")
        try:
            outsider.sendall(frame(pb.PeerRequest(list=pb.PeerList(job=JOB, owner_node=0))))
            listed = recv_msg(outsider, pb.PeerListReply)
            assert list(listed.files) == [] and listed.code == 7, listed  # PERMISSION_DENIED
            assert "127.0.0.1:1 is not a member of job ring-job's ring here" in listed.message
            outsider.sendall(frame(pb.PeerRequest(fetch=pb.PeerFetch(job=JOB, path=path))))
            reply = recv_msg(outsider, pb.PeerReply)
            assert reply.code == 7 and "not a member" in reply.message, reply
        finally:
            outsider.close()
        _member_lists(eb, ea, path)  # A member still reads it: A asks as itself.
    finally:
        _stop(a, b)


def test_a_token_holder_cannot_pass_for_a_member_from_another_address(tmp_path):
    """A (127.0.0.2) and B (127.0.0.3) are a job's ring; B holds A's copy.
    A token holder on 127.0.0.1 announcing A's endpoint is refused after its
    proof, and reads nothing; A's own connections (bound to the address it
    advertises) still back up, and a connection from A's address is let in."""
    path = "/ckpt/members/y.pt"
    a, b, ea, eb = _b_holding_as_copy(tmp_path, path, hosts=("127.0.0.2", "127.0.0.3"))
    try:
        with pytest.raises(PermissionError):
            connect_with_token(eb, TOKEN, ea, source="127.0.0.1")
        until(lambda: f"knows the token but is not {ea}: it connected from 127.0.0.1" in b.log(),
              what="B to log the refusal")
        _member_lists(eb, ea, path, source="127.0.0.2")
    finally:
        _stop(a, b)


def test_a_token_holder_outside_the_ring_plants_no_copy_tag_or_drop(tmp_path):
    """B holds A's copy; a token holder that is not node 0 of the job's ring
    (as B was told it) sends B a copy and a complete tag as node 0, and a
    drop of A's copy: each is refused or ignored, and B still holds A's
    copy alone."""
    path = "/ckpt/members/z.pt"
    a, b, ea, eb = _b_holding_as_copy(tmp_path, path)
    try:
        held = int(_status(b)["held_backup_bytes"])
        forger = connect_with_token(eb, TOKEN, "127.0.0.1:1")
        try:
            forged = b"F" * 4096
            forger.sendall(frame(pb.PeerRequest(backup=pb.PeerBackup(
                job=JOB, tag="t", path="/ckpt/members/forged.pt", size=len(forged), version=1,
                owner_node=0))) + forged)
            reply = recv_msg(forger, pb.PeerReply)
            assert reply.code == 7 and "127.0.0.1:1 is not node 0 of job ring-job's ring here" in reply.message, reply
            tag = pb.TagInfo(job=JOB, tag="t9", world_size=1, complete_unix_ns=time.time_ns(),
                             files=[pb.TagFile(rank=0, path=path, size=1)])
            forger.sendall(frame(pb.PeerRequest(tag=pb.PeerTag(tag=tag, owner_node=0))))
            reply = recv_msg(forger, pb.PeerReply)
            assert reply.code == 7 and "is not node 0" in reply.message, reply
            forger.sendall(frame(pb.PeerRequest(drop=pb.PeerDrop(job=JOB, path=path))))
            recv_msg(forger, pb.PeerReply)
        finally:
            forger.close()
        st = _status(b)
        assert int(st["held_backups"]) == 1 and int(st["held_backup_bytes"]) == held
        assert int(st["held_tags"]) == 0
    finally:
        _stop(a, b)


@pytest.mark.parametrize("lie", ["another path", "a path outside the roots"])
def test_a_peer_cannot_make_recovery_write_outside_the_roots(tmp_path, lie):
    """A peer that holds the token answers a recovering server with a file
    of its own choosing. Whatever it names, nothing is written outside the
    storage roots and nothing is recovered."""
    roots, outside = tmp_path / "roots", tmp_path / "outside"
    roots.mkdir()
    outside.mkdir()
    evil = outside / "evil.pt"
    listed = roots / "ok.pt" if lie == "another path" else evil
    liar = LyingPeer(TOKEN, JOB, str(listed), str(evil), b"x" * 4096)
    a = _ring_server(tmp_path, "tcp", "a", storage=roots, extra=["--ring-streams", "1"])
    try:
        _set_ring(a, 0, [_status(a)["peer_endpoint"], liar.endpoint])  # a fresh node: it recovers
        # The attempt is over once it is logged as failed (the header named
        # another path: retried) or reported (the file was refused).
        ended = ("failed, retrying in" if lie == "another path" else "recovered 0 of 1 file(s) of job=ring-job")
        refusal = ("when asked for job=" if lie == "another path" else "is not under a storage root")
        until(lambda: ended in a.log() or evil.exists(), timeout=60, what="the recovery attempt to end")
        assert refusal in a.log(), a.log()[-3000:]
        assert not evil.exists(), f"{evil} was written by the server"
        assert liar.fetches >= 1
        st = _status(a)
        # Nothing came into the cache, so nothing can be persisted later.
        assert int(st["recovered_files"]) == 0 and int(st["files"]) == 0, st
        assert list(outside.iterdir()) == []
    finally:
        liar.close()
        _stop(a)


def test_recovered_tags_must_agree_with_the_files_they_name(tmp_path):
    """A peer gives a recovering server back four complete tags, and of the
    one file it lists as the node's, nothing (it is outside the roots). A
    tag naming a file storage holds at the tag's size, and one naming
    another node's file (nowhere here), are listed again; one naming the
    listed file that did not come back, and one naming a file storage holds
    at another size, are refused, each with its reason."""
    roots = tmp_path / "roots"
    roots.mkdir()
    (roots / "real.pt").write_bytes(b"r" * 100)
    (roots / "short.pt").write_bytes(b"s" * 10)
    outside = str(tmp_path / "outside.pt")

    def tag(name: str, path, size: int):
        return pb.TagInfo(job=JOB, tag=name, world_size=1, complete_unix_ns=time.time_ns(),
                          files=[pb.TagFile(rank=0, path=str(path), size=size)])

    liar = LyingPeer(TOKEN, JOB, outside, outside, b"x" * 4096,
                     tags=[tag("real", roots / "real.pt", 100), tag("elsewhere", roots / "n1.pt", 100),
                           tag("unreturned", outside, 4096), tag("resized", roots / "short.pt", 100)])
    a = _ring_server(tmp_path, "tcp", "a", storage=roots, extra=["--ring-streams", "1"])
    try:
        _set_ring(a, 0, [_status(a)["peer_endpoint"], liar.endpoint])  # a fresh node: it recovers
        until(lambda: "complete tag(s) of job=" in a.log(), what="the tags to be recovered")
        with _knobs.override(socket=a.socket):
            tags = sorted(t.tag for t in _service.client().list_tags(JOB))
            api.close()
        assert tags == ["elsewhere", "real"], tags
        log = a.log()
        assert (f"tag unreturned names {outside} (4096 bytes), which the ring listed as this node's "
                "but did not give back") in log, log[-3000:]
        assert f"tag resized names {roots / 'short.pt'} (100 bytes), but storage holds 10 bytes there" in log
    finally:
        liar.close()
        _stop(a)
