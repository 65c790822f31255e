"""The planned ranges of another node's file, read through the server
(ReadRange) with several calls in flight: while the DCP reader copies one
item into its tensors, the next items' bytes are on their way (from the copy
held on this node, or over the ring from a peer's memory).

Each range is read in pieces of at most one call (``tce.buffers.MAX_RANGE``).
Where the server gives the session a range buffer, each call puts its piece
in a slot of that buffer (the server receives a peer's bytes straight into
it) and the reader copies it from there into the destination with
``preadv``, once, without the GIL; else the piece travels inside the reply.
As many calls are in flight as the buffer has slots (else
``dcp_read_threads``): they mostly wait, for the server, the peer and the
link, so their number need not follow the cores. A piece keeps its slot
until its item was copied, so the bytes held are bounded by the buffer. An
item too big for the slots is not read ahead: its source reads each piece
when the reader asks for it (:class:`LazySource`). Every call passes the
load's :class:`tce.objects.ObjectPin` of the file: ranges from an object
storage bucket all come from the object the load began with.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import queue
from typing import Any

from tce import buffers, client, objects
from tce.integrations._dcp_item import Source

_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _executor(threads: int) -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    if _pool is None or _pool._max_workers != threads:  # the setting changed
        if _pool is not None:
            _pool.shutdown(wait=False)
        _pool = concurrent.futures.ThreadPoolExecutor(threads, "tce-dcp-range")
    return _pool


def _copy(piece: Any, at: int, view: memoryview, skip: int) -> None:
    """Fill ``view`` from byte ``skip`` of a piece: the reply's bytes, or
    (fd, offset) in the range buffer."""
    if isinstance(piece, tuple):
        fd, base = piece
        done = 0
        while done < len(view):
            n = os.preadv(fd, [view[done:]], base + skip + done)
            if n <= 0:
                raise ValueError(f"the range buffer ended at {base + skip + done}")
            done += n
    else:
        view[:] = memoryview(piece).cast("B")[skip:skip + len(view)]


class PiecesSource(Source):
    """One range of a file as the pieces that carried it: (file offset,
    length, piece), in order and adjacent."""

    def __init__(self, pieces: list[tuple[int, int, Any]]) -> None:
        self.pieces = pieces

    def readinto(self, view: memoryview, offset: int) -> None:
        end, filled = offset + len(view), 0
        for at, n, piece in self.pieces:
            lo, hi = max(at, offset), min(at + n, end)
            if lo < hi:
                _copy(piece, at, view[lo - offset:hi - offset], lo - at)
                filled += hi - lo
        if filled != len(view):
            raise ValueError(f"range [{offset}, {end}) is not in the bytes read")


class _Slots:
    """The slots of the session's range buffer not holding a piece."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.free: queue.SimpleQueue[int] = queue.SimpleQueue()
        for i in range(count):
            self.free.put(i)


class LazySource(Source):
    """A range read when the reader asks for its bytes, a piece at a time,
    each through a free slot (or inside the reply without slots)."""

    def __init__(self, path: Any, job: str, slots: _Slots | None,
                 pin: objects.ObjectPin | None = None) -> None:
        self.path, self.job, self.slots, self.pin = path, job, slots, pin

    def readinto(self, view: memoryview, offset: int) -> None:
        for at in range(0, len(view), buffers.MAX_RANGE):
            n = min(len(view) - at, buffers.MAX_RANGE)
            slot = self.slots.free.get() if self.slots else None
            try:
                got = buffers.read_range(
                    self.path, offset + at, n, job=self.job,
                    buffer_offset=None if slot is None else slot * buffers.MAX_RANGE, pin=self.pin)
                if got is None:
                    raise FileNotFoundError(f"{self.path} left the ring during the load")
                _copy(got[0], 0, view[at:at + n], 0)
            finally:
                if slot is not None:
                    self.slots.free.put(slot)


class RingRanges:
    """Reads ``ranges`` ((offset, length) pairs) of the file at ``path``
    through the server, in order, with several calls in flight; :meth:`next`
    gives each range's bytes in turn, valid until the next call; ``pin``:
    the load's identity of the file's object (see
    :class:`tce.objects.ObjectPin`). Use as a context manager: leaving it
    waits for the calls still in flight."""

    def __init__(self, path: str | os.PathLike, ranges: list[tuple[int, int]], *,
                 job: str, pin: objects.ObjectPin | None = None) -> None:
        self.path, self.job, self.ranges, self.pin = path, job, ranges, pin
        buf = buffers.range_buffer()
        self._slots = _Slots(buf[1] // buffers.MAX_RANGE) if buf else None
        if self._slots is not None and self._slots.count < 2:
            self._slots = None
        # The calls mostly wait (for the server, the peer, the link): with a
        # range buffer, one in flight per slot, whatever the cores.
        self._threads = max(client.setting("dcp_read_threads"),
                            self._slots.count if self._slots else 0)
        # A range of more pieces than half the slots is read when asked for.
        self._lazy_over = (self._slots.count // 2 if self._slots else 1 << 30) * buffers.MAX_RANGE
        # (range index, file offset, length) of every call reading ahead, in order.
        self._calls = collections.deque(
            (i, offset + at, min(length - at, buffers.MAX_RANGE))
            for i, (offset, length) in enumerate(ranges) if length <= self._lazy_over
            for at in range(0, length, buffers.MAX_RANGE))
        self._pool = _executor(self._threads) if self._threads > 1 else None
        self._flight: collections.deque[tuple[int, int, int, int | None, Any]] = \
            collections.deque()
        self._held: list[int] = []  # the slots of the range handed over last
        self._next = 0

    def __enter__(self) -> "RingRanges":
        return self

    def __exit__(self, *exc: Any) -> None:
        flight, self._flight = self._flight, collections.deque()
        concurrent.futures.wait([f for *_, f in flight])

    def _fill(self) -> None:
        while self._calls and len(self._flight) < self._threads:
            i, offset, n = self._calls[0]
            # Never past a range read when asked for: it needs the free slots.
            if any(self.ranges[j][1] > self._lazy_over for j in range(self._next, i)):
                return
            slot = None
            if self._slots is not None:
                try:
                    slot = self._slots.free.get_nowait()
                except queue.Empty:
                    return
            self._calls.popleft()
            at = None if slot is None else slot * buffers.MAX_RANGE
            if self._pool is None:
                f: Any = concurrent.futures.Future()
                try:
                    f.set_result(buffers.read_range(self.path, offset, n, job=self.job,
                                                    buffer_offset=at, pin=self.pin))
                except Exception as e:  # noqa: BLE001 (handed over in order by next)
                    f.set_exception(e)
            else:
                f = self._pool.submit(buffers.read_range, self.path, offset, n,
                                      job=self.job, buffer_offset=at, pin=self.pin)
            self._flight.append((i, offset, n, slot, f))

    def next(self) -> tuple[Source, str] | None:
        """The next range's bytes and where they came from (``"local"``,
        ``"peer"`` or ``"storage"``; for a range read when asked for, as its first byte says); None
        when the server could not read a piece (no one has the file).

        Raises:
            ValueError: the range is not inside the file.
        """
        for slot in self._held:  # the reader is done with the last range
            self._slots.free.put(slot)
        self._held = []
        i, self._next = self._next, self._next + 1
        offset, length = self.ranges[i]
        if length > self._lazy_over:  # its first byte: who has the file, if anyone
            got = buffers.read_range(self.path, offset, 1, job=self.job, pin=self.pin)
            if got is None:
                return None
            return LazySource(self.path, self.job, self._slots, self.pin), got[1]
        pieces, kind = [], "local"
        self._fill()
        while self._flight and self._flight[0][0] == i:
            _, at, n, slot, f = self._flight.popleft()
            if slot is not None:
                self._held.append(slot)
            got = f.result()
            self._fill()
            if got is None:
                return None
            pieces.append((at, n, got[0]))
            if got[1] != "local":  # "peer" or "storage" (an object root's bucket)
                kind = got[1]
        return PiecesSource(pieces), kind
