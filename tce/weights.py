"""Weights for inference: the newest complete checkpoint of a job, read from
the node's cache (see docs/weights.md).

A tag every rank finished is a *published version* of its job, numbered 1,
2, ... in the order the tags completed. A reader asks for the newest one
(:func:`latest`), or waits for one newer than the version it serves
(:func:`wait_newer`: the server answers when it is published), then opens it
(:func:`open`), which leases it: the version's bytes stay in memory,
unreplaced and unevicted, until the reader closes it (or the lease runs out
unrenewed, or the process ends). Its tensors view a private mapping of the
cached bytes: nothing is copied until the reader copies them into its model
(:meth:`Weights.load_into`), and a second reader on the node maps the same
memory.

Readers may be other users: the job's owner calls :func:`grant` (or the
server's ``read_grants`` setting names them). Readers on other nodes: the
owner grants their nodes (:func:`grant` with ``nodes``), and each such node
follows the job (:func:`follow`).

::

    from tce import weights

    version = 0
    while serving:
        info = weights.wait_newer("rl-run", after=version, timeout=600)
        with weights.open("rl-run", info.version) as w:
            w.load_into(model)
        version = info.version
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import threading
import warnings
import weakref
from typing import Any, Callable, Iterable, Iterator, NamedTuple

import torch

from tce import _service
from tce.core import _staging
from tce.core._session import with_client
from tce._weight_files import (
    Region,
    Shard,
    from_storage,
    map_storage,
    part,
    region_of,
    through_cache,
    weight_entries,
)
from tce._weight_formats import checkpoints, read_file, weight_files
from tce.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotCachedError,
)

__all__ = ["Grants", "Region", "Shard", "VersionInfo", "Weights", "follow", "grant", "latest", "open", "part",
           "publish", "revoke", "wait_newer", "weight_entries", "weight_files"]

log = logging.getLogger("tce.weights")


class Grants(NamedTuple):
    """A job's read grants in force (the server's ``read_grants`` aside)."""

    uids: list[int]
    gids: list[int]
    nodes: list[str]  # peer endpoints of the nodes that may follow the job


@dataclasses.dataclass(frozen=True)
class VersionInfo:
    """One published version of a job."""

    job: str
    version: int
    tag: str
    complete_unix_ns: int
    files: tuple[tuple[int, str, int], ...]  # (rank, path, size), sorted by (rank, path)


def _info(t: Any) -> VersionInfo:
    return VersionInfo(t.job, t.version, t.tag, t.complete_unix_ns,
                       tuple((f.rank, f.path, f.size) for f in t.files))


def publish(tag: str, paths: Iterable[str | os.PathLike] | None = None, *, job: str | None = None,
            world_size: int | None = None) -> VersionInfo:
    """Publish what a trainer saved as the job's next version.

    The DeepSpeed engine and the DCP writer publish each checkpoint tag
    themselves once every rank finished it; a trainer that saves with
    ``torch.save`` / ``tce.save`` / ``save_pretrained`` (under the patch)
    calls this, on one process, after every rank's files are saved.

    Args:
        tag: the version's name (e.g. ``step200``).
        paths: files, or directories (every file of the job cached under
            one), that make up the version; default: the job's files saved
            with ``tag``.
        world_size: ranks that wrote it (default: the highest rank among the
            files, plus one).

    Raises:
        NotCachedError: a path names nothing committed in this node's cache.
    """
    job = _service.job_or_default(job)
    if paths is None:
        if not tag:
            raise InvalidArgumentError("publish: name the paths of a version saved without a tag")
        chosen = [f for f in with_client(lambda c: c.list(job, tag)) if _committed(f)]
        if not chosen:
            raise NotCachedError(f"no file of job {job!r} is cached with tag {tag!r}")
    else:
        held = [f for f in with_client(lambda c: c.list(job)) if _committed(f)]
        chosen, seen = [], set()
        for p in paths:
            p = _service.norm(p)
            under = [f for f in held if f.path == p or f.path.startswith(p.rstrip("/") + "/")]
            if not under:
                raise NotCachedError(f"{p}: nothing of job {job!r} is committed in the cache there")
            chosen += [f for f in under if f.path not in seen]
            seen.update(f.path for f in under)
    world = world_size or max(f.rank for f in chosen) + 1
    from tce.v1 import tce_pb2 as pb
    record = pb.TagInfo(job=job, tag=tag, world_size=world,
                        files=[pb.TagFile(rank=f.rank, path=f.path, size=f.size) for f in chosen])
    return _info(with_client(lambda c: c.commit_tag(record)))


def _committed(f: Any) -> bool:
    from tce.v1 import tce_pb2 as pb
    return f.state not in (pb.FILE_STATE_PENDING, pb.FILE_STATE_DISCARDED)


def follow(job: str | None = None, *, sources: Iterable[str]) -> VersionInfo | None:
    """Follow a job whose versions are published on other nodes, from this
    node (an inference node following a trainer's job).

    This node's server learns each new version from ``sources`` (the peer
    endpoints, ``host:port``, of nodes that publish or hold the job's
    versions, asked in order: for a chain of inference nodes, the previous
    node first), as this node: a source answers a node the job's owner
    granted (:func:`grant` with ``nodes``). Here the job is the server's
    own, and this process's user (and every user that follows it too) may
    read its versions. Then :func:`latest`, :func:`wait_newer` and
    :func:`open` work here as on the trainer's node; :func:`open` brings the
    version's weight files from the sources when this node does not hold
    them, once for all its readers. Needs a server that takes part in rings
    (``peer_listen``). Returns the newest version the sources have, or None.

    Raises:
        PermissionDeniedError: the source refused this node (its reason).
        FailedPreconditionError: this server has no peer port, or a local
            user's job has that name here.
    """
    job = _service.job_or_default(job)
    srcs = list(sources)
    newest = with_client(lambda c: c.follow(job, srcs))
    return None if newest is None else _info(newest)


def latest(job: str | None = None) -> VersionInfo | None:
    """The job's newest published version, or None when it has none."""
    job = _service.job_or_default(job)
    try:
        return _info(with_client(lambda c: c.get_version(job)))
    except NotCachedError:
        return None


def wait_newer(job: str | None = None, after: int = 0, timeout: float | None = None) -> VersionInfo:
    """The newest version above ``after``, once there is one.

    The server answers the call when a version is published (no polling);
    ``timeout`` in seconds (None: as long as it takes) ends it with
    :class:`~tce.errors.DeadlineExceededError`.
    """
    job = _service.job_or_default(job)
    wait = 1e7 if timeout is None else float(timeout)
    if wait <= 0:
        raise InvalidArgumentError(f"timeout must be > 0 seconds, got {timeout}")
    return _info(with_client(lambda c: c.get_version(job, after=after, timeout=wait)))


def grant(job: str | None = None, *, uids: Iterable[int] = (), gids: Iterable[int] = (),
          nodes: Iterable[str] = ()) -> Grants:
    """Let other users of this node (uids, or members of gids by their
    primary group) read the job's published versions, and nothing else of
    it; and let other nodes (their peer endpoints, ``host:port``, as the
    ring's handshake proves them) follow the job (:func:`follow`) and be
    given its versions' weight files. Only the job's owner may; returns the
    job's grants now. Grants last while the server runs: state them at the
    trainer's start."""
    job = _service.job_or_default(job)
    r = with_client(lambda c: c.grant_read(job, list(uids), list(gids), list(nodes)))
    return Grants(list(r.uids), list(r.gids), list(r.nodes))


def revoke(job: str | None = None, *, uids: Iterable[int] = (), gids: Iterable[int] = (),
           nodes: Iterable[str] = ()) -> Grants:
    """Take grants back: the next read by those users, or those nodes'
    next question, is refused, saying so."""
    job = _service.job_or_default(job)
    r = with_client(lambda c: c.grant_read(job, list(uids), list(gids), list(nodes), revoke=True))
    return Grants(list(r.uids), list(r.gids), list(r.nodes))


def open(job: str | None = None, version: int = 0, *, lease_s: float | None = None,
         files: Callable[[str], bool] | None = None,
         entries: Callable[[str], bool] | None = None) -> "Weights":
    """Lease a version (0: the newest) and open it for reading.

    Args:
        lease_s: how long the lease lasts unless renewed (:meth:`Weights.renew`);
            None: the server's ``version_lease_s``.
        files: which files of the version hold the weights (a predicate on
            the path); default: see :func:`weight_files`.
        entries: which tensor entries of a DCP checkpoint are weights (a
            predicate on the entry's FQN); default: see :func:`weight_entries`.

    Raises:
        NotCachedError: no such version is published.
        FailedPreconditionError: the version is gone (a file of it was saved
            again since); read a newer one.
        PermissionDeniedError: not the owner and no grant (the reason says
            which, e.g. a revoked grant).
    """
    job = _service.job_or_default(job)
    c = _service.client()
    resp = c.acquire_version(job, version, lease_s=lease_s or 0.0)
    held = {f.path for f in resp.files if f.buffer_id}
    paths = [f.path for f in resp.files]
    wanted = [p for p in paths if files(p)] if files else weight_files(paths)
    if any(p not in held for p in wanted):
        # Not all here: a followed job's server brings them from the nodes
        # that hold them (for another job this changes nothing: storage).
        c.release_version(resp.lease_id)
        resp = c.acquire_version(job, resp.tag.version, lease_s=lease_s or 0.0, paths=wanted)
    return Weights(c, resp, files, entries)


class Weights:
    """An open, leased version: iterate its tensors or load them into a model.

    Tensors view the cached bytes (copy-on-write): keep them as long as you
    like; the lease ends when the Weights is closed and every such tensor is
    gone. Not thread-safe.
    """

    def __init__(self, client: Any, resp: Any, files: Callable[[str], bool] | None,
                 entries: Callable[[str], bool] | None = None) -> None:
        self._client = client
        self.info = _info(resp.tag)
        self.lease_id = resp.lease_id
        self.lease_s = resp.lease_s
        self._files = {f.path: f for f in resp.files}
        paths = [f.path for f in resp.files]
        self.paths = [p for p in paths if files(p)] if files else weight_files(paths)
        if not self.paths:
            self._release_now()
            raise FailedPreconditionError(
                f"version {self.info.version} of job {self.info.job!r} ({self.info.tag}) holds no "
                f"weight files among {paths}: name them with open(files=...)")
        self._mappings: dict[str, Any] = {}  # path -> its private mapping (while open)
        self._bytes: dict[str, torch.Tensor] = {}  # path -> its mapping's bytes (checkpoints' files)
        # The checkpoints of several files among them (DCP's), by directory,
        # each read through its anchor file when first asked.
        self._checkpoints = checkpoints(self.paths)
        self._readers: dict[str, Any] = {}
        self._entries = entries
        self._live = 0          # mappings not yet garbage
        self._lock = threading.Lock()
        self._closed = False
        self._released = False

    @property
    def version(self) -> int:
        return self.info.version

    def __enter__(self) -> "Weights":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Weights(job={self.info.job!r}, version={self.info.version}, tag={self.info.tag!r}, "
                f"files={len(self.paths)})")

    # ---- reading ---------------------------------------------------------

    def _mapping(self, path: str) -> tuple[Any, int] | None:
        """The file's private mapping and size, or None when this server
        neither holds its bytes nor brings them (then it is read from
        storage)."""
        m = self._mappings.get(path)
        if m is not None:
            return m
        f = self._files[path]
        if f.buffer_id == 0:
            got = through_cache(self._client, self.info.job, path, f)
            if got is not None:
                self._mappings[path] = got
            return got
        mm, mapped = self._client.map_leased(f.buffer_id, f.size)
        if mapped:
            with self._lock:
                self._live += 1
            weakref.finalize(mm, self._mapping_gone)
        self._mappings[path] = (mm, f.size)
        return mm, f.size

    def _mapping_gone(self) -> None:
        # Runs in whichever thread drops the last view: no I/O, no blocking.
        with self._lock:
            self._live -= 1
            done = self._closed and self._live == 0 and not self._released
            if done:
                self._released = True
        if done:
            self._client.release_version(self.lease_id, later=True)

    def _file_tensors(self, path: str, names: set[str] | None) -> Iterator[tuple[str, torch.Tensor]]:
        if self._closed:
            raise InvalidArgumentError(f"{self!r} is closed")
        got = self._mapping(path)
        if got is None:
            yield from from_storage(path, self._files[path], names)
            return
        mm, size = got
        yield from read_file(mm, size, path, names)

    def _file_bytes(self, path: str) -> torch.Tensor:
        """A file's bytes, a flat uint8 tensor over its private mapping: of
        this node's cache when it holds the file, else of the file on
        storage (mapped copy-on-write with the reader's own rights)."""
        data = self._bytes.get(path)
        if data is not None:
            return data
        got = self._mapping(path) if path in self._files else None
        if got is None:
            got = map_storage(path, self._files.get(path))
        mm, size = got
        data = (torch.frombuffer(mm, dtype=torch.uint8, count=size) if size
                else torch.empty(0, dtype=torch.uint8))
        self._bytes[path] = data
        return data

    def _checkpoint(self, directory: str) -> Any:
        reader = self._readers.get(directory)
        if reader is None:
            entries = self._entries
            pick = (lambda fqns: [f for f in fqns if entries(f)]) if entries else weight_entries
            reader = self._checkpoints[directory].checkpoint(directory, self._file_bytes, pick)
            self._readers[directory] = reader
        return reader

    def tensors(self, names: Iterable[str] | None = None, *,
                shard: Shard | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` for every weight of the version (or only
        ``names``), as CPU tensors viewing the cached bytes (copy-on-write:
        writing to one never reaches the cache). Shards of a sharded
        checkpoint come in file order; a DCP checkpoint's tensors in its
        metadata's order, named by their FQNs, each whole however many
        ranks saved it.

        Args:
            names: only these weights.
            shard: ``shard(name, global_shape)`` gives the region of each
                tensor to read ((offset, length) per dimension, e.g.
                :func:`part`), or None for all of it. A region that lies in
                one saved tensor (any torch.save or safetensors tensor, one
                chunk of a DCP tensor) is a view of it, strided where the
                region is not contiguous; a region spanning the chunks of a
                DCP tensor saved by several ranks is assembled into a new
                tensor, and only those chunks are read.

        Raises:
            InvalidArgumentError: ``shard`` gave no region of the tensor.
            NotCachedError: a file is neither in this node's cache nor on
                storage.
            CorruptCheckpointError: a file is not what its format promises.
        """
        if self._closed:
            raise InvalidArgumentError(f"{self!r} is closed")
        wanted = None if names is None else set(names)
        for path in self.paths:
            directory = os.path.dirname(path)
            fmt = self._checkpoints.get(directory)
            if fmt is not None:  # its anchor (DCP's .metadata) names the tensors
                if os.path.basename(path) == fmt.anchor:
                    yield from self._checkpoint(directory).tensors(
                        wanted, lambda name, shape: region_of(name, shape, shard))
                continue
            for name, t in self._file_tensors(path, wanted):
                region = region_of(name, t.shape, shard)
                for dim, (start, length) in enumerate(region or ()):
                    t = t.narrow(dim, start, length)
                yield name, t

    def state_dict(self, names: Iterable[str] | None = None, *,
                   shard: Shard | None = None) -> dict[str, torch.Tensor]:
        """:meth:`tensors` as a dict."""
        return dict(self.tensors(names, shard=shard))

    @torch.no_grad()
    def load_into(self, module: torch.nn.Module | dict[str, torch.Tensor], *, strict: bool = True,
                  shard: Shard | None = None) -> list[str]:
        """Copy the version into ``module``'s parameters and buffers in place
        (their devices and dtypes stay), as ``load_state_dict`` would: with
        ``strict`` a missing or unexpected name, or a shape that differs,
        raises and nothing is half-loaded. With ``shard`` (see
        :meth:`tensors`) each tensor's region goes to the module, whose
        tensors are this rank's shards. ``module`` may also be a dict of
        name -> tensor (e.g. a model's ``state_dict()``), copied into in place.

        The copy reads the cached buffers through read-only mappings this
        process keeps across versions (mapped and faulted in once while the
        trainer reuses its buffers; registered with CUDA once, so a copy to
        the GPU runs at pinned speed), under this lease; a DCP checkpoint,
        or a file not in this node's memory, is read as :meth:`tensors`
        reads it. Returns the names loaded."""
        if isinstance(module, torch.nn.Module):
            own = dict(module.named_parameters())
            own.update(dict(module.named_buffers()))
        else:  # name -> tensor, each copied into in place (e.g. a module's state_dict())
            own = dict(module)
        to_gpu = any(t.is_cuda for t in own.values())
        state = self._kept_state(shard, to_gpu)
        if state is None:
            state = self.state_dict(shard=shard)
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        wrong = sorted(n for n in set(own) & set(state) if own[n].shape != state[n].shape)
        if strict and (missing or unexpected or wrong):
            raise InvalidArgumentError(
                f"version {self.info.version} of job {self.info.job!r} does not fit the module: "
                f"missing {missing[:8]}, unexpected {unexpected[:8]}, shapes differ {wrong[:8]}")
        loaded = []
        for name, target in own.items():
            src = state.get(name)
            if src is None or target.shape != src.shape:
                continue
            target.copy_(src, non_blocking=target.is_cuda)
            loaded.append(name)
        if any(t.is_cuda for t in own.values()):
            torch.cuda.synchronize()
        return loaded

    def pinned_tensors(self) -> list[tuple[str, torch.Tensor]] | None:
        """``(name, tensor)`` for every weight, over the read-only mappings
        this process keeps of the version's buffers, each registered with
        CUDA once where there is a GPU (so copies to it run at pinned speed): for an engine
        that copies the tensors to its GPU itself, as vLLM's weight loaders
        do. Read-only: never write to them. None when a file is not in this
        node's memory or is part of a DCP checkpoint (use :meth:`tensors`)."""
        state = self._kept_state(None, to_gpu=torch.cuda.is_available())
        return None if state is None else list(state.items())

    def _kept_state(self, shard: Shard | None, to_gpu: bool) -> dict[str, torch.Tensor] | None:
        """The version's tensors over this process's kept mappings of its
        buffers (read-only, mapped and faulted in once for as long as the
        trainer reuses them; registered with CUDA once for a GPU module), for
        a copy made under this lease; None when a file is not in this node's
        memory or is part of a DCP checkpoint (then :meth:`state_dict`)."""
        if self._closed:
            raise InvalidArgumentError(f"{self!r} is closed")
        files = [self._files.get(p) for p in self.paths]
        if self._checkpoints or any(f is None or f.buffer_id == 0 for f in files):
            return None
        state: dict[str, torch.Tensor] = {}
        with warnings.catch_warnings():  # tensors over read-only memory, only ever read
            warnings.simplefilter("ignore", UserWarning)
            for f in files:
                kept = self._client.kept_mapping(f.buffer_id, f.capacity)
                if to_gpu:
                    _staging.register_read_only(kept)
                for name, t in _parsed(kept, f).items():
                    region = region_of(name, t.shape, shard)
                    for dim, (start, length) in enumerate(region or ()):
                        t = t.narrow(dim, start, length)
                    state[name] = t
        return state

    # ---- the lease ---------------------------------------------------------

    def renew(self, lease_s: float | None = None) -> float:
        """Extend the lease (from now); returns its length in seconds."""
        self.lease_s = self._client.renew_version(self.lease_id, lease_s or 0.0)
        return self.lease_s

    def _release_now(self) -> None:
        self._released = True
        self._client.release_version(self.lease_id)

    def close(self) -> None:
        """Let go of the version. The lease ends now, or once every tensor
        still viewing its bytes is gone."""
        if self._closed:
            return
        self._mappings.clear()  # ours go; tensors keep theirs alive
        self._bytes.clear()
        self._readers.clear()
        with self._lock:
            self._closed = True
            done = self._live == 0 and not self._released
            if done:
                self._released = True
        if done:
            self._client.release_version(self.lease_id)


def _parsed(kept: Any, f: Any) -> dict[str, torch.Tensor]:
    """The tensors of file `f` over its buffer's kept mapping. A torch.save
    file's pickle is parsed once per buffer for as long as the next version
    saved into it has the same pickle bytes and record layout (a trainer
    saving the same model again): the views are the same, only the bytes
    under them changed, so torch's unpickler runs once, not per version."""
    pickle = next((r for r in f.records if r.name.endswith("/data.pkl")), None)
    if pickle is None or pickle.data_offset + pickle.size > f.size:
        return dict(read_file(kept.mm, f.size, f.path, None))
    digest = hashlib.blake2b(memoryview(kept.mm)[pickle.data_offset:pickle.data_offset + pickle.size],
                             digest_size=16).digest()
    key = (f.path, f.size, digest, tuple((r.name, r.data_offset, r.size) for r in f.records))
    if kept.parsed is not None and kept.parsed[0] == key:
        return kept.parsed[1]
    state = dict(read_file(kept.mm, f.size, f.path, None))
    kept.parsed = (key, state)
    return state

