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
from tce import _knobs
from tce._client import Client
from tce.errors import TCEError
from tce.v1 import tce_pb2 as pb


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
from tce._client import Client
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
        deadline = time.monotonic() + 10
        while c.status().pending_bytes and time.monotonic() < deadline:
            time.sleep(0.05)
        st = c.status()
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
    from tce._server import LocalServer

    s = LocalServer(memory_budget="16MiB", extra_args=["--allowed-uids", str(os.getuid() + 4242)])
    s.start()
    try:
        with pytest.raises(tce.PermissionDeniedError, match="uid"):
            Client(s.socket, rpc_timeout=10)
    finally:
        s.stop()
        s.cleanup()
