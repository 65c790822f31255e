"""Run a snippet against a tce-server as another local user (tests only).

    python tests/as_user.py USER < snippet.py     (started as root)

Every module is imported first, as root, because the interpreter may live
where USER cannot read (pyenv under /root, 0700); then the process drops to
USER's uid, gid and groups for good and runs the snippet, so every socket it
opens carries USER's credentials (SO_PEERCRED) and every file it touches is
checked against USER's permissions. The snippet sees ``Session`` (a raw
client: the fd socket plus gRPC, nothing hidden), ``pb``, ``pb_grpc``,
``grpc`` and ``result``, a
dict printed as JSON on stdout at the end. Run as ``root`` it does not drop.
"""

from __future__ import annotations

import json
import mmap
import os
import pwd
import socket
import sys
import types

import array  # noqa: F401  (socket.recv_fds needs it; nothing may load after the drop)
import grpc
from grpc import _channel  # noqa: F401  (imported lazily by insecure_channel)

# tce/__init__ imports torch; the generated modules need none of it.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if "tce" not in sys.modules:
    _pkg = types.ModuleType("tce")
    _pkg.__path__ = [os.path.join(_REPO, "tce")]
    sys.modules["tce"] = _pkg
from tce.v1 import tce_pb2 as pb  # noqa: E402
from tce.v1 import tce_pb2_grpc as pb_grpc  # noqa: E402

_CODES = {sc.value[0]: sc.name for sc in grpc.StatusCode}


class Refused(Exception):
    """The fd socket refused the session (SessionHello with a code)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{_CODES.get(code, code)}: {message}")
        self.code = _CODES.get(code, str(code))
        self.message = message


class Session:
    """One session: the fd-socket connection and a gRPC channel."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.fd_sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.fd_sock.connect(socket_path + ".fd")
        hello = pb.SessionHello.FromString(self.fd_sock.recv(4096))
        if hello.code:
            self.fd_sock.close()
            raise Refused(hello.code, hello.message)
        self.id = hello.session
        self.channel = grpc.insecure_channel("unix:" + socket_path)
        self.stub = pb_grpc.CacheStub(self.channel)

    def call(self, method: str, request, timeout: float = 30) -> tuple[str, str, object]:
        """(code name, message, response or None); never raises for a status."""
        try:
            return "OK", "", getattr(self.stub, method)(request, timeout=timeout)
        except grpc.RpcError as e:
            return e.code().name, e.details() or "", None

    def fd(self, buffer_id: int) -> tuple[int, int, bool]:
        """(fd, capacity, writable) for a buffer this session writes or leases."""
        self.fd_sock.send(pb.FdRequest(buffer_id=buffer_id).SerializeToString())
        packet, fds, _, _ = socket.recv_fds(self.fd_sock, 4096, 1)
        reply = pb.FdReply.FromString(packet)
        if reply.code:
            raise Refused(reply.code, reply.message)
        return fds[0], reply.capacity, reply.writable

    def range_buffer(self) -> tuple[int, int]:
        """(read-only fd, size) of this session's range buffer (ReadRange
        with into_buffer puts the bytes there)."""
        self.fd_sock.send(pb.FdRequest(range_buffer=True).SerializeToString())
        packet, fds, _, _ = socket.recv_fds(self.fd_sock, 4096, 1)
        reply = pb.FdReply.FromString(packet)
        if reply.code:
            raise Refused(reply.code, reply.message)
        return fds[0], reply.capacity

    def save(self, job: str, path: str, data: bytes, *, tag: str = "t") -> dict:
        """Allocate, write `data`, commit. Returns the buffer id and capacity."""
        code, msg, a = self.call("Allocate", pb.AllocateRequest(
            session=self.id, job=job, tag=tag, path=path, size=len(data)))
        if code != "OK":
            return {"code": code, "message": msg}
        fd, capacity, _ = self.fd(a.buffer_id)
        with mmap.mmap(fd, capacity, flags=mmap.MAP_SHARED) as m:
            m[: len(data)] = data
        os.close(fd)
        code, msg, _ = self.call("Commit", pb.CommitRequest(
            session=self.id, allocation_id=a.allocation_id))
        return {"code": code, "message": msg, "buffer_id": a.buffer_id, "capacity": capacity}

    def read(self, job: str, path: str) -> tuple[str, str, bytes]:
        """Lookup with a lease, then the file's bytes through the fd."""
        code, msg, r = self.call("Lookup", pb.LookupRequest(
            session=self.id, job=job, path=path, lease=True))
        if code != "OK":
            return code, msg, b""
        fd, _, _ = self.fd(r.file.buffer_id)
        with mmap.mmap(fd, r.file.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) as m:
            data = bytes(m)
        os.close(fd)
        self.call("Release", pb.ReleaseRequest(session=self.id, lease_ids=[r.lease_id]))
        return code, msg, data

    def close(self) -> None:
        self.channel.close()
        self.fd_sock.close()


def drop_to(user: str) -> None:
    """Become `user` for good (uid, gid and supplementary groups)."""
    if user == "root":
        return
    pw = pwd.getpwnam(user)
    os.setgroups(os.getgrouplist(user, pw.pw_gid))
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)
    assert os.getuid() == pw.pw_uid and os.geteuid() == pw.pw_uid


def main() -> None:
    code = sys.stdin.read()
    drop_to(sys.argv[1])
    result: dict = {"uid": os.getuid()}
    exec(compile(code, "<snippet>", "exec"),
         {"Session": Session, "Refused": Refused, "pb": pb, "pb_grpc": pb_grpc, "grpc": grpc,
          "result": result, "os": os, "socket": socket, "mmap": mmap})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
