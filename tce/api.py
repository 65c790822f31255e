"""The public API: ``tce.save`` / ``tce.load`` and friends (``tce`` re-exports them).

What they do lives in :mod:`tce._service`, which the integrations and the
tools call too; this module holds the public signatures and their contracts.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

from google.protobuf.json_format import MessageToDict

from tce import _service
from tce.core._session import close
from tce.core._staging import StagedSave, wait_staged
from tce.errors import NotCachedError, ServerUnavailableError

__all__ = ["cached", "close", "load", "remove", "save", "status", "wait", "wait_staged"]


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
) -> StagedSave | None:
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
        blocking: False for an asynchronous save (see above). It then
            always returns a StagedSave: a save written within the call (a
            fallback to torch.save, a file-like target) gives one that is
            already done, whose ``wait()`` returns None at once.

    Returns:
        None when ``blocking``; else the :class:`~tce.core._staging.StagedSave`.
    """
    if not _service.is_path(f):
        _service.torch_save(obj, f, pickle_module, pickle_protocol)
        return None if blocking else StagedSave.finished(None, None)
    staged = _service.save_file(obj, f, pickle_module, pickle_protocol, job=job, tag=tag,
                                rank=rank, blocking=blocking)
    if blocking:
        return None
    if staged is None:  # written directly (a fallback): durable before it returned
        path = _service.norm(f)
        return StagedSave.finished(path, os.path.getsize(path))
    return staged


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
    if not _service.is_path(f):
        return _service.torch_load(
            f, map_location, pickle_module, weights_only=weights_only, mmap=mmap,
            **pickle_load_args,
        )
    return _service.load_file(f, map_location, pickle_module, weights_only=weights_only,
                              mmap=mmap, job=job, **pickle_load_args)[0]


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
    server is down. A path whose last save in this process went through the
    server is settled by that save or a later one only: when the server
    answers with an older save, or holds none, it restarted before recording
    this save, which is lost (``PersistFailedError``, ``lost: ...``).

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
    _service.wait_files(paths, timeout=timeout, job=job)


def cached(f: str | os.PathLike, *, job: str | None = None) -> bool:
    """Whether ``f`` is in the cache (committed) for the job."""
    path = _service.norm(f)
    if _service.uncacheable(path) is not None:
        return False
    try:
        _service.with_client(lambda c: c.lookup(_service.job_or_default(job), path))
        return True
    except (NotCachedError, ServerUnavailableError):
        return False


def remove(f: str | os.PathLike, *, job: str | None = None) -> None:
    """Drop ``f`` from the cache (the file on disk, if any, is untouched)."""
    _service.remove_file(f, job=job)


def status() -> dict[str, Any]:
    """The server's status as a dict (memory, buffers, files, sessions)."""
    return MessageToDict(
        _service.with_client(lambda c: c.status()),
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
