"""Bad requests get a clear error, lose nothing, and the server keeps serving."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import grpc
import pytest
import torch

import tce
from tce.core import _knobs
from tce.core._client import Client
from tce.errors import TCEError
from tce.v1 import tce_pb2 as pb

from helpers import Blocker, until


@pytest.fixture
def srv(make_server):
    return make_server("64MiB")


@pytest.fixture
def client(srv):
    c = Client(srv.socket, rpc_timeout=10)
    yield c
    c.close()


def _still_serving(srv, tmp_path):
    with _knobs.override(socket=srv.socket, on_unavailable="raise"):
        path = tmp_path / f"alive-{time.monotonic_ns()}.pt"
        tce.save({"x": torch.arange(5)}, path)
        assert torch.equal(tce.load(path)["x"], torch.arange(5))


def _allocate(c, path="/ckpt/a.pt", size=4096, job="j"):
    return c._call("Allocate", pb.AllocateRequest(
        session=c.session, job=job, tag="t", rank=0, path=path, size=size))


def _expect(code, match, fn):
    with pytest.raises(TCEError) as ei:
        fn()
    assert ei.value.code == code, str(ei.value)
    assert match in ei.value.message, str(ei.value)


@pytest.mark.parametrize("path,why", [
    ("", "path"), ("relative/x.pt", "absolute"), ("/a/../b.pt", ".."),
    ("/a/./b.pt", "."), ("/a/b/", "trailing"), ("/a//b.pt", "empty"), ("/a/b\x01.pt", "control"),
])
def test_bad_paths(srv, client, tmp_path, path, why):
    _expect("INVALID_ARGUMENT", "path", lambda: _allocate(client, path=path))
    _still_serving(srv, tmp_path)


def test_size_zero_and_over_budget(srv, client, tmp_path):
    _expect("INVALID_ARGUMENT", "size must be > 0", lambda: _allocate(client, size=0))
    _expect("RESOURCE_EXHAUSTED", "exceeds the cache budget",
            lambda: _allocate(client, size=65 << 20))
    _still_serving(srv, tmp_path)


def test_empty_job(srv, client, tmp_path):
    _expect("INVALID_ARGUMENT", "job", lambda: _allocate(client, job=""))
    _still_serving(srv, tmp_path)


def test_unknown_session(srv, client, tmp_path):
    def call():
        client._call("Allocate", pb.AllocateRequest(
            session="not-a-session", job="j", path="/x.pt", size=10))
    _expect("UNAUTHENTICATED", "session", call)
    _still_serving(srv, tmp_path)


def test_commit_errors(srv, client, tmp_path):
    commit = lambda c, aid: c._call("Commit", pb.CommitRequest(  # noqa: E731
        session=c.session, allocation_id=aid))
    _expect("NOT_FOUND", "unknown allocation 999999", lambda: commit(client, 999999))
    a = _allocate(client)
    other = Client(srv.socket, rpc_timeout=10)
    try:
        _expect("PERMISSION_DENIED", "belongs to another session",
                lambda: commit(other, a.allocation_id))
        _expect("PERMISSION_DENIED", "belongs to another session", lambda: other._call(
            "Abort", pb.AbortRequest(session=other.session, allocation_id=a.allocation_id)))
        _expect("PERMISSION_DENIED", "not allocated to or leased by this session",
                lambda: other._request_fd(a.buffer_id))
    finally:
        other.close()
    commit(client, a.allocation_id)
    _expect("FAILED_PRECONDITION", "already committed", lambda: commit(client, a.allocation_id))
    b = _allocate(client, path="/ckpt/b.pt")
    client._call("Abort", pb.AbortRequest(session=client.session, allocation_id=b.allocation_id))
    _expect("FAILED_PRECONDITION", "aborted", lambda: commit(client, b.allocation_id))
    _still_serving(srv, tmp_path)


def test_records_outside_the_file(srv, client, tmp_path):
    a = _allocate(client, size=4096)
    bad = pb.Record(name="x/data/0", header_offset=0, data_offset=64, size=8192)
    _expect("INVALID_ARGUMENT", "record", lambda: client._call("Commit", pb.CommitRequest(
        session=client.session, allocation_id=a.allocation_id, records=[bad])))
    # the allocation is still pending and can be committed correctly
    ok = pb.Record(name="x/data/0", header_offset=0, data_offset=64, size=100)
    client._call("Commit", pb.CommitRequest(
        session=client.session, allocation_id=a.allocation_id, records=[ok]))
    _still_serving(srv, tmp_path)


def test_unknown_buffer_fd(srv, client, tmp_path):
    _expect("NOT_FOUND", "", lambda: client._request_fd(123456))
    _still_serving(srv, tmp_path)


def test_malformed_grpc_message(srv, tmp_path):
    channel = grpc.insecure_channel("unix:" + srv.socket)
    call = channel.unary_unary("/tce.v1.Cache/Allocate")  # raw bytes in and out
    with pytest.raises(grpc.RpcError) as ei:
        call(b"\xff\xff\xff\xff\x0f garbage", timeout=10)
    assert ei.value.code() != grpc.StatusCode.OK
    channel.close()
    _still_serving(srv, tmp_path)


def test_garbage_on_fd_socket_ends_only_that_session(srv, client, tmp_path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(srv.socket + ".fd")
    hello = pb.SessionHello.FromString(s.recv(4096))
    assert hello.code == 0 and hello.session
    s.send(b"\xff" * 100)
    s.settimeout(10)
    assert s.recv(4096) == b""  # the server hung up on this session
    s.close()
    _allocate(client)  # other sessions are unaffected
    _still_serving(srv, tmp_path)


def test_killed_client_pending_buffer_is_reclaimed(srv, tmp_path):
    code = f"""
import mmap, os, signal
from tce.core._client import Client
from tce.v1 import tce_pb2 as pb
c = Client({srv.socket!r}, rpc_timeout=10)
a = c._call("Allocate", pb.AllocateRequest(session=c.session, job="dead", tag="t",
            path="/ckpt/dead.pt", size=8 << 20))
fd = c._request_fd(a.buffer_id)
m = mmap.mmap(fd, a.capacity)
m[:4] = b"PK\\x03\\x04"
print("allocated", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == -signal.SIGKILL and "allocated" in p.stdout, p.stderr
    c = Client(srv.socket, rpc_timeout=10)
    try:
        st = until(lambda: (lambda st: None if st.pending_bytes else st)(c.status()), timeout=60,
                   what="the dead client's allocation to be aborted")
        assert st.pending_bytes == 0 and st.sessions == 1
        assert [f.path for f in c.list(job="dead")] == []
        reused = st.buffers_reused
        _allocate(c, size=8 << 20)  # the dead client's buffer serves the next writer
        assert c.status().buffers_reused == reused + 1
    finally:
        c.close()
    _still_serving(srv, tmp_path)


def test_peer_uid_not_allowed(make_server, tmp_path):
    # Allow only a uid that is not ours: the handshake refuses the session.
    from tce.tools._server import LocalServer

    s = LocalServer(memory_budget="16MiB", extra_args=["--allowed-uids", str(os.getuid() + 4242)])
    s.start()
    try:
        with pytest.raises(tce.PermissionDeniedError, match="uid"):
            Client(s.socket, rpc_timeout=10)
    finally:
        s.stop()
        s.cleanup()


# ---- strict input at the boundary: every string and number, checked once ----

_LONG_PATH = "/" + "/".join(["d" * 200] * 21)  # 4221 bytes, every component short
_LONG_COMPONENT = "/ckpt/" + "c" * 256 + ".pt"


def _requests(session):
    """(rpc, request builder taking (job, tag, path)) for every control RPC
    with a job, tag or path."""
    return {
        "Allocate": lambda j, t, p: pb.AllocateRequest(session=session, job=j, tag=t, path=p, size=10),
        "Lookup": lambda j, t, p: pb.LookupRequest(session=session, job=j, path=p),
        "Remove": lambda j, t, p: pb.RemoveRequest(session=session, job=j, path=p),
        "Wait": lambda j, t, p: pb.WaitRequest(session=session, job=j, paths=["/ok.pt", p], timeout_s=1),
        "CommitTag": lambda j, t, p: pb.CommitTagRequest(session=session, tag=pb.TagInfo(
            job=j, tag=t or "t", world_size=1, files=[pb.TagFile(rank=0, path=p, size=1)])),
        "List": lambda j, t, p: pb.ListRequest(job=j, tag=t),
        "ListTags": lambda j, t, p: pb.ListTagsRequest(job=j),
        "SetRing": lambda j, t, p: pb.SetRingRequest(session=session, job=j, node_rank=0,
                                                     endpoints=["127.0.0.1:1"]),
        "Prefetch": lambda j, t, p: pb.PrefetchRequest(session=session, job=j, paths=[p]),
    }


# (what, job, tag, path, the start of the message for each RPC)
_BAD = [
    ("nul-path", "j", "t", "/ckpt/a\x00b.pt", "path: contains NUL"),
    ("long-path", "j", "t", _LONG_PATH, "path: is 4221 bytes, longer than 4096"),
    ("long-component", "j", "t", _LONG_COMPONENT, "path: has a component of 259 bytes, longer than 255"),
    ("nul-job", "a\x00b", "t", "/ckpt/a.pt", "job: contains NUL"),
    ("long-job", "j" * 256, "t", "/ckpt/a.pt", "job: is 256 bytes, longer than 255"),
    ("nul-tag", "j", "t\x00u", "/ckpt/a.pt", "tag: contains NUL"),
    ("long-tag", "j", "t" * 256, "/ckpt/a.pt", "tag: is 256 bytes, longer than 255"),
]
# Where each RPC carries the field (a field an RPC lacks is not tested on it).
_FIELD_PREFIX = {"Wait": {"path": "paths[1]"}, "Prefetch": {"path": "paths[0]"}, "CommitTag": {"path": "tag.files[0].path",
                                                             "job": "tag.job", "tag": "tag.tag"}}
_HAS = {"Allocate": "jtp", "Lookup": "jp", "Remove": "jp", "Wait": "jp", "CommitTag": "jtp",
        "List": "jt", "ListTags": "j", "SetRing": "j", "Prefetch": "jp"}


@pytest.mark.parametrize("what,job,tag,path,message", _BAD, ids=[b[0] for b in _BAD])
def test_bad_strings_are_refused_naming_the_field(srv, client, tmp_path, what, job, tag, path, message):
    field = what.split("-")[-1] if what.split("-")[-1] in ("path", "job", "tag") else "path"
    tried = 0
    for rpc, make in _requests(client.session).items():
        if field[0] not in _HAS[rpc]:
            continue
        named = _FIELD_PREFIX.get(rpc, {}).get(field, field)
        expected = named + message[len(field):]
        _expect("INVALID_ARGUMENT", expected, lambda: client._call(rpc, make(job, tag, path)))
        tried += 1
    assert tried >= 3
    _still_serving(srv, tmp_path)


def _raw_call(srv, rpc, request, placeholder: bytes, bad: bytes):
    """Sends `request` with `placeholder` replaced by `bad` (same length, so
    every length prefix holds): bytes no protobuf library would encode."""
    assert len(placeholder) == len(bad)
    raw = request.SerializeToString()
    assert raw.count(placeholder) == 1
    channel = grpc.insecure_channel("unix:" + srv.socket)
    try:
        with pytest.raises(grpc.RpcError) as ei:
            channel.unary_unary(f"/tce.v1.Cache/{rpc}")(raw.replace(placeholder, bad), timeout=10)
        return ei.value.code(), ei.value.details()
    finally:
        channel.close()


@pytest.mark.parametrize("rpc,field", [
    ("Allocate", "tce.v1.AllocateRequest.path"), ("Allocate", "tce.v1.AllocateRequest.job"),
    ("Lookup", "tce.v1.LookupRequest.path"), ("Remove", "tce.v1.RemoveRequest.path"),
    ("Wait", "tce.v1.WaitRequest.paths"), ("CommitTag", "tce.v1.TagFile.path"),
    ("CommitTag", "tce.v1.TagInfo.tag"), ("List", "tce.v1.ListRequest.job"),
    ("ListTags", "tce.v1.ListTagsRequest.job"), ("SetRing", "tce.v1.SetRingRequest.job"),
    ("Prefetch", "tce.v1.PrefetchRequest.paths"),
])
def test_non_utf8_strings_are_refused_naming_the_field(srv, client, tmp_path, rpc, field):
    name = field.rsplit(".", 1)[1]
    job, tag, path = "jobAAAA", "tagAAAA", "/ckpt/AAAA.pt"
    if name in ("path", "paths"):
        path = "/ckpt/QQQQ.pt"
    elif name == "job":
        job = "jobQQQQ"
    else:
        tag = "tagQQQQ"
    request = _requests(client.session)[rpc](job, tag, path)
    code, details = _raw_call(srv, rpc, request, b"QQQQ", b"\xff\xfe\xc0\x80")
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert details == f"{name}: is not valid UTF-8 (field {field})"
    _still_serving(srv, tmp_path)


def test_unparseable_request_is_invalid_argument(srv, tmp_path):
    channel = grpc.insecure_channel("unix:" + srv.socket)
    with pytest.raises(grpc.RpcError) as ei:
        channel.unary_unary("/tce.v1.Cache/Commit")(b"\xff\xff\xff\xff\x0f garbage", timeout=10)
    channel.close()
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert ei.value.details() == "malformed request to /tce.v1.Cache/Commit: not a valid protobuf message"
    _still_serving(srv, tmp_path)


@pytest.mark.parametrize("rpc,request_,message", [
    ("Allocate", lambda s: pb.AllocateRequest(session=s, job="j", path="/a.pt", size=1, rank=-1),
     "rank: must be in [0, 1048576), got -1"),
    ("CommitTag", lambda s: pb.CommitTagRequest(session=s, tag=pb.TagInfo(
        job="j", tag="t", world_size=-5, files=[pb.TagFile(rank=0, path="/a.pt", size=1)])),
     "tag.world_size: must be in [1, 1048576], got -5"),
    ("CommitTag", lambda s: pb.CommitTagRequest(session=s, tag=pb.TagInfo(
        job="j", tag="t", world_size=2, files=[pb.TagFile(rank=-1, path="/a.pt", size=1)])),
     "tag.files[0].rank: must be in [0, 1048576), got -1"),
    ("SetRing", lambda s: pb.SetRingRequest(session=s, job="j", node_rank=-1, endpoints=["h:1"]),
     "node_rank: must be in [0, 1048576), got -1"),
    ("SetRing", lambda s: pb.SetRingRequest(session=s, job="j", node_rank=0, endpoints=["h:1\x00x"]),
     "endpoints[0]: contains NUL"),
    ("Commit", lambda s: pb.CommitRequest(session=s, allocation_id=1,
                                          records=[pb.Record(name="a\x00b")]),
     "records[0].name: contains NUL"),
    ("Abort", lambda s: pb.AbortRequest(session="s" * 200, allocation_id=1),
     "session: is 200 bytes, longer than 128"),
    ("Wait", lambda s: pb.WaitRequest(session=s, job="j", paths=["/a.pt"], timeout_s=float("nan")),
     "timeout_s: is NaN"),
    ("Prefetch", lambda s: pb.PrefetchRequest(session=s, job="j"), "a prefetch names a dir or paths"),
    ("Prefetch", lambda s: pb.PrefetchRequest(session=s, job="j", dir="/a\x00b"), "dir: contains NUL"),
])
def test_bad_numbers_and_other_fields(srv, client, tmp_path, rpc, request_, message):
    _expect("INVALID_ARGUMENT", message, lambda: client._call(rpc, request_(client.session)))
    _still_serving(srv, tmp_path)


def _server_with_a_blocked_dir(tmp_path, *extra):
    """A server whose storage cannot take blocked/x.pt (a Blocker): a save
    there stays CACHED (persist retries every 50 ms) until the test releases
    `s.blocker`."""
    from tce.tools._server import LocalServer

    storage = tmp_path / "s"
    storage.mkdir()
    s = LocalServer(memory_budget="64MiB", storage_roots=[str(storage)],
                    extra_args=["--persist-retries", "100", "--persist-backoff-ms", "50", *extra]).start()
    s.blocker = Blocker(storage / "blocked" / "x.pt")
    return s, storage


@pytest.mark.parametrize("timeout_s", [1e10, float("inf"), 0.0, -1.0, -float("inf")])
def test_wait_without_a_usable_limit_waits_until_persisted(tmp_path, timeout_s):
    import threading

    # One Wait may block at a time: while the Wait under test blocks, a
    # second is refused, which shows that the server holds it.
    s, storage = _server_with_a_blocked_dir(tmp_path, "--max-waits", "1")
    target = storage / "blocked" / "x.pt"
    try:
        with _knobs.override(socket=s.socket, on_unavailable="raise", job="w"):
            tce.save({"x": torch.arange(5)}, target)
            c = Client(s.socket, rpc_timeout=60)
            result = {}

            def wait():
                while True:
                    try:
                        result["files"] = c._call("Wait", pb.WaitRequest(
                            session=c.session, job="w", paths=[str(target)], timeout_s=timeout_s)).files
                        return
                    except TCEError as e:
                        if e.code != "RESOURCE_EXHAUSTED":  # else the probe held the slot a moment: again
                            result["error"] = e
                            return

            t = threading.Thread(target=wait)
            t.start()
            probe = Client(s.socket, rpc_timeout=60)

            def blocked() -> bool:
                if not t.is_alive():
                    return True  # it returned: asserted below
                try:  # 1 ms: answered at once whenever the slot is free
                    probe._call("Wait", pb.WaitRequest(session=probe.session, job="w", paths=[str(target)],
                                                       timeout_s=1e-9))
                except TCEError as e:
                    if e.code == "RESOURCE_EXHAUSTED":
                        return True
                    assert e.code == "DEADLINE_EXCEEDED", e
                return False

            until(blocked, timeout=60, what=f"Wait({timeout_s}) to block")
            probe.close()
            assert t.is_alive() and not result, f"Wait({timeout_s}) returned at once: {result}"
            s.blocker.release()
            t.join(60)  # bounds a hang only
            assert not t.is_alive()
            assert "error" not in result, result
            assert [f.state for f in result["files"]] == [pb.FILE_STATE_PERSISTED]
            c.close()
            tce.close()
        assert torch.equal(torch.load(target)["x"], torch.arange(5))
    finally:
        s.blocker.release()
        s.stop()
        s.cleanup()


def test_wait_with_a_tiny_timeout_times_out_and_nan_is_refused(tmp_path):
    s, storage = _server_with_a_blocked_dir(tmp_path)
    target = storage / "blocked" / "x.pt"
    try:
        with _knobs.override(socket=s.socket, on_unavailable="raise", job="w"):
            tce.save({"x": torch.arange(5)}, target)
            tce.close()
        c = Client(s.socket, rpc_timeout=10)
        wait = lambda t: c._call("Wait", pb.WaitRequest(  # noqa: E731
            session=c.session, job="w", paths=[str(target)], timeout_s=t))
        # The server's answer (not the client's 10 s deadline): 1 ms, not "forever".
        _expect("DEADLINE_EXCEEDED", "not persisted yet", lambda: wait(1e-9))
        t0 = time.monotonic()
        _expect("DEADLINE_EXCEEDED", "not persisted yet", lambda: wait(0.3))
        assert time.monotonic() - t0 >= 0.3  # it waited its timeout
        _expect("INVALID_ARGUMENT", "timeout_s: is NaN", lambda: wait(float("nan")))
        c.close()
    finally:
        s.blocker.release()
        s.stop()
        s.cleanup()


def test_save_to_a_non_utf8_path_writes_it_directly(srv, tmp_path, monkeypatch):
    """The protocol names files in UTF-8; a path made of other bytes is saved
    with plain torch.save (warned), loaded from disk, and never cached."""
    from tce import _service

    monkeypatch.setattr(_service, "_warned_fallback", False)
    raw = os.fsencode(tmp_path) + b"/ckpt-\xff\xfe.pt"
    path = os.fsdecode(raw)  # '...ckpt-\udcff\udcfe.pt'
    sd = {"w": torch.arange(6.0)}
    with _knobs.override(socket=srv.socket, on_unavailable="fallback", job="utf8"):
        with pytest.warns(RuntimeWarning, match="is not valid UTF-8"):
            assert tce.save(sd, path) is None
        assert os.path.exists(raw)
        with open(raw, "rb") as f:
            assert torch.equal(torch.load(f)["w"], sd["w"])
        assert torch.equal(tce.load(path)["w"], sd["w"])
        assert not tce.cached(path)
        tce.wait([path])  # nothing to wait for: it is on disk already
    c = Client(srv.socket, rpc_timeout=10)
    assert c.list(job="utf8") == []
    c.close()
    _still_serving(srv, tmp_path)


def test_save_to_a_non_utf8_path_raises_under_on_unavailable_raise(srv, tmp_path):
    raw = os.fsencode(tmp_path) + b"/strict-\xff.pt"
    with _knobs.override(socket=srv.socket, on_unavailable="raise"):
        with pytest.raises(tce.InvalidArgumentError, match="is not valid UTF-8") as ei:
            tce.save({"w": torch.ones(2)}, os.fsdecode(raw))
    assert ei.value.code == "INVALID_ARGUMENT"
    assert not os.path.exists(raw)
    _still_serving(srv, tmp_path)


def test_load_of_a_path_the_server_refuses_reads_the_disk(srv, tmp_path):
    path = tmp_path / "new\nline.pt"  # a control character: never cacheable
    torch.save({"w": torch.arange(3)}, path)
    with _knobs.override(socket=srv.socket, on_unavailable="raise"):
        assert torch.equal(tce.load(path)["w"], torch.arange(3))


def test_an_error_shows_the_servers_code_and_none_of_its_own():
    """A status from the server reads 'CODE: message'; an error the client
    raises itself has no code to show (no 'UNKNOWN:' in front)."""
    from tce.errors import error_for

    assert str(error_for("NOT_FOUND", "no such file")) == "NOT_FOUND: no such file"
    assert str(TCEError("no recoverable checkpoint in /ckpt")) == "no recoverable checkpoint in /ckpt"
    assert str(TCEError("x", code="DATA_LOSS")) == "DATA_LOSS: x"
