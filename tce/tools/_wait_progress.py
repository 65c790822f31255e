"""`tce wait`'s progress on a terminal: how many of the waited files, and
how many of their bytes, are not on storage yet, and the rate at which
they get there, as one line rewritten in place.

The wait runs in slices (``SLICE_S``); between two, the server's listing of
the files says which are still to persist (any state before ``PERSISTED``)
and the sizes they add up to. The rate is the bytes that became durable
over the last ``WINDOW_S`` seconds: a file counts once all of it is on
storage, so a single large file shows its bytes left, and a rate once it
is written. A wait that ends within its first slice draws nothing.
"""

from __future__ import annotations

import collections
import time
from typing import Callable, TextIO

from tce import api, client
from tce.errors import DeadlineExceededError
from tce.v1 import tce_pb2 as pb

SLICE_S = 0.5  # the line is redrawn at most this often
WINDOW_S = 5.0  # the rate is measured over this much of the recent past

_UNSETTLED = (pb.FILE_STATE_PENDING, pb.FILE_STATE_CACHED, pb.FILE_STATE_BACKED_UP)


def shown(flag: bool | None, stream: TextIO) -> bool:
    """Whether to show progress: as ``--progress`` / ``--no-progress``
    says, else (``None``) when ``stream`` is a terminal."""
    if flag is not None:
        return flag
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced or closed: no terminal
        return False


class WaitProgress:
    """The progress of one ``tce wait`` over ``by_job`` (job -> paths),
    drawn on ``stream``; sizes written with ``human``. One thread."""

    def __init__(self, stream: TextIO, by_job: dict[str, list[str]], human: Callable[[float], str]) -> None:
        self._stream, self._human = stream, human
        self._keys = {(job, p) for job, ps in by_job.items() for p in ps}
        self._jobs = sorted(by_job)
        self._samples: collections.deque[tuple[float, int]] = collections.deque()  # (when, bytes durable)
        self._drawn = False

    def wait(self, paths: list[str], *, job: str, timeout: float | None) -> None:
        """:func:`tce.api.wait` for ``paths`` of ``job``, in slices, with the
        line redrawn between them; raises what that wait raises, the
        timeout's ``DeadlineExceededError`` included."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = SLICE_S if deadline is None else min(SLICE_S, deadline - time.monotonic())
            if left <= 0:  # the timeout passed between slices: the server says what is unfinished
                left = 0.001
            try:
                api.wait(paths, timeout=left, job=job)
                return
            except DeadlineExceededError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
            self._draw()

    def clear(self) -> None:
        """Erases the line, if one was drawn, so what follows starts clean."""
        if self._drawn:
            self._stream.write("\r\033[K")
            self._stream.flush()
            self._drawn = False

    def _draw(self) -> None:
        files_left, bytes_left, total = self._measure()
        now = time.monotonic()
        self._samples.append((now, total - bytes_left))
        while now - self._samples[0][0] > WINDOW_S:
            self._samples.popleft()
        line = f"waiting: {files_left} of {len(self._keys)} file(s), {self._human(bytes_left)} left"
        since, durable_then = self._samples[0]
        span = now - since
        if span > 0:
            line += f", {self._human(max(0, total - bytes_left - durable_then) / span)}/s"
        self._stream.write("\r\033[K" + line)
        self._stream.flush()
        self._drawn = True

    def _measure(self) -> tuple[int, int, int]:
        """The waited files not on storage yet, their bytes, and the bytes
        of all the waited files the server holds."""
        files = (client.files(self._jobs[0]) if len(self._jobs) == 1 else client.files(""))
        files_left = bytes_left = total = 0
        for f in files:
            if (f.job, f.path) not in self._keys:
                continue
            total += f.size
            if f.state in _UNSETTLED:
                files_left += 1
                bytes_left += f.size
        return files_left, bytes_left, total
