"""HTTP/1.1 messages on a socket, for the fault proxy (tests/s3_helpers.py):
request and response heads, bodies as framed (Content-Length, chunked, to
the end of the stream), and which S3 operation a request is."""

from __future__ import annotations

import dataclasses
import select
import socket
import struct

MAX_LINE = 64 << 10  # a request or header line
MAX_HEADERS = 200


class BadMessage(Exception):
    pass


class ClientDone(Exception):
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


class Stream:
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
            if len(self.buf) > MAX_LINE:
                raise BadMessage("line too long")
            got = self.sock.recv(64 << 10)
            if not got:
                if self.buf:
                    raise BadMessage("stream ended mid-line")
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
                raise BadMessage("stream ended mid-body")
            if out is not None:
                out.sendall(scratch[:got])
            n -= got


def read_head(stream: Stream) -> tuple[str, list[tuple[str, str]], bytes] | None:
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
            raise BadMessage("stream ended in the head")
        raw.append(line)
        if line in (b"\r\n", b"\n"):
            break
        if len(headers) >= MAX_HEADERS:
            raise BadMessage("too many headers")
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep:
            raise BadMessage(f"bad header line {line[:80]!r}")
        headers.append((name.strip().lower(), value.strip()))
    return first.decode("latin-1").strip(), headers, b"".join(raw)


def copy_body(stream: Stream, headers: dict[str, str], out: socket.socket | None,
               scratch: memoryview, *, until_close: bool = False) -> None:
    """Copies one message body as framed (chunked, Content-Length, or to the
    end of the stream)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            line = stream.readline()
            if not line:
                raise BadMessage("stream ended in a chunk size")
            if out is not None:
                out.sendall(line)
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                raise BadMessage(f"bad chunk size {line[:40]!r}") from None
            if size == 0:
                while True:  # trailers, then the empty line
                    line = stream.readline()
                    if not line:
                        raise BadMessage("stream ended in the trailers")
                    if out is not None:
                        out.sendall(line)
                    if line in (b"\r\n", b"\n"):
                        return
            stream.copy(size + 2, out, scratch)  # the data and its CRLF
    elif "content-length" in headers:
        try:
            n = int(headers["content-length"])
        except ValueError:
            raise BadMessage("bad Content-Length") from None
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


def reset_connection(sock: socket.socket) -> None:
    """Closes with a reset (an endpoint that went away), not a FIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


def client_gone(sock: socket.socket) -> bool:
    """The peer closed or reset its side (seen even with unread data)."""
    p = select.poll()
    p.register(sock, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
    return bool(p.poll(0))


def with_length(head: bytes, n: int) -> bytes:
    """A response head with its Content-Length set to n."""
    return b"".join(b"Content-Length: %d\r\n" % n if line.lower().startswith(b"content-length:") else line
                    for line in head.splitlines(keepends=True))


class Buffer:
    """Collects what would be sent (an answer held back): ``sendall`` appends."""

    def __init__(self) -> None:
        self.data = bytearray()

    def sendall(self, data) -> None:
        self.data += data
