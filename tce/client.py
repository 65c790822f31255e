"""``tce.client``: sessions with the node's cache server, settings, files and tags.

``tce.save`` / ``tce.load`` are all a training script needs. A framework
adapter, a command-line tool or a script that looks into the cache needs a
little more: a session with a chosen server, the settings, and the files
and tags the server holds. This module is that surface; a cached file's
bytes and buffers to write files into are :mod:`tce.buffers`, and files
under object storage (S3) roots are :mod:`tce.objects`. With these modules
nothing outside the client core imports its private modules
(``tce.core._*``, ``tce._service``), which may then change freely.

Every call goes through this process's session, the one ``tce.save`` and
``tce.load`` use (made on first use, made again after a fork or a server
restart); :func:`session` points it at a server for a block and closes it
after. Files and tags come back as the protocol's messages
(``tce.v1.tce_pb2.FileInfo``, ``TagInfo``). Any thread may call these
functions.

Example::

    import tce.client

    with tce.client.session("/run/tce/tce.sock"):
        for f in tce.client.files(job=""):            # every job's files
            print(f.job, f.path, f.size)
        for t in tce.client.tags(job="train"):        # complete tags, oldest first
            print(t.tag, len(t.files))
    print(tce.client.setting("socket"))
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

from tce import _service
from tce.api import remove, status
from tce.core import _knobs, _meta
from tce.errors import TCEError
from tce.v1 import tce_pb2 as pb

__all__ = [
    "commit_tag", "configure", "files", "job_or_default", "loaded_bytes", "lookup",
    "mapped_buffers", "metadata_files", "norm", "override", "prefetch", "remove", "retry",
    "session", "setting", "settings", "status", "tags",
]

# ---------------------------------------------------------------------------
# Settings (every one has a TCE_* environment override: docs/settings.md)
# ---------------------------------------------------------------------------


def setting(name: str) -> Any:
    """The effective value of the setting ``name`` (``socket``, ``job``,
    ``on_unavailable``, ...): :func:`configure` or :func:`override`, else
    its ``TCE_*`` environment variable, else the default.

    Raises:
        KeyError: no such setting.
        ValueError: its environment variable does not parse.
    """
    return _knobs.get(name)


def settings() -> dict[str, Any]:
    """Every setting's effective value, by name."""
    return {name: _knobs.get(name) for name in _knobs.KNOBS}


def configure(**values: Any) -> None:
    """Set settings for this process (over the environment); ``tce.configure``."""
    _knobs.configure(**values)


@contextlib.contextmanager
def override(**values: Any) -> Iterator[None]:
    """Settings for the block, for the whole process (tests and tools that
    talk to more than one server); the previous ones come back after it."""
    with _knobs.override(**values):
        yield


# ---------------------------------------------------------------------------
# The session
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def session(socket: str | None = None, **values: Any) -> Iterator[None]:
    """A session with the server at ``socket`` (default: the ``socket``
    setting) for the block, closed at its end (as ``tce.close``: the server
    frees the process's pending buffers and leases).

    Everything in the block, ``tce.save`` and ``tce.load`` included, talks
    to that server; ``values`` are more settings for the block (e.g.
    ``job=``, ``on_unavailable="raise"``). Settings belong to the process,
    so another thread's calls meanwhile go there too.

    Raises:
        ServerUnavailableError: no server answers at the socket (on entry,
            not at the first call inside).
    """
    if socket is not None:
        values["socket"] = socket
    with _knobs.override(**values):
        try:
            _service.client()
            yield
        finally:
            _service.close()


def mapped_buffers() -> int:
    """How many cache buffers this process keeps mapped for its saves (a
    steady-state save maps none anew)."""
    return _service.client().mapped_buffers


# ---------------------------------------------------------------------------
# Files and tags
# ---------------------------------------------------------------------------


def loaded_bytes() -> dict[str, int]:
    """Bytes this process's loads (``tce.load``, the torch patch, the
    DeepSpeed engine, ...) found through its node's server, by where:
    ``"cache"`` (that node's memory), ``"peer"`` (another node's, over the
    ring), ``"storage"`` (read from storage into the cache for them). A load
    that read a file itself (no server could give it) is not counted. {} when
    the server is unreachable."""
    try:
        return dict(_service.with_client(lambda c: c.loaded))
    except TCEError:
        return {}


def files(job: str | None = None, tag: str = "", *, check_storage: bool = False,
          wait_for_restore: bool = False) -> list[pb.FileInfo]:
    """The files the server knows, by job and path.

    Args:
        job: the job (default: the ``job`` setting); ``""`` for every job.
        tag: only this tag's files (``""``: every tag).
        check_storage: compare each cached file with storage first, as a
            load would, so a file replaced on storage no longer counts.
        wait_for_restore: answer once the server has pulled the job's files
            back from the ring, if it is doing so (bounded by the server's
            ``ring_restore_wait_ms``; DeadlineExceededError after it).
    """
    job = _service.job_or_default(job)
    return _service.with_client(lambda c: c.list(job, tag, check_storage=check_storage,
                                                 wait_for_restore=wait_for_restore))


def lookup(path: str | os.PathLike, *, job: str | None = None) -> pb.FileInfo:
    """The server's record of the committed file at ``path``.

    Raises:
        NotCachedError: the server holds no committed version of it.
    """
    path, job = _service.norm(path), _service.job_or_default(job)
    return _service.with_client(lambda c: c.lookup(job, path))


def retry(paths: list[str | os.PathLike] | None = None, *,
          job: str | None = None) -> list[pb.FileInfo]:
    """Persist FAILED files again now: ``paths``, or every failed file of
    the job when None. Returns the files as the server now has them."""
    job = _service.job_or_default(job)
    wanted = [_service.norm(p) for p in paths or []]
    return _service.with_client(lambda c: c.retry(job, wanted))


def tags(job: str | None = None, *, wait_for_restore: bool = False) -> list[pb.TagInfo]:
    """The job's complete tags (checkpoints every rank finished), oldest
    first; ``wait_for_restore`` as for :func:`files`."""
    job = _service.job_or_default(job)
    return _service.with_client(lambda c: c.list_tags(job, wait_for_restore=wait_for_restore))


def prefetch(dir: str | os.PathLike | None = None, *, paths: list[str | os.PathLike] | None = None,
             job: str | None = None) -> bool:
    """Before a job restarted on empty nodes loads a checkpoint: have every
    node's server start reading its share of it (the files of ``dir`` on
    storage, or ``paths``) into the cache, so the loads wait on transfers
    already under way (docs/ring.md, "Cooperative restore"). Every rank may
    call it; each server queues one prefetch of it. Returns whether this
    node's server queued it (False: no ring of several nodes, the
    ``restore_prefetch`` setting is off, nothing it names lies under a
    storage root, it is queued already, or the job's uid has its share of
    the server's prefetch queue, 8, queued)."""
    job = _service.job_or_default(job)
    d = _service.norm(dir) if dir is not None else ""
    ps = [_service.norm(p) for p in paths or []]
    return _service.with_client(lambda c: c.prefetch(job, dir=d, paths=ps))


def commit_tag(tag: pb.TagInfo) -> pb.TagInfo:
    """Record that every rank finished ``tag`` (one rank calls it, once the
    others are done): a restore from the ring then brings the tag back."""
    return _service.with_client(lambda c: c.commit_tag(tag))


def metadata_files(url: str, *, job: str = "", tag: str = "") -> list[Any]:
    """The files recorded in a server's metadata store, read directly (no
    server needed; a running server holds its SQLite file, so ask it with
    :func:`files` then): rows with ``job``, ``tag``, ``rank``, ``state``,
    ``size``, ``path`` and ``reason``.

    Args:
        url: ``sqlite:///abs/path.db`` or ``mysql://user:pass@host:port/db``.
        job, tag: only these (``""``: all).
    """
    return _meta.read_files(url, job=job, tag=tag)


# ---------------------------------------------------------------------------
# Paths and jobs, as the server knows them
# ---------------------------------------------------------------------------

def norm(path: str | os.PathLike) -> str:
    """The absolute path the server knows a file by."""
    return _service.norm(path)


def job_or_default(job: str | None) -> str:
    """``job``, else the ``job`` setting."""
    return _service.job_or_default(job)
