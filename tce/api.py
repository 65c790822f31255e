"""The direct API: tce.save / tce.load and friends."""

from __future__ import annotations

import errno
import logging
import mmap as _mmap
import os
import pickle
import threading
import time
import warnings
from typing import Any

import torch

from tce.core import _files, _knobs, _layout, _staging
from tce.core._staging import wait_staged  # noqa: F401 (public: tce.wait_staged)
from tce.core._client import Client
from tce.errors import (
    CacheFullError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotCachedError,
    PersistFailedError,
    ServerUnavailableError,
    TCEError,
)

log = logging.getLogger(__name__)

# The functions TCE falls back to. Captured once so that a patched torch.save /
# torch.load (tce.patch_torch) never sees TCE's own calls.
_torch_save = torch.serialization.save
_torch_load = torch.serialization.load

_client_lock = threading.Lock()
_client: Client | None = None
_warned_fallback = False
# (socket, job, path) of every file this process saved through a cache server
# and has not yet seen persisted: what tce.wait() waits for by default.
_unsettled: dict[tuple[str, str, str], None] = {}
# (socket, job, path) of every file this process's last save of that path
# wrote directly (a fallback, fsynced before it returned): durable already,
# so tce.wait() settles it without asking a server that may be down.
_written_directly: set[tuple[str, str, str]] = set()


def _get_client() -> Client:
    """This process's session with the server (reconnects after fork or restart)."""
    global _client
    socket_path = _knobs.get("socket")
    with _client_lock:
        c = _client
        if c is not None and (c.closed or c.pid != os.getpid() or c.socket_path != socket_path):
            if c.pid == os.getpid():
                c.close()
            c = _client = None
        if c is None:
            c = _client = Client(socket_path, rpc_timeout=_knobs.get("rpc_timeout"))
        return c


def _drop_client(c: Client) -> None:
    global _client
    with _client_lock:
        if _client is c:
            _client = None
    c.close()


def _with_client(fn):
    """Run fn(client); on a lost server or session, reconnect once and retry."""
    c = _get_client()
    try:
        return fn(c)
    except TCEError as e:
        if e.code not in ("UNAVAILABLE", "UNAUTHENTICATED"):
            raise
        _drop_client(c)
        return fn(_get_client())


def close() -> None:
    """End this process's session with the server (it reconnects on next use)."""
    global _client
    with _client_lock:
        c, _client = _client, None
    if c is not None:
        c.close()


def _is_path(f: Any) -> bool:
    return isinstance(f, (str, os.PathLike))


def _norm(path: str | os.PathLike) -> str:
    return os.path.abspath(os.fspath(path))


def _uncacheable(path: str) -> str | None:
    """Why the server cannot name ``path`` (None: it can). The protocol carries
    paths as UTF-8; a name that is not (``os.fsdecode`` of arbitrary bytes
    gives surrogates) is saved and loaded directly, bypassing the cache."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return f"{path!r} is not valid UTF-8, which the cache server needs to name a file"
    return None


def _job(job: str | None) -> str:
    return job if job is not None else _knobs.get("job")


def _rank(rank: int | None) -> int:
    if rank is not None:
        return rank
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


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


def save(
    obj: Any,
    f: str | os.PathLike,
    pickle_module: Any = pickle,
    pickle_protocol: int = 2,
    *,
    job: str | None = None,
    tag: str = "",
    rank: int | None = None,
    blocking: bool = True,
) -> Any:
    """Save ``obj`` to ``f`` through the node's cache, as ``torch.save`` would.

    Returns once the bytes are safe in the cache (None). With
    ``blocking=False`` it returns once the state dict is pickled and laid
    out, leaving the copies to the staging thread (GPU tensors:
    device-to-host on a staging stream, after the work queued when the call
    was made; CPU tensors: by that thread), with a
    :class:`~tce.core._staging.StagedSave` whose ``wait()`` gives the committed
    file; the saved tensors must not change until then. The fence,
    :func:`wait_staged`, runs before every ``torch.optim`` optimizer step.
    The file has exactly torch.save's format. When the server is unreachable (or its cache is full),
    falls back to a plain ``torch.save`` with a warning, or raises when the
    ``on_unavailable`` setting is ``raise``; the fallback is atomic (a temp
    file in the same directory, fsynced, renamed over the path), so a crash
    leaves the old file or the new one. A directory that does not exist
    raises :class:`~tce.errors.MissingDirectoryError` (a FileNotFoundError
    and a RuntimeError, as torch.save's own error) and nothing is created. So does a path that is not valid
    UTF-8 (``os.fsdecode`` of arbitrary bytes), which the protocol cannot
    carry: it is written directly with a warning, or raises
    :class:`~tce.errors.InvalidArgumentError` under ``raise``; loads of it
    read the file from disk. File-like targets go straight to torch.save.

    Args:
        obj: anything torch.save accepts.
        f: the file's path (absolute or relative to the working directory).
        job: job name (default: the ``job`` setting).
        tag: the checkpoint this file belongs to (e.g. ``global_step200``).
        rank: the writing rank (default: torch.distributed rank, else $RANK, else 0).
        blocking: False for an asynchronous save (see above). When it falls
            back to torch.save, that is synchronous and None is returned.
    """
    if not _is_path(f):
        return _torch_save(obj, f, pickle_module, pickle_protocol)
    staged = _save(obj, f, pickle_module, pickle_protocol, job=job, tag=tag, rank=rank,
                   blocking=blocking)
    return None if blocking else staged


def _save(obj: Any, f: str | os.PathLike, pickle_module: Any = pickle, pickle_protocol: int = 2,
          *, job: str | None = None, tag: str = "", rank: int | None = None,
          blocking: bool = True) -> Any:
    """:func:`save` to a path; returns the cached FileInfo (a StagedSave when
    not blocking), or None when it fell back to a plain torch.save."""
    path = _norm(f)
    job = _job(job)
    uncacheable = _uncacheable(path)
    if uncacheable is not None:
        if _knobs.get("on_unavailable") == "raise":
            raise InvalidArgumentError(uncacheable)
        _fallback_warning(uncacheable)
        _write_directly(obj, path, job, pickle_module, pickle_protocol)
        return None
    plan = _layout.plan(obj, path, pickle_module=pickle_module, pickle_protocol=pickle_protocol)
    try:
        info = _with_client(lambda c: c.save(plan, job=job, tag=tag, rank=_rank(rank), path=path,
                                             blocking=blocking))
        with _client_lock:
            key = (_knobs.get("socket"), job, path)
            _unsettled[key] = None
            _written_directly.discard(key)
        return info
    except (ServerUnavailableError, CacheFullError) as e:
        if _knobs.get("on_unavailable") == "raise":
            raise
        error = e
    reason = str(error)
    if isinstance(error, CacheFullError):
        # The cache is reachable but full: make sure no older copy of this
        # path can shadow the file we are about to write.
        try:
            _with_client(lambda c: c.remove(job, path))
        except TCEError:
            pass
    _fallback_warning(reason)
    _write_directly(obj, path, job, pickle_module, pickle_protocol)
    return None


def _write_directly(obj: Any, path: str, job: str, pickle_module: Any,
                    pickle_protocol: int) -> None:
    """The fallback: plain torch.save, atomically (see _files.atomic_write)."""
    _files.atomic_write(path, lambda target: _torch_save(obj, target, pickle_module,
                                                         pickle_protocol))
    with _client_lock:
        key = (_knobs.get("socket"), job, path)
        _unsettled.pop(key, None)
        _written_directly.add(key)


def load(
    f: str | os.PathLike,
    map_location: Any = None,
    pickle_module: Any = None,
    *,
    weights_only: bool | None = None,
    mmap: bool | None = None,
    job: str | None = None,
    **pickle_load_args: Any,
) -> Any:
    """Load a file saved with :func:`save`, as ``torch.load`` would.

    Reads from the cache without copying (tensors view a private,
    copy-on-write mapping of the cached bytes, which is what torch.load's
    ``mmap=True`` gives with its default MAP_PRIVATE); when the file is not
    cached or the server is unreachable, loads the file from disk with
    torch.load. ``mmap=True`` with MAP_SHARED
    (``torch.serialization.set_default_mmap_options``) waits for the file to
    be on storage, drops it from the cache and maps the file, so writes to
    the tensors reach the file and the next load, as with plain torch.
    """
    if not _is_path(f):
        return _torch_load(
            f, map_location, pickle_module, weights_only=weights_only, mmap=mmap,
            **pickle_load_args,
        )
    return _load(f, map_location, pickle_module, weights_only=weights_only, mmap=mmap, job=job,
                 **pickle_load_args)[0]


def _load(f: str | os.PathLike, map_location: Any = None, pickle_module: Any = None, *,
          weights_only: bool | None = None, mmap: bool | None = None, job: str | None = None,
          **pickle_load_args: Any) -> tuple[Any, bool]:
    """:func:`load` from a path; returns (object, whether it came from the cache)."""
    path = _norm(f)
    job = _job(job)
    if mmap is None:  # torch.load's own default for mmap
        mmap = _default_mmap()
    if mmap and _uncacheable(path) is None and \
            torch.serialization.get_default_mmap_options() == _mmap.MAP_SHARED:
        return _load_shared(path, job, map_location, pickle_module, weights_only=weights_only,
                            **pickle_load_args), False
    try:
        if _uncacheable(path) is not None:  # never cached: saved directly
            raise NotCachedError(_uncacheable(path))
        info, mm = _with_client(lambda c: c.open(job, path))
    except (ServerUnavailableError, NotCachedError, InvalidArgumentError) as e:
        # (INVALID_ARGUMENT: a name the server refuses, e.g. with a control
        # character, can never be cached either.)
        log.debug("loading %s from disk: %s", path, e)
        return _torch_load(
            path, map_location, pickle_module, weights_only=weights_only, mmap=mmap,
            **pickle_load_args,
        ), False
    from tce.core._torchload import load_mapping

    t0 = time.perf_counter()
    source = mm
    device = _all_to_cuda(map_location)
    registered = _get_client().registered_mapping(info.buffer_id) if device is not None else None
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


def _default_mmap() -> bool:
    """What torch.load does when ``mmap`` is not given: its serialization
    config (``torch.utils.serialization.config.load.mmap``) decides."""
    try:
        from torch.utils.serialization import config
    except ImportError:  # a torch without the config: mmap is off by default
        return False
    return bool(config.load.mmap)


def _load_shared(path: str, job: str, map_location: Any, pickle_module: Any, **kw: Any) -> Any:
    """torch.load(mmap=True) under MAP_SHARED: a write to a loaded tensor must
    reach the file and the next load, which only the file on storage gives.
    So the path is made durable, the cache lets go of it, and torch maps the
    file itself."""
    try:
        wait([path], job=job)
    except FailedPreconditionError:
        raise FailedPreconditionError(
            f"torch.load({path!r}, mmap=True) with MAP_SHARED needs the file on storage, and "
            "this server persists nothing (no storage_roots)") from None
    except (FileNotFoundError, ServerUnavailableError):
        pass  # torch.load says what is wrong with the path
    try:
        _with_client(lambda c: c.remove(job, path))
    except (NotCachedError, ServerUnavailableError):
        pass
    return _torch_load(path, map_location, pickle_module, mmap=True, **kw)


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
        from tce.core._layout import storage_bytes

        out = torch.empty(storage.nbytes(), dtype=torch.uint8, device=device)
        out.copy_(storage_bytes(storage), non_blocking=True)
        return out.untyped_storage()

    return restore


def wait(
    paths: list[str | os.PathLike] | str | os.PathLike | None = None,
    *,
    timeout: float | None = None,
    job: str | None = None,
) -> None:
    """Block until files are durable on storage.

    Args:
        paths: the files to wait for; default: every file this process saved
            through the cache and has not yet seen persisted.
        timeout: seconds; None waits as long as it takes.

    A path the server does not hold is settled if the file exists on storage
    (written directly, e.g. by a fallback, or persisted and forgotten long
    ago). A save the server DISCARDED (its path was removed or replaced on
    storage first, see docs/semantics.md) is settled too: there is
    nothing left to make durable. A path whose last save in this process
    fell back to a direct write is settled without asking any server (that
    write was fsynced before the save returned), so waiting works while the
    server is down.

    Raises:
        PersistFailedError: the server gave up on some file (reasons attached;
            the file stays cached in memory).
        FileNotFoundError: a named path is neither held by the server nor on
            storage.
        DeadlineExceededError: the timeout passed first.
        FailedPreconditionError: the server persists nothing (no storage roots).
        ServerUnavailableError: no server answers.
        Whatever an asynchronous save of this process failed with (the
            fence, :func:`wait_staged`, runs first and raises it once).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    _staging.wait_staged(timeout)  # asynchronous saves commit first
    socket_path = _knobs.get("socket")
    if paths is None:
        with _client_lock:
            keys = [(j, p) for s, j, p in _unsettled if s == socket_path]
    else:
        if _is_path(paths):
            paths = [paths]
        # A path the cache cannot name was written directly: nothing to wait for.
        keys = [(_job(job), _norm(p)) for p in paths if _uncacheable(_norm(p)) is None]
    by_job: dict[str, list[str]] = {}
    for j, p in keys:
        with _client_lock:
            direct = (socket_path, j, p) in _written_directly
        if direct and os.path.exists(p):  # fsynced by the fallback: no server needed
            continue
        by_job.setdefault(j, []).append(p)
    failures: dict[str, str] = {}
    from tce.v1 import tce_pb2 as pb

    def left() -> float | None:
        return None if deadline is None else max(0.001, deadline - time.monotonic())

    def settle(j: str, ps: list[str]) -> list[Any]:
        try:
            return _with_client(lambda c: c.wait(j, ps, left()))
        except NotCachedError:
            if len(ps) == 1:  # not held: settled only if it is on storage
                if not os.path.exists(ps[0]):
                    raise FileNotFoundError(errno.ENOENT, "not saved through the cache, and not on "
                                            "storage", ps[0]) from None
                with _client_lock:
                    _unsettled.pop((socket_path, j, ps[0]), None)
                return []
            return [info for p in ps for info in settle(j, [p])]

    for j, ps in by_job.items():
        for info in settle(j, ps):
            if info.state == pb.FILE_STATE_FAILED:
                failures[info.path] = info.reason
            with _client_lock:
                _unsettled.pop((socket_path, j, info.path), None)
    if failures:
        first = next(iter(failures.items()))
        raise PersistFailedError(
            f"{len(failures)} file(s) could not be persisted, e.g. {first[0]}: {first[1]}",
            failures=failures,
        )


def cached(f: str | os.PathLike, *, job: str | None = None) -> bool:
    """Whether ``f`` is in the cache (committed) for the job."""
    if _uncacheable(_norm(f)) is not None:
        return False
    try:
        _with_client(lambda c: c.lookup(_job(job), _norm(f)))
        return True
    except (NotCachedError, ServerUnavailableError):
        return False


def remove(f: str | os.PathLike, *, job: str | None = None) -> None:
    """Drop ``f`` from the cache (the file on disk, if any, is untouched)."""
    if _uncacheable(_norm(f)) is not None:
        raise NotCachedError(_uncacheable(_norm(f)))
    _with_client(lambda c: c.remove(_job(job), _norm(f)))


def status() -> dict[str, Any]:
    """The server's status as a dict (memory, buffers, files, sessions)."""
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(
        _with_client(lambda c: c.status()),
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
