"""The internal service API: what ``tce``'s public modules share on top of the
client core. ``tce.api`` (``tce.save``, ``tce.load``, ``tce.wait``,
``tce.remove``), ``tce.client``, ``tce.buffers``, ``tce.objects``,
``tce.weights`` and ``tce.vllm`` call it for the session with the node's
server, the rules every caller applies to a path and a job (:func:`norm`,
:func:`job_or_default`, :func:`is_path`, :func:`uncacheable`), a save or a
load of a path with its fallback to torch's own functions, and the cached
files' bytes, mappings and write buffers that ``tce.buffers`` hands out;
tests import it to reach the session directly. Integrations and tools never
import it (tests/test_package.py checks): they use the public modules, so
names here may change with the package.
"""

from __future__ import annotations

import errno
import logging
import mmap as _mmap
import os
import pickle
import time
import warnings
from typing import Any

import torch

from tce.core import _client, _files, _knobs, _layout, _saves, _staging, dist
from tce.core._layout import storage_bytes
from tce.core._objects import ObjectPin
from tce.core._originals import torch_load, torch_save
from tce.core._session import client, close, with_client
from tce.core._staging import StagedSave, wait_staged
from tce.core._torchload import load_mapping
from tce.errors import (
    CacheFullError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotCachedError,
    PermissionDeniedError,
    PersistFailedError,
    ServerUnavailableError,
    TCEError,
)
from tce.v1 import tce_pb2 as pb

try:  # torch.load's own default for mmap comes from its serialization config
    from torch.utils.serialization import config as _serialization_config
except ImportError:  # a torch without the config: mmap is off by default
    _serialization_config = None

__all__ = ["allocate_file", "client", "close", "is_path", "job_or_default", "load_file",
           "norm", "object_layout", "open_cached", "open_cached_file", "range_buffer", "read_range_piece",
           "remove_file", "save_file", "stage_later", "torch_load", "torch_save", "uncacheable", "wait_files", "wait_staged",
           "with_client"]

log = logging.getLogger(__name__)

_warned_fallback = False


def is_path(f: Any) -> bool:
    """Whether ``f`` names a file (else it is a file-like object for torch)."""
    return isinstance(f, (str, os.PathLike))


def norm(path: str | os.PathLike) -> str:
    """The absolute path the server knows a file by."""
    return os.path.abspath(os.fspath(path))


def uncacheable(path: str) -> str | None:
    """Why the server cannot name ``path`` (None: it can). The protocol carries
    paths as UTF-8; a name that is not (``os.fsdecode`` of arbitrary bytes
    gives surrogates) is saved and loaded directly, bypassing the cache."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return f"{path!r} is not valid UTF-8, which the cache server needs to name a file"
    return None


def job_or_default(job: str | None) -> str:
    """``job``, else the ``job`` setting."""
    return job if job is not None else _knobs.get("job")


def _fallback_warning(reason: str) -> None:
    global _warned_fallback
    if not _warned_fallback:
        _warned_fallback = True
        warnings.warn(
            f"TCE: {reason}; writing with plain torch.save instead "
            "(set TCE_ON_UNAVAILABLE=raise to make this an error)",
            RuntimeWarning,
            stacklevel=3,
        )
    else:
        log.warning("TCE: %s; wrote with plain torch.save", reason)


# ---------------------------------------------------------------------------
# Save
# ---------------------------------------------------------------------------


def _key(job: str, path: str) -> _saves.Key:
    return (_knobs.get("socket"), job, path)


def save_file(obj: Any, f: str | os.PathLike, pickle_module: Any = pickle,
              pickle_protocol: int = 2, *, job: str | None = None, tag: str = "",
              rank: int | None = None, blocking: bool = True) -> Any:
    """:func:`tce.save` to a path; returns the cached FileInfo (a StagedSave
    when not blocking), or None when it fell back to a plain torch.save."""
    path = norm(f)
    job = job_or_default(job)
    reason = uncacheable(path)
    if reason is not None:
        if _knobs.get("on_unavailable") == "raise":
            raise InvalidArgumentError(reason)
        _fallback_warning(reason)
        _write_directly(obj, path, job, pickle_module, pickle_protocol)
        return None
    plan = _layout.plan(obj, path, pickle_module=pickle_module, pickle_protocol=pickle_protocol)
    rank = dist.rank() if rank is None else rank
    try:
        info = with_client(lambda c: c.save(plan, job=job, tag=tag, rank=rank, path=path, blocking=blocking,
                                            on_allocated=lambda v: _saves.saved_through_server(_key(job, path), v)))
        return info
    except (ServerUnavailableError, CacheFullError) as e:
        if _knobs.get("on_unavailable") == "raise":
            raise
        error = e
    if isinstance(error, CacheFullError):
        # The cache is reachable but full: make sure no older copy of this
        # path can shadow the file we are about to write.
        try:
            with_client(lambda c: c.remove(job, path))
        except TCEError:
            pass
    _fallback_warning(str(error))
    _write_directly(obj, path, job, pickle_module, pickle_protocol)
    return None


def _write_directly(obj: Any, path: str, job: str, pickle_module: Any,
                    pickle_protocol: int) -> None:
    """The fallback: plain torch.save, atomically (see _files.atomic_write)."""
    _files.atomic_write(path, lambda target: torch_save(obj, target, pickle_module,
                                                        pickle_protocol))
    _saves.written_directly(_key(job, path))


# ---------------------------------------------------------------------------
# Load
# ---------------------------------------------------------------------------

def load_file(f: str | os.PathLike, map_location: Any = None, pickle_module: Any = None, *,
              weights_only: bool | None = None, mmap: bool | None = None,
              job: str | None = None, **pickle_load_args: Any) -> tuple[Any, bool]:
    """:func:`tce.load` from a path; returns (object, whether it came from the cache)."""
    path = norm(f)
    job = job_or_default(job)
    if mmap is None:  # torch.load's own default for mmap
        mmap = _serialization_config is not None and bool(_serialization_config.load.mmap)
    if mmap and uncacheable(path) is None and \
            torch.serialization.get_default_mmap_options() == _mmap.MAP_SHARED:
        return _load_shared(path, job, map_location, pickle_module, weights_only=weights_only,
                            **pickle_load_args), False
    try:
        if uncacheable(path) is not None:  # never cached: saved directly
            raise NotCachedError(uncacheable(path))
        # Busy (as many loads as the server allows wait on ring peers): the
        # file may be newer in the ring than on storage, so wait for a place.
        info, mm = _retry_busy(lambda: with_client(lambda c: c.open(job, path)))
    except (ServerUnavailableError, NotCachedError, InvalidArgumentError) as e:
        # (INVALID_ARGUMENT: a name the server refuses, e.g. with a control
        # character, can never be cached either.)
        log.debug("loading %s from disk: %s", path, e)
        return torch_load(
            path, map_location, pickle_module, weights_only=weights_only, mmap=mmap,
            **pickle_load_args,
        ), False
    t0 = time.perf_counter()
    source = mm
    device = _all_to_cuda(map_location)
    registered = client().registered_mapping(info.buffer_id) if device is not None else None
    if registered is not None:
        # Every storage goes to the GPU and this process has the buffer
        # registered (pinned): copy from there, asynchronously, at PCIe
        # speed, instead of synchronously from pageable memory; one sync at
        # the end. The lease on `mm` keeps the bytes until then.
        source = registered.mm
        map_location = _async_to(device)
    result = load_mapping(
        source, info.size, map_location, pickle_module, weights_only=weights_only,
        **pickle_load_args,
    )
    if registered is not None:
        torch.cuda.current_stream(device).synchronize()
    del mm
    log.debug("loaded %s from cache (%d bytes) in %.3fs", path, info.size, time.perf_counter() - t0)
    return result, True


def _load_shared(path: str, job: str, map_location: Any, pickle_module: Any, **kw: Any) -> Any:
    """torch.load(mmap=True) under MAP_SHARED: a write to a loaded tensor must
    reach the file and the next load, which only the file on storage gives.
    So the path is made durable, the cache lets go of it, and torch maps the
    file itself."""
    try:
        wait_files([path], job=job)
    except FailedPreconditionError:
        raise FailedPreconditionError(
            f"torch.load({path!r}, mmap=True) with MAP_SHARED needs the file on storage, and "
            "this server persists nothing (no storage_roots)") from None
    except (FileNotFoundError, ServerUnavailableError):
        pass  # torch.load says what is wrong with the path
    try:
        with_client(lambda c: c.remove(job, path))
    except (NotCachedError, ServerUnavailableError):
        pass
    return torch_load(path, map_location, pickle_module, mmap=True, **kw)


def _all_to_cuda(map_location: Any) -> torch.device | None:
    """The CUDA device ``map_location`` sends every storage to, if it does."""
    if isinstance(map_location, str) and map_location.startswith("cuda"):
        map_location = torch.device(map_location)
    if isinstance(map_location, torch.device) and map_location.type == "cuda":
        return map_location if map_location.index is not None else \
            torch.device("cuda", torch.cuda.current_device())
    return None


def _async_to(device: torch.device):
    """A map_location that copies each storage to ``device`` without waiting."""
    def restore(storage: torch.UntypedStorage, location: str) -> torch.UntypedStorage:
        out = torch.empty(storage.nbytes(), dtype=torch.uint8, device=device)
        out.copy_(storage_bytes(storage), non_blocking=True)
        return out.untyped_storage()

    return restore


# ---------------------------------------------------------------------------
# Wait
# ---------------------------------------------------------------------------

LOST = ("lost: the server no longer knows this process's last save of the path (it restarted before "
        "recording it); storage holds an older file or none: save it again")


def wait_files(paths: list[str | os.PathLike] | str | os.PathLike | None = None, *,
               timeout: float | None = None, job: str | None = None) -> None:
    """:func:`tce.wait` (see there)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    _staging.wait_staged(timeout)  # asynchronous saves commit first
    socket_path = _knobs.get("socket")
    if paths is None:
        keys = _saves.pending(socket_path)
    else:
        if is_path(paths):
            paths = [paths]
        # A path the cache cannot name was written directly: nothing to wait for.
        keys = [(job_or_default(job), norm(p)) for p in paths if uncacheable(norm(p)) is None]
    by_job: dict[str, list[str]] = {}
    for j, p in keys:
        if _saves.is_direct((socket_path, j, p)) and os.path.exists(p):  # fsynced by the fallback: no server needed
            continue
        by_job.setdefault(j, []).append(p)
    failures: dict[str, str] = {}

    def left() -> float | None:
        return None if deadline is None else max(0.001, deadline - time.monotonic())

    def saved(j: str, p: str) -> int:  # the version of this process's last save of p (0: none)
        return _saves.version((socket_path, j, p))

    def settle(j: str, ps: list[str]) -> list[Any]:
        try:
            return with_client(lambda c: c.wait(j, ps, left()))
        except NotCachedError:
            if len(ps) == 1:  # not held: settled only if it is on storage
                if saved(j, ps[0]):  # and not a save of ours the server no longer knows
                    failures[ps[0]] = LOST  # (until the path is saved again or removed)
                    return []
                if not os.path.exists(ps[0]):
                    raise FileNotFoundError(errno.ENOENT, "not saved through the cache, and not on "
                                            "storage", ps[0]) from None
                _saves.settled((socket_path, j, ps[0]))
                return []
            return [info for p in ps for info in settle(j, [p])]

    for j, ps in by_job.items():
        for info in settle(j, ps):
            if info.state == pb.FILE_STATE_FAILED:
                failures[info.path] = info.reason
            elif info.version < saved(j, info.path):  # an older save of the path: ours was lost
                failures[info.path] = LOST  # (until the path is saved again or removed)
                continue
            _saves.settled((socket_path, j, info.path))
    if failures:
        first = next(iter(failures.items()))
        raise PersistFailedError(
            f"{len(failures)} file(s) could not be persisted, e.g. {first[0]}: {first[1]}",
            failures=failures,
        )


# ---------------------------------------------------------------------------
# Files that are not one torch zip
# ---------------------------------------------------------------------------

class DirectFile:
    """What :func:`allocate_file` gives when the server cannot take the file:
    the same ``tensor``/``view`` over private memory, written to the path
    atomically (and fsynced) by :meth:`commit`."""

    def __init__(self, path: str, size: int, job: str) -> None:
        self.path = path
        self.size = size
        self._job = job
        self._data = bytearray(size)
        self.tensor = torch.frombuffer(self._data, dtype=torch.uint8) if size else \
            torch.empty(0, dtype=torch.uint8)
        self.view = memoryview(self._data)

    def commit(self) -> None:
        """Write the bytes to the path; returns None (no cached file)."""
        data = self._data

        def write(target: str) -> None:
            with open(target, "wb") as f:
                f.write(data)

        _files.atomic_write(self.path, write)
        _saves.written_directly(_key(self._job, self.path))
        self.abort()

    def abort(self) -> None:
        """Drop the bytes; nothing is written."""
        self.tensor = None
        self.view.release()


def allocate_file(path: str | os.PathLike, size: int, *, job: str | None = None, tag: str = "",
                  rank: int | None = None) -> Any:
    """A buffer for a file of ``size`` bytes at ``path`` that is not a torch
    zip: write its bytes through ``.tensor`` (uint8) or ``.view``, then
    ``.commit()`` (the server persists it; returns the FileInfo) or
    ``.abort()``. When the server is unreachable or full (and
    ``on_unavailable`` is ``fallback``), the buffer is private memory and
    ``.commit()`` writes the file directly, atomically (returns None)."""
    path = norm(path)
    job = job_or_default(job)
    rank = dist.rank() if rank is None else rank
    reason = uncacheable(path)
    if reason is None:
        try:
            allocation = with_client(lambda c: c.allocate(job=job, tag=tag, rank=rank, path=path,
                                                          size=size))
            _saves.saved_through_server(_key(job, path), allocation.version)
            return allocation
        except (ServerUnavailableError, CacheFullError) as e:
            if _knobs.get("on_unavailable") == "raise":
                raise
            if isinstance(e, CacheFullError):
                try:  # no older cached copy may shadow the file written directly
                    with_client(lambda c: c.remove(job, path))
                except TCEError:
                    pass
            reason = str(e)
    elif _knobs.get("on_unavailable") == "raise":
        raise InvalidArgumentError(reason)
    _fallback_warning(reason)
    return DirectFile(path, size, job)


def remove_file(path: str | os.PathLike, *, job: str | None = None) -> None:
    """:func:`tce.remove`: drop the file from the cache; :func:`wait_files`
    no longer waits for it. Raises NotCachedError."""
    path = norm(path)
    job = job_or_default(job)
    reason = uncacheable(path)
    if reason is not None:
        raise NotCachedError(reason)
    try:
        with_client(lambda c: c.remove(job, path))
    finally:
        _saves.settled(_key(job, path))


def object_layout(obj: Any) -> _layout.Plan:
    """The file ``torch.save(obj, stream)`` writes, laid out: ``.size`` bytes,
    written into a buffer by ``.write(view, tensor)``."""
    return _layout.plan(obj, None)


def open_cached(path: str | os.PathLike, *, job: str | None = None,
                local_only: bool = False) -> Any:
    """A private (copy-on-write) mapping of the cached file at ``path``, under
    a lease held while the mapping lives; None when this node's cache cannot
    serve it (not held, stale, or no server). With ``local_only`` a file not
    in this node's memory is not brought here from the ring."""
    opened = open_cached_file(path, job=job, local_only=local_only)
    return None if opened is None else opened[1]


def open_cached_file(path: str | os.PathLike, *, job: str | None = None,
                     local_only: bool = False) -> tuple[pb.FileInfo, Any] | None:
    """:func:`open_cached` with the file's record: (FileInfo, mapping). The
    mapping may be longer than the file (rounded up to whole pages)."""
    path = norm(path)
    if uncacheable(path) is not None:
        return None
    job = job_or_default(job)
    try:
        return with_client(lambda c: c.open(job, path, local_only=local_only))
    except (ServerUnavailableError, NotCachedError, InvalidArgumentError):
        return None


class CachedFd:
    """A cached file's buffer as a read-only file descriptor, under a lease
    held until :meth:`close` (see :func:`open_cached_fd`)."""

    def __init__(self, client: Any, fd: int, size: int, lease: int) -> None:
        self._client, self.fd, self.size, self._lease = client, fd, size, lease

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            self._client.release_lease(self._lease)

    def __enter__(self) -> "CachedFd":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_cached_fd(path: str | os.PathLike, *, job: str | None = None,
                   local_only: bool = False) -> CachedFd | None:
    """The cached file at ``path`` as a file descriptor to read with
    ``os.preadv`` (no mapping, so no page tables to set up), under a lease
    until it is closed; None when this node's cache cannot serve it (not
    held, stale, or no server). ``local_only`` as for :func:`open_cached`."""
    path = norm(path)
    if uncacheable(path) is not None:
        return None
    job = job_or_default(job)

    def open_fd(c: Any) -> CachedFd:
        info, fd, lease = c.open_fd(job, path, local_only=local_only)
        return CachedFd(c, fd, info.size, lease)

    try:
        return with_client(open_fd)
    except (ServerUnavailableError, NotCachedError, InvalidArgumentError):
        return None


_RANGE_SOURCES = {pb.RANGE_SOURCE_LOCAL: "local", pb.RANGE_SOURCE_HELD: "peer",
                  pb.RANGE_SOURCE_PEER: "peer", pb.RANGE_SOURCE_STORAGE: "storage"}


def range_buffer() -> tuple[int, int] | None:
    """The server's range buffer for this process's session: (a read-only fd,
    its size), or None when there is none (see ``Client.range_buffer``)."""
    try:
        return with_client(lambda c: c.range_buffer())
    except ServerUnavailableError:
        return None


def _retry_busy(call: Any) -> Any:
    """``call()``, again while the server refuses it as busy
    (RESOURCE_EXHAUSTED: it runs as many calls that wait on a ring peer as
    its ``max_peer_calls`` allows, and each ends within its peer timeout),
    backing off from 10 ms to 0.5 s for at most ``rpc_timeout`` seconds;
    then the refusal, which names the setting, is raised."""
    give_up = time.monotonic() + _knobs.get("rpc_timeout")
    pause = 0.01
    while True:
        try:
            return call()
        except CacheFullError:
            if time.monotonic() + pause > give_up:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


def read_range_piece(path: str | os.PathLike, offset: int, length: int, *,
                     job: str | None = None, buffer_offset: int | None = None,
                     pin: ObjectPin | None = None) -> tuple[Any, str] | None:
    """One ReadRange call (``length`` at most :data:`_client.MAX_RANGE`), as
    :func:`tce.buffers.read_range`: (the bytes, where they came from). The bytes are the
    reply's (no copy), or with ``buffer_offset`` (fd, offset): where they lie
    in the session's range buffer (:func:`range_buffer`), when this
    session has one. A range from storage pins its object in ``pin``, or is
    read only from the object pinned there. Any thread may call it.
    """
    path = norm(path)
    if uncacheable(path) is not None:
        return None
    job = job_or_default(job)

    def call(c: Any) -> tuple[Any, int]:
        buf = c.range_buffer() if buffer_offset is not None else None
        at = None if buf is None else buffer_offset
        resp = c.read_range(job, path, offset, length, buffer_offset=at, **(pin.expected() if pin else {}))
        if pin is not None:
            pin.seen(resp.etag, resp.file_size)
        if buf is not None:
            return (buf[0], buffer_offset), resp.source
        data = resp.data  # once: each access may copy
        if len(data) != length:
            raise ValueError(f"{path}: the server sent {len(data)} bytes for a range of {length}")
        return data, resp.source

    try:
        piece, source = _retry_busy(lambda: with_client(call))
    except (ServerUnavailableError, NotCachedError, PermissionDeniedError):
        return None
    except TCEError as e:
        if e.code in ("OUT_OF_RANGE", "INVALID_ARGUMENT"):
            raise ValueError(f"{path}: {e.message}") from None
        if e.code in ("UNIMPLEMENTED", "DATA_LOSS"):  # an older server; a corrupt copy
            return None
        raise
    return piece, _RANGE_SOURCES.get(source, "local")


def stage_later(path: str, size: int, work: Any) -> StagedSave:
    """Run ``work`` on the staging thread; the fence (:func:`wait_staged`,
    which also runs before every optimizer step) waits for it."""
    return _staging.submit(path, size, work)
