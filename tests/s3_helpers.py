"""S3 on loopback for the s3 tests: moto's server (tce.tools._moto) and a
fault-injecting HTTP/1.1 proxy in front of it (its message plumbing:
tests/s3_wire.py).

The server under test is given the proxy's endpoint; the test then makes
the endpoint slow down (503 SlowDown), go away, or hold chosen requests
until it says so, and counts the requests of each kind that came by.
"""

from __future__ import annotations

import datetime
import re
import socket
import threading
import time
from typing import Callable
from urllib.parse import parse_qs, unquote, urlsplit

from s3_wire import (Buffer, BadMessage, ClientDone, Request, Stream, classify, client_gone, copy_body,
                     read_head, reset_connection, with_length)
from tce.tools._moto import ACCESS_KEY, REGION, SECRET_KEY, MotoServer, credentials_env

__all__ = ["ACCESS_KEY", "SECRET_KEY", "REGION", "MotoServer", "credentials_env", "FaultProxy",
           "Request", "classify"]

_CHUNK = 1 << 20  # bodies are copied through in pieces of up to this
_IO_TIMEOUT = 300.0  # one socket read or write (a large CompleteMultipartUpload takes moto a while)
_IDLE_TIMEOUT = 120.0  # a keep-alive connection with no request
_MAX_CONNECTIONS = 512

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message>"
             b"<RequestId>TCEFAULTPROXY</RequestId><HostId>tce-fault-proxy</HostId></Error>")


RETIMED = ("CreateMultipartUpload", "ListMultipartUploads")


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
                reset_connection(sock)
                continue
            t = threading.Thread(target=self._serve, args=(sock,), name="fault-proxy-conn",
                                 daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, client: socket.socket) -> None:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        upstream: socket.socket | None = None
        scratch = memoryview(bytearray(_CHUNK))
        stream = Stream(client)
        reset = False
        try:
            while True:
                client.settimeout(_IDLE_TIMEOUT)
                try:
                    head = read_head(stream)
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
                    upstream_stream = Stream(upstream)
                upstream.sendall(raw)
                copy_body(stream, headers, upstream, scratch)
                if action == "hold_reply":
                    answer = Buffer()
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
        except ClientDone:
            pass
        except (OSError, BadMessage):
            reset = True
        finally:
            if upstream is not None:
                upstream.close()
            with self._lock:
                self._conns.discard(client)
            if reset:
                reset_connection(client)
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

    def _answer_slow_down(self, stream: Stream, req: Request) -> bool:
        """503 SlowDown; True when the connection stays open. A client that
        waits for 100-continue never sends the body: the connection is
        closed after the answer, gently (what it sends meanwhile is read
        and thrown away, so the answer is not lost to a reset)."""
        expects = "100-continue" in req.headers.get("expect", "").lower()
        if not expects:
            copy_body(stream, req.headers, None, memoryview(bytearray(_CHUNK)))
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
                    if held.verdict is None and client_gone(client):
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
                    if held.verdict is None and client_gone(client):
                        held.verdict = "gone"
                return held.verdict == "release"
            finally:
                self._held_replies.remove(held)
                self._lock.notify_all()

    def _relay_response(self, upstream: Stream, client: socket.socket, req: Request,
                        scratch: memoryview) -> bool:
        """Copies the response to ``req``; False when the upstream
        connection ends with it."""
        while True:
            head = read_head(upstream)
            if head is None:
                raise BadMessage("upstream closed before its response")
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
            copy_body(upstream, headers, client, scratch, until_close=True)
            raise ClientDone
        if not upstream_keeps:  # the client's connection stays: only the upstream one ends
            raw = b"".join(line for line in raw.splitlines(keepends=True)
                           if not line.lower().startswith(b"connection:"))
        if not bodiless and status == 200 and req.kind in RETIMED and "content-length" in headers:
            body = Buffer()
            copy_body(upstream, headers, body, scratch)
            data = self._retime(req.kind, bytes(body.data))
            client.sendall(with_length(raw, len(data)) + data)
            return upstream_keeps
        client.sendall(raw)
        if not bodiless:
            copy_body(upstream, headers, client, scratch)
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
