"""A device made of host memory, so the GPU staging logic runs without a GPU.

It stands in for ``tce.core._staging.CudaDevice``. Its storages are ordinary CPU
storages the fake claims, so a state dict can mix them with real CPU
tensors. Each stream is a thread that runs what is queued on it in order, as
a CUDA stream does: an enqueued copy happens later, reads its source when it
runs, and an error in it is reported by the next synchronize.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any, Callable, Iterator

import torch


class Event:
    def __init__(self) -> None:
        self.reached = threading.Event()
        self.error: BaseException | None = None


class Stream:
    """Runs queued work in order on a thread of its own; can be held."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.error: BaseException | None = None  # sticky, as a CUDA error is
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._open = threading.Event()
        self._open.set()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, work: Callable[[], None]) -> None:
        self._queue.put(work)

    def mark(self) -> Event:
        event = Event()

        def reach() -> None:
            event.error = self.error
            event.reached.set()

        self.submit(reach)
        return event

    def hold(self) -> None:
        """Queued work waits until :meth:`release`."""
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def close(self) -> None:
        self.release()
        self._queue.put(None)
        self._thread.join(10)

    def _run(self) -> None:
        while True:
            work = self._queue.get()
            if work is None:
                return
            self._open.wait()
            try:
                work()
            except BaseException as e:  # noqa: BLE001 (reported at synchronize)
                self.error = self.error or e


class FakeDevice:
    """The operations of ``CudaDevice``, on host memory and fake streams."""

    def __init__(self) -> None:
        self.current = Stream("fake-current")  # the training stream
        self.staging = Stream("fake-staging")
        self._owned: dict[int, torch.UntypedStorage] = {}
        self._active = threading.local()
        self._registered: set[int] = set()
        self.registrations: list[tuple[int, str]] = []  # (buffer id, calling thread)
        self.copies = 0  # device-to-host copies enqueued
        self.copied = 0  # and run
        self.gathered: list[int] = []  # storages per gather
        self.fail_copies: BaseException | None = None  # raised by every copy while set
        self.fail_pinned: BaseException | None = None  # raised by pinned() while set

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        """Puts ``t`` (a CPU tensor) on the device, in place."""
        storage = t.untyped_storage()
        self._owned[storage._cdata] = storage
        return t

    def close(self) -> None:
        self.current.close()
        self.staging.close()

    # ---- the CudaDevice interface ----

    def indices(self, storages: list[torch.UntypedStorage]) -> set[int]:
        return {0} if any(s._cdata in self._owned for s in storages) else set()

    def index_of(self, storage: torch.UntypedStorage) -> int | None:
        return 0 if storage._cdata in self._owned else None

    def register(self, mapping: Any) -> None:
        if mapping.buffer_id not in self._registered:
            self._registered.add(mapping.buffer_id)
            self.registrations.append((mapping.buffer_id, threading.current_thread().name))

    def mark_current(self, index: int) -> Event:
        return self.current.mark()

    @contextlib.contextmanager
    def staging_stream(self, index: int, after: Event) -> Iterator[Stream]:
        self.staging.submit(lambda: after.reached.wait())
        self._active.stream = self.staging
        try:
            yield self.staging
        finally:
            self._active.stream = None

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        self.copies += 1
        failure = self.fail_copies

        def run() -> None:
            if failure is not None:
                raise failure
            dst.copy_(src)
            self.copied += 1

        self._active.stream.submit(run)

    def gather(self, sources: list[torch.Tensor]) -> torch.Tensor:
        self.gathered.append(len(sources))
        out = torch.empty(sum(s.numel() for s in sources), dtype=torch.uint8)
        self._active.stream.submit(lambda: torch.cat(sources, out=out))
        return out

    def pinned(self, nbytes: int) -> torch.Tensor:
        if self.fail_pinned is not None:
            raise self.fail_pinned
        return torch.empty(nbytes, dtype=torch.uint8)

    def mark(self, stream: Stream) -> Event:
        return stream.mark()

    def synchronize(self, event: Event) -> None:
        if not event.reached.wait(60):
            raise TimeoutError("fake device: a stream never reached its mark")
        if event.error is not None:
            raise event.error
