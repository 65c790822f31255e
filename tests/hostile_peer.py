"""A peer that does not play by the ring's rules, for the attack tests.

It speaks the ring's wire format (each message a 4-byte little-endian
length and a protobuf) from Python sockets: a byte relay, raw length
prefixes, slow senders, and a "peer" that knows the token but lies in what
it sends back. All its traffic stays on loopback; every loop is bounded.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import select
import socket
import struct
import threading
import time
import zlib

from tce.v1 import tce_pb2 as pb

# The handshake the lying peer speaks: 2, the servers' protocol. Set
# HOSTILE_PEER_PROTOCOL=1 to run the attack tests against a server that
# speaks the first protocol (the tests then show what it let through).
PROTOCOL = int(os.environ.get("HOSTILE_PEER_PROTOCOL", "2"))


def frame(msg) -> bytes:
    body = msg.SerializeToString()
    return struct.pack("<I", len(body)) + body


def recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return bytes(out)


def recv_msg(sock: socket.socket, cls):
    (n,) = struct.unpack("<I", recv_exact(sock, 4))
    msg = cls()
    msg.ParseFromString(recv_exact(sock, n))
    return msg


def dial(endpoint: str, *, source: str = "127.0.0.1", timeout: float = 5.0) -> socket.socket:
    host, port = endpoint.rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.bind((source, 0))
    s.connect((host, int(port)))
    return s


def closed_by_peer(socks: list[socket.socket]) -> int:
    """How many of `socks` the other end has closed (EOF or reset), checked
    without waiting. For sockets the other end sends nothing on (a server
    still waiting for a connector's hello): readable means closed."""
    poller = select.poll()
    for s in socks:
        poller.register(s, select.POLLIN)
    return len(poller.poll(0))


def proof(token: str, direction: bytes, cn: bytes, an: bytes, connector: str, acceptor: str) -> bytes:
    """The ring's protocol-2 proof (see ring/peer_link.h)."""
    data = b"tce-ring-proof-v2" + direction
    for field in (cn, an, connector.encode(), acceptor.encode()):
        data += struct.pack("<I", len(field)) + field
    return hmac.new(token.encode(), data, hashlib.sha256).digest()


class Relay:
    """Listens on loopback and pipes every connection, byte for byte, to
    `target`, counting the bytes that came from the connecting side."""

    def __init__(self, target: str):
        self.target = target
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.endpoint = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.bytes_in = 0
        self.connections = 0
        self._stop = False
        self._threads: list[threading.Thread] = []
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self._threads.append(t)

    def _accept(self) -> None:
        self.listener.settimeout(0.2)
        while not self._stop:
            try:
                a, _ = self.listener.accept()
            except (socket.timeout, OSError):
                continue
            self.connections += 1
            try:
                b = dial(self.target)
            except OSError:
                a.close()
                continue
            for src, dst, count in ((a, b, True), (b, a, False)):
                t = threading.Thread(target=self._pipe, args=(src, dst, count), daemon=True)
                t.start()
                self._threads.append(t)

    def _pipe(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        src.settimeout(0.5)
        deadline = time.monotonic() + 60
        try:
            while not self._stop and time.monotonic() < deadline:
                try:
                    data = src.recv(1 << 16)
                except socket.timeout:
                    continue
                if not data:
                    break
                if count:
                    self.bytes_in += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop = True
        self.listener.close()
        for t in self._threads:
            t.join(timeout=2)


class LyingPeer:
    """Knows the token and answers a recovering server's list and fetch, but
    with a file of its own choosing: `listed` is the path it says it holds,
    `sent` the path its header names, `data` the bytes, `tags` complete tags
    it lists too. Serves connections until closed (one link; the server
    under test uses --ring-streams 1)."""

    def __init__(self, token: str, job: str, listed: str, sent: str, data: bytes,
                 tags: list | None = None):
        self.token, self.job, self.listed, self.sent, self.data = token, job, listed, sent, data
        self.tags = tags or []
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.endpoint = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.fetches = 0
        self.errors: list[str] = []
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(0.2)
        deadline = time.monotonic() + 60
        while not self._stop and time.monotonic() < deadline:
            try:
                conn, _ = self.listener.accept()
            except (socket.timeout, OSError):
                continue
            conn.settimeout(5)
            try:
                self._link(conn)
            except (OSError, ConnectionError) as e:
                self.errors.append(repr(e))
            finally:
                conn.close()

    def _link(self, conn: socket.socket) -> None:
        self._handshake(conn)
        while True:
            req = recv_msg(conn, pb.PeerRequest)
            kind = req.WhichOneof("body")
            if kind == "list":
                conn.sendall(frame(pb.PeerListReply(files=[
                    pb.PeerBackup(job=self.job, path=self.listed, size=len(self.data))],
                    tags=self.tags)))
            elif kind == "fetch":
                self.fetches += 1
                self._send_file(conn, self.sent)
            else:
                conn.sendall(frame(pb.PeerReply(code=0)))

    def _send_file(self, conn: socket.socket, path: str) -> None:
        conn.sendall(frame(pb.PeerReply(code=0)))
        conn.sendall(frame(pb.PeerBackup(job=self.job, tag="t", path=path, size=len(self.data), version=1)))
        conn.sendall(self.data)

    def _handshake(self, conn: socket.socket) -> None:
        hello = recv_msg(conn, pb.PeerHello)
        nonce = os.urandom(32)
        conn.sendall(frame(pb.PeerHello(nonce=nonce, endpoint=self.endpoint, version=PROTOCOL)))
        recv_msg(conn, pb.PeerAuth)  # the connector's proof: a liar does not care
        if PROTOCOL == 1:  # the servers' first protocol, to show what it let through
            mac = hmac.new(self.token.encode(), b"S" + hello.nonce, hashlib.sha256).digest()
        else:
            mac = proof(self.token, b"A", hello.nonce, nonce, hello.endpoint, self.endpoint)
        conn.sendall(frame(pb.PeerAuth(mac=mac)))

    def close(self) -> None:
        self._stop = True
        self.listener.close()
        self._thread.join(timeout=5)


class HoldingPeer(LyingPeer):
    """Lists `paths` as the recovering server's files and sends each asked
    for, but holds its answer for `held` until `release` is set: the
    server's restore stays under way between two files."""

    def __init__(self, token: str, job: str, paths: list[str], held: str, data: bytes):
        self.paths, self.held, self.release = paths, held, threading.Event()
        super().__init__(token, job, paths[0], paths[0], data)

    def _link(self, conn: socket.socket) -> None:
        self._handshake(conn)
        conn.settimeout(None)  # the held answer waits for the test
        while True:
            req = recv_msg(conn, pb.PeerRequest)
            kind = req.WhichOneof("body")
            if kind == "list":
                conn.sendall(frame(pb.PeerListReply(files=[
                    pb.PeerBackup(job=self.job, path=p, size=len(self.data)) for p in self.paths])))
            elif kind == "fetch":
                self.fetches += 1
                if req.fetch.path == self.held:
                    self.release.wait(120)
                self._send_file(conn, req.fetch.path)
            else:
                conn.sendall(frame(pb.PeerReply(code=0)))


class SilentPeer:
    """Knows the token, completes the handshake as an acceptor, then reads
    what it is asked and never answers. `closed`: how many of its
    connections the other end has closed."""

    def __init__(self, token: str, host: str = "127.0.0.1"):
        self.token = token
        self.listener = socket.socket()
        self.listener.bind((host, 0))
        self.listener.listen(4)
        self.endpoint = f"{host}:{self.listener.getsockname()[1]}"
        self.asked = 0
        self.closed = 0
        self._stop = False
        self._threads: list[threading.Thread] = []
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self._threads.append(t)

    def _accept(self) -> None:
        self.listener.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = self.listener.accept()
            except (socket.timeout, OSError):
                continue
            t = threading.Thread(target=self._link, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _link(self, conn: socket.socket) -> None:
        conn.settimeout(0.2)
        deadline = time.monotonic() + 300
        try:
            conn.settimeout(5)
            hello = recv_msg(conn, pb.PeerHello)
            nonce = os.urandom(32)
            conn.sendall(frame(pb.PeerHello(nonce=nonce, endpoint=self.endpoint, version=PROTOCOL)))
            recv_msg(conn, pb.PeerAuth)
            conn.sendall(frame(pb.PeerAuth(mac=proof(self.token, b"A", hello.nonce, nonce, hello.endpoint,
                                                     self.endpoint))))
            conn.settimeout(0.2)
            while not self._stop and time.monotonic() < deadline:
                try:
                    data = conn.recv(1 << 16)
                except socket.timeout:
                    continue
                if not data:
                    self.closed += 1
                    return
                self.asked += 1
        except (OSError, ConnectionError):
            self.closed += 1
        finally:
            conn.close()

    def close(self) -> None:
        self._stop = True
        self.listener.close()
        for t in self._threads:
            t.join(timeout=2)


class AlteringChainNode:
    """A node of a chain of following nodes: it knows the token, the job's
    owner granted it, and it changes the bytes it passes on. It answers a
    following node's PeerVersion with the reply of `upstream` (asked as
    itself), and each PeerReadRange with the bytes `upstream` gives it, the
    byte `from_end` bytes before the file's end inverted, with the CRC-32 of
    the changed bytes (so each range checks). `altered`: ranges it changed."""

    def __init__(self, token: str, upstream: str, *, from_end: int = 100, host: str = "127.0.0.1"):
        self.token, self.upstream, self.from_end, self.host = token, upstream, from_end, host
        self.listener = socket.socket()
        self.listener.bind((host, 0))
        self.listener.listen(4)
        self.endpoint = f"{host}:{self.listener.getsockname()[1]}"
        self.altered = 0
        self.errors: list[str] = []
        self._stop = False
        self._threads: list[threading.Thread] = []
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self._threads.append(t)

    def _accept(self) -> None:
        self.listener.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = self.listener.accept()
            except (socket.timeout, OSError):
                continue
            t = threading.Thread(target=self._link, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _link(self, conn: socket.socket) -> None:
        up = None
        try:
            conn.settimeout(5)
            hello = recv_msg(conn, pb.PeerHello)
            nonce = os.urandom(32)
            conn.sendall(frame(pb.PeerHello(nonce=nonce, endpoint=self.endpoint, version=PROTOCOL)))
            recv_msg(conn, pb.PeerAuth)
            conn.sendall(frame(pb.PeerAuth(mac=proof(self.token, b"A", hello.nonce, nonce, hello.endpoint,
                                                     self.endpoint))))
            up = connect_with_token(self.upstream, self.token, self.endpoint, source=self.host)
            conn.settimeout(60)
            up.settimeout(60)
            deadline = time.monotonic() + 300
            while not self._stop and time.monotonic() < deadline:
                req = recv_msg(conn, pb.PeerRequest)
                kind = req.WhichOneof("body")
                if kind == "version":
                    up.sendall(frame(req))
                    conn.sendall(frame(recv_msg(up, pb.PeerVersionReply)))
                elif kind == "read_range":
                    self._range(conn, up, req.read_range)
                else:
                    conn.sendall(frame(pb.PeerReply(code=12, message="not served here")))
        except (OSError, ConnectionError, PermissionError) as e:
            self.errors.append(repr(e))
        finally:
            conn.close()
            if up is not None:
                up.close()

    def _range(self, conn: socket.socket, up: socket.socket, r) -> None:
        ask = pb.PeerReadRange()
        ask.CopyFrom(r)
        ask.raw = False  # the bytes inside the reply
        up.sendall(frame(pb.PeerRequest(read_range=ask)))
        got = recv_msg(up, pb.PeerRangeReply)
        if got.code:
            conn.sendall(frame(got))
            return
        data = bytearray(got.data)
        at = got.file_size - self.from_end - r.offset
        if 0 <= at < len(data):
            data[at] ^= 0xFF
            self.altered += 1
        reply = pb.PeerRangeReply(code=0, file_size=got.file_size, version=got.version, crc32=zlib.crc32(data))
        if r.raw:
            reply.raw_length = len(data)
            conn.sendall(frame(reply) + bytes(data))
        else:
            reply.data = bytes(data)
            conn.sendall(frame(reply))

    def close(self) -> None:
        self._stop = True
        self.listener.close()
        for t in self._threads:
            t.join(timeout=2)


def connect_with_token(endpoint: str, token: str, me: str, *, source: str = "127.0.0.1") -> socket.socket:
    """A connection to `endpoint` authenticated with `token` (protocol 2),
    announcing `me`, from `source`: a real token holder, for what the token
    alone may not reach. Raises PermissionError when the server refuses it
    (an empty proof) after it proved the token."""
    s = dial(endpoint, source=source)
    nonce = os.urandom(32)
    s.sendall(frame(pb.PeerHello(nonce=nonce, endpoint=me, version=2)))
    theirs = recv_msg(s, pb.PeerHello)
    s.sendall(frame(pb.PeerAuth(mac=proof(token, b"C", nonce, theirs.nonce, me, endpoint))))
    answer = recv_msg(s, pb.PeerAuth)
    if not answer.mac:
        s.close()
        raise PermissionError(f"{endpoint} refused {me} from {source}")
    assert answer.mac == proof(token, b"A", nonce, theirs.nonce, me, endpoint), "the server did not prove itself"
    return s


def cert_transcript(direction: bytes, cn: bytes, an: bytes, connector: str, acceptor: str) -> bytes:
    """What a node certificate signs in a handshake (see PeerCertProof)."""
    data = b"tce-ring-cert-v1" + direction
    for field in (cn, an, connector.encode(), acceptor.encode()):
        data += struct.pack("<I", len(field)) + field
    return data


def connect_with_cert(endpoint: str, token: str, me: str, *, source: str, cert_der: bytes | None,
                      sign) -> socket.socket:
    """As connect_with_token, then the node-certificate step: sends
    `cert_der` (None: says it has no certificate at all) with `sign(data)`
    as its signature. Raises PermissionError when the server refuses."""
    s = dial(endpoint, source=source)
    try:
        nonce = os.urandom(32)
        s.sendall(frame(pb.PeerHello(nonce=nonce, endpoint=me, version=2,
                                     certificate=cert_der is not None)))
        theirs = recv_msg(s, pb.PeerHello)
        s.sendall(frame(pb.PeerAuth(mac=proof(token, b"C", nonce, theirs.nonce, me, endpoint))))
        answer = recv_msg(s, pb.PeerAuth)
        if not answer.mac:
            raise PermissionError(f"{endpoint} refused {me} from {source}")
        if cert_der is not None:
            data = cert_transcript(b"C", nonce, theirs.nonce, me, endpoint)
            s.sendall(frame(pb.PeerCertProof(certificate=cert_der, signature=sign(data))))
            their_cert = recv_msg(s, pb.PeerCertProof)
            if not their_cert.certificate:
                raise PermissionError(f"{endpoint} refused the certificate of {me}")
    except (ConnectionError, OSError) as e:
        s.close()
        if isinstance(e, PermissionError):
            raise
        raise PermissionError(f"{endpoint} closed the connection of {me}: {e}") from e
    return s


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmSize (KiB) and Threads of a process."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmSize", "Threads"):
                out[key] = int(value.split()[0])
    return out
