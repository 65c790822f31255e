"""S3 on loopback for the s3 tests: moto's server (tce.tools._moto) and a
fault-injecting HTTP/1.1 proxy in front of it.

The server under test is given the proxy's endpoint; the test then makes
the endpoint slow down (503 SlowDown), go away, or hold chosen requests
until it says so, and counts the requests of each kind that came by.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
import select
import socket
import struct
import threading
import time
from typing import Callable
from urllib.parse import parse_qs, unquote, urlsplit

from tce.tools._moto import ACCESS_KEY, REGION, SECRET_KEY, MotoServer, credentials_env

__all__ = ["ACCESS_KEY", "SECRET_KEY", "REGION", "MotoServer", "credentials_env", "FaultProxy",
           "Request", "classify"]

_MAX_LINE = 64 << 10  # a request or header line
_MAX_HEADERS = 200
_CHUNK = 1 << 20  # bodies are copied through in pieces of up to this
_IO_TIMEOUT = 300.0  # one socket read or write (a large CompleteMultipartUpload takes moto a while)
_IDLE_TIMEOUT = 120.0  # a keep-alive connection with no request
_MAX_CONNECTIONS = 512

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message>"
             b"<RequestId>TCEFAULTPROXY</RequestId><HostId>tce-fault-proxy</HostId></Error>")


class _BadMessage(Exception):
    pass


class _ClientDone(Exception):
    """The response ended with its connection: close the client's too."""


@dataclasses.dataclass
class Request:
    """What a hold predicate sees. ``query``: each parameter's first value
    ("" for a bare ``?uploads``); ``headers``: names lowercased."""
    method: str
    path: str  # decoded, no query
    query: dict[str, str]
    headers: dict[str, str]
    kind: str
    status: int | None = None  # the status the client got; None: none (dropped, refused)


def classify(method: str, path: str, query: dict[str, str], headers: dict[str, str]) -> str:
    """The S3 operation a path-style request is (``PutObject``,
    ``UploadPart``, ...), from its method, path and query."""
    parts = path.lstrip("/").split("/", 1)
    bucket, key = parts[0], (parts[1] if len(parts) > 1 else "")
    copy = "x-amz-copy-source" in headers
    if not bucket:
        return "ListBuckets" if method == "GET" else f"{method} /"
    if not key:
        table = {"PUT": "CreateBucket", "DELETE": "DeleteBucket", "HEAD": "HeadBucket"}
        if method == "GET":
            if "uploads" in query:
                return "ListMultipartUploads"
            if "versions" in query:
                return "ListObjectVersions"
            if "location" in query:
                return "GetBucketLocation"
            return "ListObjectsV2" if query.get("list-type") == "2" else "ListObjects"
        if method == "POST" and "delete" in query:
            return "DeleteObjects"
        return table.get(method, f"{method} bucket")
    if "uploads" in query and method == "POST":
        return "CreateMultipartUpload"
    if "uploadId" in query:
        if method == "PUT" and "partNumber" in query:
            return "UploadPartCopy" if copy else "UploadPart"
        return {"POST": "CompleteMultipartUpload", "DELETE": "AbortMultipartUpload",
                "GET": "ListParts"}.get(method, f"{method} upload")
    if "tagging" in query:
        return {"GET": "GetObjectTagging", "PUT": "PutObjectTagging",
                "DELETE": "DeleteObjectTagging"}.get(method, f"{method} tagging")
    if method == "PUT":
        return "CopyObject" if copy else "PutObject"
    return {"GET": "GetObject", "HEAD": "HeadObject", "DELETE": "DeleteObject"}.get(
        method, f"{method} object")


class _Stream:
    """A socket read through a small buffer: lines for heads, then bodies
    copied straight from the socket in large pieces."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def readline(self) -> bytes:
        """One line with its end; b"" at a clean end of stream."""
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line = bytes(self.buf[:i + 1])
                del self.buf[:i + 1]
                return line
            if len(self.buf) > _MAX_LINE:
                raise _BadMessage("line too long")
            got = self.sock.recv(64 << 10)
            if not got:
                if self.buf:
                    raise _BadMessage("stream ended mid-line")
                return b""
            self.buf += got

    def copy(self, n: int, out: socket.socket | None, scratch: memoryview) -> None:
        """Moves exactly n bytes to ``out`` (None: discards them)."""
        if self.buf:
            take = min(n, len(self.buf))
            if out is not None:
                out.sendall(self.buf[:take])
            del self.buf[:take]
            n -= take
        while n:
            got = self.sock.recv_into(scratch, min(n, len(scratch)))
            if not got:
                raise _BadMessage("stream ended mid-body")
            if out is not None:
                out.sendall(scratch[:got])
            n -= got


def _read_head(stream: _Stream) -> tuple[str, list[tuple[str, str]], bytes] | None:
    """(first line, headers, raw head bytes), or None at a clean end."""
    first = stream.readline()
    while first in (b"\r\n", b"\n"):  # tolerated before a request (RFC 9112 2.2)
        first = stream.readline()
    if not first:
        return None
    raw = [first]
    headers = []
    while True:
        line = stream.readline()
        if not line:
            raise _BadMessage("stream ended in the head")
        raw.append(line)
        if line in (b"\r\n", b"\n"):
            break
        if len(headers) >= _MAX_HEADERS:
            raise _BadMessage("too many headers")
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep:
            raise _BadMessage(f"bad header line {line[:80]!r}")
        headers.append((name.strip().lower(), value.strip()))
    return first.decode("latin-1").strip(), headers, b"".join(raw)


def _copy_body(stream: _Stream, headers: dict[str, str], out: socket.socket | None,
               scratch: memoryview, *, until_close: bool = False) -> None:
    """Copies one message body as framed (chunked, Content-Length, or to the
    end of the stream)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            line = stream.readline()
            if not line:
                raise _BadMessage("stream ended in a chunk size")
            if out is not None:
                out.sendall(line)
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                raise _BadMessage(f"bad chunk size {line[:40]!r}") from None
            if size == 0:
                while True:  # trailers, then the empty line
                    line = stream.readline()
                    if not line:
                        raise _BadMessage("stream ended in the trailers")
                    if out is not None:
                        out.sendall(line)
                    if line in (b"\r\n", b"\n"):
                        return
            stream.copy(size + 2, out, scratch)  # the data and its CRLF
    elif "content-length" in headers:
        try:
            n = int(headers["content-length"])
        except ValueError:
            raise _BadMessage("bad Content-Length") from None
        stream.copy(n, out, scratch)
    elif until_close:
        if stream.buf and out is not None:
            out.sendall(stream.buf)
        stream.buf.clear()
        while True:
            got = stream.sock.recv_into(scratch)
            if not got:
                return
            if out is not None:
                out.sendall(scratch[:got])


def _reset(sock: socket.socket) -> None:
    """Closes with a reset (an endpoint that went away), not a FIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


def _client_gone(sock: socket.socket) -> bool:
    """The peer closed or reset its side (seen even with unread data)."""
    p = select.poll()
    p.register(sock, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
    return bool(p.poll(0))


_RETIMED = ("CreateMultipartUpload", "ListMultipartUploads")


def _with_length(head: bytes, n: int) -> bytes:
    """A response head with its Content-Length set to n."""
    return b"".join(b"Content-Length: %d\r\n" % n if line.lower().startswith(b"content-length:") else line
                    for line in head.splitlines(keepends=True))


class _Buffer:
    """Collects what would be sent (an answer held back): ``sendall`` appends."""

    def __init__(self) -> None:
        self.data = bytearray()

    def sendall(self, data) -> None:
        self.data += data


class _Held:
    def __init__(self, request: Request, sock: socket.socket) -> None:
        self.request, self.sock = request, sock
        self.verdict: str | None = None  # "release" or "drop"


class FaultProxy:
    """An HTTP/1.1 forwarding proxy on ``host`` (loopback unless given) in front of ``upstream``
    (``http://host:port``): a thread per client connection, one upstream
    connection each, keep-alive kept, bodies (``Content-Length`` or chunked)
    streamed through in 1 MiB pieces. ``endpoint``: what the client is
    given. Every control is thread-safe:

    * ``throttle(n)``: the next n requests are answered ``503 SlowDown``
      (an S3 error body) without being forwarded;
    * ``refuse()`` / ``accept()``: connections are reset at once, open ones
      and held ones too (the endpoint is down) / served again;
    * ``hold(predicate)``: a request for which ``predicate(Request)`` is
      true (or whose kind is the string given) waits before it is forwarded
      (its 100-continue too) until ``release()`` (which also ends the hold)
      or its client goes away; ``wait_held(n, timeout)`` waits until n
      requests are held and returns them (``held()``: those held now);
      ``drop_held()`` resets their
      connections without forwarding (the hold stays: a retry is held too);
    * ``hold_replies(predicate)``: a request for which ``predicate(Request)``
      is true (or whose kind is the string given) is forwarded and done
      upstream, and its answer waits until ``release_replies()`` (which
      also ends the hold) or ``drop_replies()``, which resets its client's
      connection instead: the request took effect, its client never learns
      (``wait_held_replies(n, timeout)``: until n answers wait);
    * initiation times: moto lists every multipart upload as initiated at
      one fixed time (2010); the proxy lists an upload created through it
      with the time it passed on that creation's answer, as S3 gives the
      time it created the upload;
    * ``counts()``: requests seen by kind (:func:`classify`), the answered
      503s under ``"SlowDown"`` as well; ``requests()``: each seen, with
      the status its client got.
    """

    def __init__(self, upstream: str, host: str = "127.0.0.1") -> None:
        u = urlsplit(upstream)
        self.upstream = (u.hostname or "127.0.0.1", u.port or 80)
        self._lock = threading.Condition()
        self._throttle = 0
        self._refusing = False
        self._predicate: Callable[[Request], bool] | None = None
        self._held: list[_Held] = []
        self._reply_predicate: Callable[[Request], bool] | None = None
        self._held_replies: list[_Held] = []
        self._initiated: dict[str, str] = {}  # upload id -> when its creation was answered (ISO 8601)
        self._seen: list[Request] = []
        self._counts: dict[str, int] = {}
        self._conns: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._listener = socket.create_server((host, 0), backlog=128)
        self._listener.settimeout(0.1)
        self.endpoint = "http://%s:%d" % (host, self._listener.getsockname()[1])
        self._acceptor = threading.Thread(target=self._accept, name="fault-proxy", daemon=True)
        self._acceptor.start()

    # -- controls ----------------------------------------------------------------------------

    def throttle(self, n: int) -> None:
        with self._lock:
            self._throttle = n

    def refuse(self) -> None:
        with self._lock:
            self._refusing = True
            conns = list(self._conns)
            for h in self._held:
                h.verdict = "drop"
            self._lock.notify_all()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)  # wakes its thread, which resets it
            except OSError:
                pass

    def accept(self) -> None:
        with self._lock:
            self._refusing = False

    def hold(self, predicate: Callable[[Request], bool] | str) -> None:
        if isinstance(predicate, str):
            kind = predicate
            predicate = lambda r: r.kind == kind  # noqa: E731
        with self._lock:
            self._predicate = predicate

    def wait_held(self, n: int = 1, timeout: float = 60.0) -> list[Request]:
        with self._lock:
            if not self._lock.wait_for(lambda: len(self._held) >= n, timeout):
                raise TimeoutError(f"{len(self._held)} request(s) held, not {n}, after {timeout}s; "
                                   f"seen: {self._counts}")
            return [h.request for h in self._held]

    def held(self) -> list[Request]:
        """The requests held now."""
        with self._lock:
            return [h.request for h in self._held]

    def release(self) -> None:
        with self._lock:
            self._predicate = None
            for h in self._held:
                h.verdict = "release"
            self._lock.notify_all()

    def drop_held(self) -> int:
        with self._lock:
            n = len(self._held)
            for h in self._held:
                h.verdict = "drop"
            self._lock.notify_all()
            self._lock.wait_for(lambda: not any(h.verdict == "drop" for h in self._held), 30)
            return n

    def hold_replies(self, predicate: Callable[[Request], bool] | str) -> None:
        if isinstance(predicate, str):
            kind = predicate
            predicate = lambda r: r.kind == kind  # noqa: E731
        with self._lock:
            self._reply_predicate = predicate

    def wait_held_replies(self, n: int = 1, timeout: float = 60.0) -> list[Request]:
        with self._lock:
            if not self._lock.wait_for(lambda: len(self._held_replies) >= n, timeout):
                raise TimeoutError(f"{len(self._held_replies)} answer(s) held, not {n}, after {timeout}s; "
                                   f"seen: {self._counts}")
            return [h.request for h in self._held_replies]

    def release_replies(self) -> None:
        with self._lock:
            self._reply_predicate = None
            for h in self._held_replies:
                h.verdict = "release"
            self._lock.notify_all()

    def drop_replies(self) -> int:
        """Resets the connections of the answers held now (the hold stays)."""
        with self._lock:
            n = len(self._held_replies)
            for h in self._held_replies:
                h.verdict = "drop"
            self._lock.notify_all()
            self._lock.wait_for(lambda: not any(h.verdict == "drop" for h in self._held_replies), 30)
            return n

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def requests(self) -> list[Request]:
        with self._lock:
            return list(self._seen)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._predicate = self._reply_predicate = None
            for h in self._held + self._held_replies:
                h.verdict = "drop"
            conns = list(self._conns)
            self._lock.notify_all()
        self._acceptor.join()
        self._listener.close()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in list(self._threads):
            t.join(timeout=10)

    def __enter__(self) -> "FaultProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- serving -----------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self._lock:
                refuse = self._refusing or self._closed or len(self._conns) >= _MAX_CONNECTIONS
                if not refuse:
                    self._conns.add(sock)
                    self._threads = [t for t in self._threads if t.is_alive()]
            if refuse:
                _reset(sock)
                continue
            t = threading.Thread(target=self._serve, args=(sock,), name="fault-proxy-conn",
                                 daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, client: socket.socket) -> None:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        upstream: socket.socket | None = None
        scratch = memoryview(bytearray(_CHUNK))
        stream = _Stream(client)
        reset = False
        try:
            while True:
                client.settimeout(_IDLE_TIMEOUT)
                try:
                    head = _read_head(stream)
                except socket.timeout:
                    if stream.buf:
                        raise
                    return  # idle too long: closed as S3 closes an idle connection
                if head is None:
                    return
                client.settimeout(_IO_TIMEOUT)
                first, header_list, raw = head
                headers = dict(header_list)
                method, target, _version = (first.split(" ", 2) + ["", ""])[:3]
                u = urlsplit(target)
                query = {k: v[0] for k, v in parse_qs(u.query, keep_blank_values=True).items()}
                path = unquote(u.path)
                req = Request(method, path, query, headers, classify(method, path, query, headers))
                action = self._admit(req)
                if action == "reset":
                    reset = True
                    return
                if action == "throttle":
                    if not self._answer_slow_down(stream, req):
                        return
                    continue
                if action == "hold" and not self._wait_released(req, client):
                    reset = True
                    return
                if "100-continue" in headers.get("expect", "").lower():
                    client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                    raw = b"".join(line for line in raw.splitlines(keepends=True)
                                   if not line.lower().startswith(b"expect:"))
                if upstream is None:
                    upstream = socket.create_connection(self.upstream, timeout=_IO_TIMEOUT)
                    upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    upstream_stream = _Stream(upstream)
                upstream.sendall(raw)
                _copy_body(stream, headers, upstream, scratch)
                if action == "hold_reply":
                    answer = _Buffer()
                    keeps = self._relay_response(upstream_stream, answer, req, scratch)
                    if not self._wait_reply_released(req, client):
                        reset = True
                        return
                    client.sendall(answer.data)
                else:
                    keeps = self._relay_response(upstream_stream, client, req, scratch)
                if not keeps:
                    upstream.close()  # moto closes: the next request opens another
                    upstream = None
                if "close" in headers.get("connection", "").lower():
                    return
        except _ClientDone:
            pass
        except (OSError, _BadMessage):
            reset = True
        finally:
            if upstream is not None:
                upstream.close()
            with self._lock:
                self._conns.discard(client)
            if reset:
                _reset(client)
            else:
                client.close()

    def _admit(self, req: Request) -> str:
        with self._lock:
            self._counts[req.kind] = self._counts.get(req.kind, 0) + 1
            if len(self._seen) < 100_000:
                self._seen.append(req)
            if self._refusing or self._closed:
                return "reset"
            if self._throttle > 0:
                self._throttle -= 1
                self._counts["SlowDown"] = self._counts.get("SlowDown", 0) + 1
                return "throttle"
            if self._predicate is not None and self._predicate(req):
                return "hold"
            if self._reply_predicate is not None and self._reply_predicate(req):
                return "hold_reply"
            return "forward"

    def _answer_slow_down(self, stream: _Stream, req: Request) -> bool:
        """503 SlowDown; True when the connection stays open. A client that
        waits for 100-continue never sends the body: the connection is
        closed after the answer, gently (what it sends meanwhile is read
        and thrown away, so the answer is not lost to a reset)."""
        expects = "100-continue" in req.headers.get("expect", "").lower()
        if not expects:
            _copy_body(stream, req.headers, None, memoryview(bytearray(_CHUNK)))
        body = b"" if req.method == "HEAD" else SLOW_DOWN
        lines = ["HTTP/1.1 503 Slow Down", "Content-Type: application/xml",
                 f"Content-Length: {len(SLOW_DOWN)}", "x-amz-request-id: TCEFAULTPROXY"]
        if expects:
            lines.append("Connection: close")
        head = "\r\n".join(lines) + "\r\n\r\n"
        stream.sock.sendall(head.encode() + body)
        req.status = 503
        if not expects:
            return True
        stream.sock.shutdown(socket.SHUT_WR)
        stream.sock.settimeout(5)
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline and stream.sock.recv(_CHUNK):
                pass
        except OSError:
            pass
        return False

    def _wait_released(self, req: Request, client: socket.socket) -> bool:
        """Holds ``req`` until released (True) or dropped, or its client
        went away (False)."""
        held = _Held(req, client)
        with self._lock:
            self._held.append(held)
            self._lock.notify_all()
            try:
                while held.verdict is None:
                    self._lock.wait(0.05)
                    if held.verdict is None and _client_gone(client):
                        held.verdict = "gone"
                return held.verdict == "release"
            finally:
                self._held.remove(held)
                self._lock.notify_all()

    def _wait_reply_released(self, req: Request, client: socket.socket) -> bool:
        """Holds the answer to ``req`` until released (True) or dropped, or
        its client went away (False)."""
        held = _Held(req, client)
        with self._lock:
            self._held_replies.append(held)
            self._lock.notify_all()
            try:
                while held.verdict is None:
                    self._lock.wait(0.05)
                    if held.verdict is None and _client_gone(client):
                        held.verdict = "gone"
                return held.verdict == "release"
            finally:
                self._held_replies.remove(held)
                self._lock.notify_all()

    def _relay_response(self, upstream: _Stream, client: socket.socket, req: Request,
                        scratch: memoryview) -> bool:
        """Copies the response to ``req``; False when the upstream
        connection ends with it."""
        while True:
            head = _read_head(upstream)
            if head is None:
                raise _BadMessage("upstream closed before its response")
            first, header_list, raw = head
            status = int(first.split(" ", 2)[1])
            if status >= 200:  # a 1xx: forwarded, the real answer follows
                break
            client.sendall(raw)
        headers = dict(header_list)
        req.status = status
        bodiless = req.method == "HEAD" or status in (204, 304)
        framed = "content-length" in headers or "chunked" in headers.get("transfer-encoding", "")
        upstream_keeps = "close" not in headers.get("connection", "").lower()
        if not bodiless and not framed:  # its end is the connection's: so for the client's too
            client.sendall(raw)
            _copy_body(upstream, headers, client, scratch, until_close=True)
            raise _ClientDone
        if not upstream_keeps:  # the client's connection stays: only the upstream one ends
            raw = b"".join(line for line in raw.splitlines(keepends=True)
                           if not line.lower().startswith(b"connection:"))
        if not bodiless and status == 200 and req.kind in _RETIMED and "content-length" in headers:
            body = _Buffer()
            _copy_body(upstream, headers, body, scratch)
            data = self._retime(req.kind, bytes(body.data))
            client.sendall(_with_length(raw, len(data)) + data)
            return upstream_keeps
        client.sendall(raw)
        if not bodiless:
            _copy_body(upstream, headers, client, scratch)
        return upstream_keeps

    def _retime(self, kind: str, body: bytes) -> bytes:
        """Records when a creation was answered; lists uploads with those times."""
        if kind == "CreateMultipartUpload":
            m = re.search(rb"<UploadId>([^<]+)</UploadId>", body)
            if m:
                now = datetime.datetime.now(datetime.timezone.utc)
                with self._lock:
                    self._initiated[m.group(1).decode()] = now.strftime("%Y-%m-%dT%H:%M:%S.") + \
                        "%03dZ" % (now.microsecond // 1000)
            return body

        def retime(upload: re.Match) -> bytes:
            text = upload.group(0)
            m = re.search(rb"<UploadId>([^<]+)</UploadId>", text)
            with self._lock:
                when = self._initiated.get(m.group(1).decode()) if m else None
            if when is None:
                return text
            return re.sub(rb"<Initiated>[^<]*</Initiated>", b"<Initiated>" + when.encode() + b"</Initiated>", text)

        return re.sub(rb"<Upload>.*?</Upload>", retime, body, flags=re.S)
