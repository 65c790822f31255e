"""Staging: how a planned file's storages reach its cache buffer.

* CPU storages are copied by the saving thread, or, for an asynchronous save,
  by the staging thread.
* CUDA storages are copied device-to-host straight into the buffer, on a
  dedicated stream per device, after the work queued on the current stream
  when the save was called (so the copy sees the values as of the save). The
  buffer's mapping is registered with CUDA (``cudaHostRegister``) once for
  its life, so the copies run at PCIe speed and asynchronously; registering
  costs about 0.6 s per GiB, which is why it happens once per buffer and
  never per save. Storages under :data:`SMALL` bytes are gathered on the
  device into one tensor, copied in one go into pinned memory, and scattered
  on the host: no copy is tiny.
* An asynchronous save (``tce.save(..., blocking=False)``) returns once the
  save is planned and its place on each device's current stream is marked;
  the staging thread registers the buffer if it must, enqueues the copies,
  waits for them and commits. Training must not change the saved tensors
  before then: the fence (:func:`wait_staged`) runs before every
  ``torch.optim`` optimizer step once an asynchronous save has been made, and
  can be called explicitly.
* The device operations go through a :class:`CudaDevice`; tests substitute a
  device made of host memory with streams of its own
  (``tests/fake_device.py``), so this logic runs without a GPU.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import threading
from typing import Any, Callable, Iterator

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from tce.core._layout import Plan, storage_bytes
from tce.errors import DeadlineExceededError

SMALL = 1 << 20  # CUDA storages smaller than this are coalesced

log = logging.getLogger(__name__)

_lock = threading.Lock()
_inflight: list[concurrent.futures.Future] = []  # GUARDED_BY(_lock)
_executor: concurrent.futures.ThreadPoolExecutor | None = None
_executor_pid = 0
_fence_handle: Any = None


def register(mapping: Any) -> None:
    """Registers a client buffer mapping with CUDA (pinned), once."""
    if getattr(mapping, "cuda_registered", False):
        return
    cudart = torch.cuda.cudart()
    torch.cuda.check_error(cudart.cudaHostRegister(mapping.tensor.data_ptr(), mapping.capacity, 0))
    mapping.cuda_registered = True


# cudaHostRegisterReadOnly: the memory is only read by the device (a
# read-only mapping cannot be registered otherwise).
_REGISTER_READ_ONLY = 0x08
_read_only_refused = False


def register_read_only(mapping: Any) -> None:
    """Registers a read-only mapping (``_mapping.ReadMapping``) with CUDA,
    once, so host-to-device copies from it run at pinned speed. Where the
    device does not support read-only registration, says so once and
    leaves it pageable (copies then run synchronously)."""
    global _read_only_refused
    if getattr(mapping, "cuda_registered", False) or _read_only_refused:
        return
    err = torch.cuda.cudart().cudaHostRegister(mapping.tensor.data_ptr(), mapping.capacity,
                                               _REGISTER_READ_ONLY)
    if int(err) != 0:
        _read_only_refused = True
        log.warning("cudaHostRegister(read-only) failed (%s): weights load into the GPU from "
                    "pageable memory", err)
        return
    mapping.cuda_registered = True


def unregister(mapping: Any) -> None:
    """Undoes :func:`register` (before the mapping goes away)."""
    if getattr(mapping, "cuda_registered", False):
        mapping.cuda_registered = False
        torch.cuda.check_error(torch.cuda.cudart().cudaHostUnregister(mapping.tensor.data_ptr()))


class CudaDevice:
    """The CUDA operations staging uses. Any thread may call them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[int, Any] = {}  # GUARDED_BY(_lock): device index -> staging stream

    def indices(self, storages: list[torch.UntypedStorage]) -> set[int]:
        """The devices holding any of ``storages`` (cheap: one pass)."""
        return {d.index for d in {s.device for s in storages} if d.type == "cuda"}

    def index_of(self, storage: torch.UntypedStorage) -> int | None:
        """The device holding ``storage``; None for host memory."""
        d = storage.device
        return d.index if d.type == "cuda" else None

    def register(self, mapping: Any) -> None:
        register(mapping)

    def mark_current(self, index: int) -> Any:
        """A point on the device's current stream: what is queued there now."""
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(index))
        return event

    @contextlib.contextmanager
    def staging_stream(self, index: int, after: Any) -> Iterator[Any]:
        """Makes the staging stream current; its work runs after ``after``."""
        with self._lock:
            stream = self._streams.get(index)
            if stream is None:
                stream = self._streams[index] = torch.cuda.Stream(device=index)
        stream.wait_event(after)
        with torch.cuda.stream(stream):
            yield stream

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=True)

    def gather(self, sources: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(sources)

    def pinned(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def mark(self, stream: Any) -> Any:
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def synchronize(self, event: Any) -> None:
        event.synchronize()


cuda: Any = CudaDevice()  # the device Staging uses (tests put a fake one here)


class Staging:
    """The copies of one save into one mapped buffer.

    Construction only marks, on each device holding a storage, the point on
    its current stream the copies must wait for: that is all an asynchronous
    save costs its caller. :meth:`enqueue` registers the buffer and enqueues
    the device-to-host copies; :meth:`finish` enqueues them if that has not
    happened yet, then writes the headers and the CPU storages while they
    run, waits for them and scatters the coalesced ones. Until then the
    source storages are kept alive here, so no allocator reuses their memory.
    """

    def __init__(self, plan: Plan, mapping: Any, device: Any = None) -> None:
        self._device = device if device is not None else cuda
        self._plan = plan
        self._mapping = mapping
        self._after = {i: self._device.mark_current(i) for i in self._device.indices(plan.storages)}
        self._enqueued = False
        self._cpu: list[tuple[torch.Tensor, torch.UntypedStorage]] = []
        self._events: list[Any] = []
        self._scatter: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._keep: list[Any] = []
        self._streams: list[Any] = []  # those copies were enqueued on

    def enqueue(self) -> None:
        """Registers the buffer (once in its life) and enqueues the
        device-to-host copies; they run after the marked points."""
        if self._enqueued:
            return
        self._enqueued = True
        dev = self._device
        by_device: dict[int, list[tuple[torch.Tensor, torch.UntypedStorage]]] = {}
        for d, s in self._plan.storage_targets(self._mapping.tensor):
            index = dev.index_of(s)
            if index is None:
                self._cpu.append((d, s))
            else:
                by_device.setdefault(index, []).append((d, s))
        if by_device:
            dev.register(self._mapping)
        for index, items in by_device.items():
            with dev.staging_stream(index, self._after[index]) as stream:
                self._streams.append(stream)
                small = [(d, s) for d, s in items if s.nbytes() < SMALL]
                for d, s in items:
                    if s.nbytes() >= SMALL:
                        dev.copy(d, storage_bytes(s))
                if small:
                    gathered = dev.gather([storage_bytes(s) for _, s in small])
                    host = dev.pinned(gathered.numel())
                    dev.copy(host, gathered)
                    self._keep += [gathered, host]
                    at = 0
                    for d, s in small:
                        self._scatter.append((d, host[at : at + s.nbytes()]))
                        at += s.nbytes()
                self._events.append(dev.mark(stream))
            self._keep += [s for _, s in items]

    def finish(self) -> None:
        """Blocks until every byte of the file is in the buffer. When it
        raises, no copy it enqueued is still running: the buffer can be
        given back."""
        try:
            self.enqueue()  # first, so the device copies overlap the rest
            self._plan.write_fixed(self._mapping.view)
            for d, s in self._cpu:
                d.copy_(storage_bytes(s))
            for e in self._events:
                self._device.synchronize(e)
            for d, h in self._scatter:
                d.copy_(h)
        except BaseException:
            self._drain()
            raise
        finally:  # the sources and staging memory are free to go now
            self._events, self._scatter, self._cpu, self._keep, self._streams = [], [], [], [], []

    def _drain(self) -> None:
        for stream in self._streams:
            try:
                self._device.synchronize(self._device.mark(stream))
            except Exception:  # noqa: BLE001 (the first error is the one raised)
                pass


class FdStaging:
    """The writes of one save into a buffer this process has not mapped:
    ``pwrite`` to its fd, which sets up no page tables. A new mapping of a
    buffer of 4 KiB pages costs more than the copy itself (its page-table
    entries: about 0.2-0.4 s per GiB, by faults or by populating it, against
    0.05 s for the copy), and the kernel's write does that work for 1 page at
    a time under the file's lock for ~0.15 s per GiB. CPU storages only; the
    caller maps the buffer for later saves from :attr:`fd`, then closes it
    (:meth:`close`)."""

    def __init__(self, plan: Plan, fd: int) -> None:
        self._plan = plan
        self.fd = fd

    def __setitem__(self, where: slice, data: Any) -> None:  # write_fixed's view[a:b] = data
        _pwrite_all(self.fd, memoryview(data).cast("B"), where.start)

    def enqueue(self) -> None:
        pass

    def finish(self) -> None:
        self._plan.write_fixed(self)  # type: ignore[arg-type]
        for offset, storage in self._plan.storage_offsets():
            _pwrite_all(self.fd, memoryview(storage_bytes(storage).numpy()), offset)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], offset + done)


class StagedSave:
    """An asynchronous save in flight: its copies, then its commit.

    What ``tce.save(..., blocking=False)`` returns, always: a save that
    completed within the call (a fallback to torch.save, a file-like target)
    gives one that is already done (see :meth:`finished`).
    """

    def __init__(self, path: str | None, size: int | None,
                 future: concurrent.futures.Future) -> None:
        self.path = path
        self.size = size  # the file's size in bytes
        self._future = future

    @classmethod
    def finished(cls, path: str | None, size: int | None) -> StagedSave:
        """A save that was written within the call: ``done()`` is True and
        ``wait()`` returns None at once. ``path`` and ``size`` are None for
        a file-like target."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(None)
        return cls(path, size, future)

    def done(self) -> bool:
        """Whether the copies finished and the commit was answered."""
        return self._future.done()

    def wait(self, timeout: float | None = None) -> Any:
        """The committed file's info (None for a save written within the
        call); raises what the staging raised."""
        return self._future.result(timeout)


def submit(path: str, size: int, work: Callable[[], Any]) -> StagedSave:
    """Runs ``work`` (finish the copies, commit) on the staging thread."""
    global _executor, _executor_pid, _fence_handle
    with _lock:
        if _executor is None or _executor_pid != os.getpid():  # none yet, or forked
            _executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tce-staging")
            _executor_pid = os.getpid()
            _inflight.clear()
        if _fence_handle is None:
            _fence_handle = register_optimizer_step_pre_hook(_fence)
        future = _executor.submit(work)
        _inflight.append(future)
    return StagedSave(path, size, future)


def _fence(optimizer: Any, args: Any, kwargs: Any) -> None:
    wait_staged()


def pending() -> int:
    """Asynchronous saves not yet waited for."""
    with _lock:
        return len(_inflight)


def wait_staged(timeout: float | None = None) -> None:
    """Blocks until every asynchronous save of this process has its bytes in
    the cache and is committed; raises the first failure (each is raised once)."""
    with _lock:
        futures = list(_inflight) if _executor_pid == os.getpid() else []
    done, not_done = concurrent.futures.wait(futures, timeout=timeout)
    with _lock:
        for f in done:
            if f in _inflight:
                _inflight.remove(f)
    if not_done:
        raise DeadlineExceededError(f"{len(not_done)} asynchronous save(s) still staging after {timeout} s")
    for f in futures:
        if f.exception() is not None:
            raise f.exception()
