"""Staging: how a planned file's storages reach its cache buffer.

* CPU storages are copied by the saving thread, or, for an asynchronous save,
  by the staging thread.
* CUDA storages are copied device-to-host straight into the buffer, on a
  dedicated stream per device, after the work already queued on the current
  stream (so the copy sees the values as of the save). The buffer's mapping
  is registered with CUDA (``cudaHostRegister``) once for its life, so the
  copies run at PCIe speed and asynchronously; registering costs about 0.6 s
  per GiB, which is why it happens once per buffer and never per save.
  Storages under :data:`SMALL` bytes are gathered on the device into one
  tensor, copied in one go into pinned memory, and scattered on the host:
  no copy is tiny.
* An asynchronous save (``tce.save(..., blocking=False)``) returns once the
  copies are enqueued; the staging thread waits for them, then commits.
  Training must not change the saved tensors before then: the fence
  (:func:`wait_staged`) runs before every ``torch.optim`` optimizer step once
  an asynchronous save has been made, and can be called explicitly.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from typing import Any, Callable

import torch

from tce._layout import Plan, storage_bytes

SMALL = 1 << 20  # CUDA storages smaller than this are coalesced

_streams: dict[int, Any] = {}  # device index -> the staging stream
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


def unregister(mapping: Any) -> None:
    """Undoes :func:`register` (before the mapping goes away)."""
    if getattr(mapping, "cuda_registered", False):
        mapping.cuda_registered = False
        torch.cuda.check_error(torch.cuda.cudart().cudaHostUnregister(mapping.tensor.data_ptr()))


def _stream(device: torch.device) -> Any:
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _lock:
        s = _streams.get(index)
        if s is None:
            s = _streams[index] = torch.cuda.Stream(device=index)
        return s


class Staging:
    """The copies of one save into one mapped buffer.

    Construction enqueues the device-to-host copies; :meth:`finish` does the
    CPU copies, waits for the device ones and scatters the coalesced ones.
    Until then the source storages are kept alive here.
    """

    def __init__(self, plan: Plan, mapping: Any) -> None:
        targets = plan.storage_targets(mapping.tensor)
        self.cpu = [(d, s) for d, s in targets if s.device.type != "cuda"]
        cuda = [(d, s) for d, s in targets if s.device.type == "cuda"]
        self._events: list[Any] = []
        self._scatter: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._keep: list[Any] = []
        if cuda:
            register(mapping)
            self._enqueue(cuda)

    def _enqueue(self, cuda: list[tuple[torch.Tensor, torch.UntypedStorage]]) -> None:
        by_device: dict[torch.device, list[tuple[torch.Tensor, torch.UntypedStorage]]] = {}
        for d, s in cuda:
            by_device.setdefault(s.device, []).append((d, s))
        for device, items in by_device.items():
            stream = _stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                small = [(d, s) for d, s in items if s.nbytes() < SMALL]
                for d, s in items:
                    if s.nbytes() >= SMALL:
                        d.copy_(storage_bytes(s), non_blocking=True)
                if small:
                    gathered = torch.cat([storage_bytes(s) for _, s in small])
                    host = torch.empty(gathered.numel(), dtype=torch.uint8, pin_memory=True)
                    host.copy_(gathered, non_blocking=True)
                    self._keep += [gathered, host]
                    at = 0
                    for d, s in small:
                        self._scatter.append((d, host[at : at + s.nbytes()]))
                        at += s.nbytes()
                event = torch.cuda.Event()
                event.record(stream)
                self._events.append(event)
            self._keep += [s for _, s in items]

    def finish(self) -> None:
        """Blocks until every byte is in the buffer."""
        for d, s in self.cpu:
            d.copy_(storage_bytes(s))
        for e in self._events:
            e.synchronize()
        for d, h in self._scatter:
            d.copy_(h)
        self._events, self._scatter, self._keep, self.cpu = [], [], [], []


class StagedSave:
    """An asynchronous save in flight: its copies, then its commit."""

    def __init__(self, path: str, size: int, future: concurrent.futures.Future) -> None:
        self.path = path
        self.size = size  # the file's size in bytes
        self._future = future

    def done(self) -> bool:
        """Whether the copies finished and the commit was answered."""
        return self._future.done()

    def wait(self, timeout: float | None = None) -> Any:
        """The committed file's info; raises what the staging raised."""
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
            from torch.optim.optimizer import register_optimizer_step_pre_hook

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
        from tce.errors import DeadlineExceededError

        raise DeadlineExceededError(f"{len(not_done)} asynchronous save(s) still staging after {timeout} s")
    for f in futures:
        if f.exception() is not None:
            raise f.exception()
