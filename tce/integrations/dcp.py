"""PyTorch Distributed Checkpoint (DCP) through the node's cache.

:class:`StorageWriter` and :class:`StorageReader` implement DCP's storage
contracts (``torch.distributed.checkpoint.StorageWriter`` / ``StorageReader``)
over a TCE cache server, in the directory format of DCP's own
``FileSystemWriter``: one data file per rank (``__<rank>_0.distcp``, each
item a ``torch.save`` archive or raw bytes at an offset) and a pickled
``.metadata`` that maps every item to its file, offset and length. So a
persisted directory is an ordinary DCP checkpoint.

* A rank's data file is one buffer of the cache: allocated at the file's
  size, written through the mapping, committed; the server persists it.
* ``.metadata`` is written by the coordinator in ``finish``, which DCP calls
  only after every rank's ``write_data`` returned, and each returns only
  once its file is committed: a checkpoint whose rank died has no
  ``.metadata`` and is never loaded. The coordinator also records the
  checkpoint as a complete tag (the directory's name) with every file.
* :class:`StorageWriter` is also DCP's ``AsyncStager``: under
  ``dcp.async_save`` its ``stage`` allocates the data file's buffer and lays
  the tensors out in it, and the copies run on TCE's staging thread; the
  fence (:func:`tce.wait_staged`, run by itself before every optimizer step)
  waits for them. No pinned copy, no extra process.
* :class:`StorageReader` reads each item's byte range from the node's cache
  (mapped, tensors viewing the mapping), else from storage (mapped the same
  way), and records where each read came from in :attr:`StorageReader.reads`.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import io
import logging
import mmap
import os
import pickle
import threading
import uuid
from typing import Any, NamedTuple

import torch
from torch.futures import Future
from torch.distributed.checkpoint import Metadata
from torch.distributed.checkpoint import StorageReader as _DCPReader
from torch.distributed.checkpoint import StorageWriter as _DCPWriter
from torch.distributed.checkpoint.filesystem import _StorageInfo  # the .metadata format
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.storage import WriteResult

from tce import _service, api
from tce.core import _dist
from tce.errors import NotCachedError, ServerUnavailableError, TCEError
from tce.v1 import tce_pb2 as pb

__all__ = ["METADATA", "ReadRecord", "StorageReader", "StorageWriter"]

log = logging.getLogger(__name__)

METADATA = ".metadata"
_DCP_VERSION = "1.0.0"  # the metadata version FileSystemWriter writes
# Items start at multiples of this in a data file, so a tensor's bytes (64-byte
# aligned within its archive, as torch.save aligns them) are aligned in the
# buffer too and can be viewed as any dtype. The gaps are zeros.
_ALIGN = 64


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


def _data_name(rank: int, index: int) -> str:
    return f"__{rank}_{index}.distcp"


def _rank_of(name: str) -> int:
    """The rank in a data file's name (``__<rank>_<i>.distcp``)."""
    try:
        return int(name[2:].split("_", 1)[0])
    except ValueError:
        return 0


def _compact(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the CPU, its storage exactly its elements (what torch.save
    should write for it: a view would save its whole storage)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.untyped_storage().nbytes() != t.numel() * t.element_size() or t.storage_offset() != 0:
        t = t.clone(memory_format=torch.contiguous_format)
    return t


def _storage_view(buffer: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A tensor over ``buffer`` (uint8, the storage's bytes) shaped like ``like``."""
    if like.numel() == 0:
        return torch.empty_like(like)
    typed = buffer.view(like.dtype)  # as_strided's offset counts from the storage's start
    return typed.as_strided(like.size(), like.stride(),
                            typed.storage_offset() + like.storage_offset())


@dataclasses.dataclass
class _Staged:
    """One tensor laid out in a staged buffer: its archive's range in the file."""

    offset: int
    length: int
    shape: torch.Size
    dtype: torch.dtype


class _Part:
    """One item's bytes in a data file: a torch.save archive or raw bytes."""

    def __init__(self, item: Any, data: Any) -> None:
        self.item = item
        if isinstance(data, io.BytesIO):
            self.raw: memoryview | None = data.getbuffer()
            self.layout = None
            self.size = len(self.raw)
        else:
            self.raw = None
            self.layout = _service.object_layout(_compact(data))
            self.size = self.layout.size

    def write(self, dest: Any, offset: int) -> None:
        end = offset + self.size
        if self.raw is not None:
            dest.view[offset:end] = self.raw
        else:
            self.layout.write(dest.view[offset:end], dest.tensor[offset:end])


@dataclasses.dataclass
class _Prefix:
    """A rank's storage data in the global plan: its index (the file prefix)."""

    rank: int


class StorageWriter(_DCPWriter, AsyncStager):
    """DCP's ``StorageWriter`` over the node's cache (see the module's doc).

    Used as ``dcp.save(sd, storage_writer=StorageWriter(path))`` or
    ``dcp.async_save(sd, storage_writer=StorageWriter(path))``. The
    directory is created if missing, on every rank.

    Args:
        path: the checkpoint directory (DCP's ``checkpoint_id``).
        job: the cache job (default: the ``job`` setting).
        tag: the tag the files are saved under and the checkpoint is recorded
            as, complete (default: the directory's name).
    """

    _synchronize_after_execute = False  # stage() is the fence's business, not DCP's

    def __init__(self, path: str | os.PathLike, *, job: str | None = None,
                 tag: str | None = None) -> None:
        super().__init__()
        self.path = _service.norm(path)
        self.job = _service.job_or_default(job)
        self._tag = tag
        self.rank = 0
        self.is_coordinator = False
        self.save_id = uuid.uuid4().hex
        self.saved: list[str] = []  # paths this rank committed (for wait())
        self._lock = threading.Lock()
        # The buffer stage() filled, until write_data commits it.
        self._staged_file: Any = None
        self._staged_done: Any = None  # the StagedSave of its copies
        self._staged: dict[int, _Staged] = {}  # staged tensor data_ptr -> its archive

    @property
    def tag(self) -> str:
        """The tag (default: the checkpoint directory's name)."""
        return self._tag if self._tag is not None else os.path.basename(self.path)

    # -- the DCP contract ---------------------------------------------------
    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            path = _service.norm(checkpoint_id)
            if self._staged_file is not None and path != self.path:
                raise ValueError(f"this writer staged into {self.path}; async_save was given "
                                 f"checkpoint_id={path!r}")
            self.path = path
        self.save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        rank = kwargs.get("rank")
        self.rank = _dist.rank() if rank is None else int(rank)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        os.makedirs(self.path, exist_ok=True)
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """The coordinator, before any rank writes: a previous checkpoint's
        ``.metadata`` in this directory goes first, so a save that does not
        finish leaves none (never old metadata over new data files)."""
        meta = os.path.join(self.path, METADATA)
        try:
            _service.remove_file(meta, job=self.job)
        except (NotCachedError, ServerUnavailableError):
            pass
        if os.path.lexists(meta):
            os.remove(meta)
        return [dataclasses.replace(p, storage_data=_Prefix(i)) for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Write this rank's items into its data file(s) in the cache and
        commit them; the future is done when they are committed."""
        rank = plan.storage_data.rank if isinstance(plan.storage_data, _Prefix) else self.rank
        results: list[WriteResult] = []
        parts: list[_Part] = []
        staged_file, self._staged_file = self._staged_file, None
        staged, self._staged = self._staged, {}
        try:
            for item in plan.items:
                data = planner.resolve_data(item)
                hit = None
                if item.type != WriteItemType.BYTE_IO and staged:
                    t = data.detach()
                    s = staged.get(t.data_ptr()) if t.device.type == "cpu" else None
                    if s is not None and s.shape == t.shape and s.dtype == t.dtype:
                        hit = s
                if hit is not None:
                    results.append(self._result(item, os.path.basename(staged_file.path),
                                                hit.offset, hit.length))
                else:
                    parts.append(_Part(item, data))
            if staged_file is not None:
                self._staged_done.wait()  # the copies, on the staging thread
                self._commit(staged_file)
                staged_file = None
        except BaseException:
            if staged_file is not None:
                staged_file.abort()
            raise
        if parts:
            index = 1 if staged else 0
            name = _data_name(rank, index)
            offsets, offset = [], 0
            for p in parts:
                offsets.append(offset)
                offset = _aligned(offset + p.size)
            dest = _service.allocate_file(os.path.join(self.path, name),
                                          offsets[-1] + parts[-1].size, job=self.job,
                                          tag=self.tag, rank=rank)
            try:
                for p, at in zip(parts, offsets):
                    p.write(dest, at)
                    results.append(self._result(p.item, name, at, p.size))
            except BaseException:
                dest.abort()
                raise
            self._commit(dest)
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """The coordinator writes ``.metadata`` (every rank's files are
        committed by now) and records the checkpoint as a complete tag."""
        metadata.version = _DCP_VERSION
        metadata.storage_data = {r.index: r.storage_data for rs in results for r in rs}
        metadata.storage_meta = self.storage_meta()
        data = pickle.dumps(metadata)
        dest = _service.allocate_file(os.path.join(self.path, METADATA), len(data), job=self.job,
                                      tag=self.tag, rank=self.rank)
        dest.view[:] = data
        self._commit(dest)
        sizes: dict[str, int] = {}
        for rs in results:
            for r in rs:
                info = r.storage_data
                end = info.offset + info.length
                sizes[info.relative_path] = max(sizes.get(info.relative_path, 0), end)
        files = [pb.TagFile(rank=_rank_of(n), path=os.path.join(self.path, n), size=s)
                 for n, s in sorted(sizes.items())]
        files.append(pb.TagFile(rank=self.rank, path=os.path.join(self.path, METADATA),
                                size=len(data)))
        record = pb.TagInfo(job=self.job, tag=self.tag, world_size=len(results), files=files)
        try:
            _service.with_client(lambda c: c.commit_tag(record))
        except TCEError as e:
            log.warning("TCE: could not record %s as a complete tag: %s", self.path, e)

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.path, save_id=self.save_id)

    @property
    def checkpoint_id(self) -> str:
        """The checkpoint directory."""
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))

    # -- asynchronous save -------------------------------------------------
    @property
    def should_synchronize_after_execute(self) -> bool:
        return False

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Lay this rank's tensors out in a cache buffer and return the state
        dict with every tensor replaced by its place in the buffer; the
        copies run on TCE's staging thread (the fence waits for them).

        The caller must not change the tensors before the fence
        (:func:`tce.wait_staged`, which runs by itself before every
        ``torch.optim`` step).
        """
        if self._staged_file is not None:  # staged but never written: give it back
            self._staged_file.abort()
            self._staged_file = None
        leaves: list[tuple[torch.Tensor, Any]] = []  # (compact local tensor, layout)

        def collect(obj: Any) -> None:
            if isinstance(obj, dict):
                for v in obj.values():
                    collect(v)
            elif isinstance(obj, (list, tuple)):
                for v in obj:
                    collect(v)
            elif isinstance(obj, torch.Tensor):
                local = _local(obj)
                if local is not None:
                    t = _compact(local)
                    leaves.append((t, _service.object_layout(t)))

        collect(state_dict)
        if not leaves:
            return state_dict  # nothing to stage: write_data writes what there is
        os.makedirs(self.path, exist_ok=True)
        offsets, offset = [], 0
        for _, layout in leaves:
            offsets.append(offset)
            offset = _aligned(offset + layout.size)
        size = offsets[-1] + leaves[-1][1].size
        name = _data_name(_dist.rank(), 0)
        dest = _service.allocate_file(os.path.join(self.path, name), size, job=self.job,
                                      tag=self.tag, rank=_dist.rank())
        staged: dict[int, _Staged] = {}
        views: dict[int, torch.Tensor] = {}
        for (t, layout), offset in zip(leaves, offsets):
            rec = layout.records[4]  # the first (only) storage's record
            view = _storage_view(dest.tensor[offset + rec.data_offset:
                                             offset + rec.data_offset + rec.size], t)
            if view.numel():
                staged[view.data_ptr()] = _Staged(offset, layout.size, view.shape, view.dtype)
            views[id(t)] = view

        def copy() -> None:
            for (t, layout), at in zip(leaves, offsets):
                layout.write(dest.view[at:at + layout.size], dest.tensor[at:at + layout.size])

        self._staged_file, self._staged = dest, staged
        self._staged_done = _service.stage_later(dest.path, size, copy)
        it = iter(views[id(t)] for t, _ in leaves)

        def replace(obj: Any) -> Any:
            if isinstance(obj, dict):
                return {k: replace(v) for k, v in obj.items()}
            if isinstance(obj, list):
                return [replace(v) for v in obj]
            if isinstance(obj, tuple):
                return type(obj)(*[replace(v) for v in obj]) if hasattr(obj, "_fields") \
                    else tuple(replace(v) for v in obj)
            if isinstance(obj, torch.Tensor) and _local(obj) is not None:
                return _like(obj, next(it))
            return obj

        return replace(state_dict)

    def synchronize_staging(self) -> None:
        """The fence: block until the staged copies are in the buffer."""
        done = self._staged_done
        if done is not None:
            done.wait()

    def close(self) -> None:
        """Give back a buffer staged but never written."""
        if self._staged_file is not None:
            self._staged_file.abort()
            self._staged_file = None

    # -- durability --------------------------------------------------------
    def wait(self, *, timeout: float | None = None) -> None:
        """Block until every file this rank saved through this writer is
        durable on storage (call it on every rank)."""
        paths, self.saved = self.saved, []
        if paths:
            api.wait(paths, timeout=timeout, job=self.job)

    # -- helpers -----------------------------------------------------------
    def _commit(self, dest: Any) -> None:
        dest.commit()
        self.saved.append(dest.path)

    @staticmethod
    def _result(item: Any, name: str, offset: int, length: int) -> WriteResult:
        return WriteResult(index=item.index, size_in_bytes=length,
                           storage_data=_StorageInfo(name, offset, length))


def _local(t: torch.Tensor) -> torch.Tensor | None:
    """The part of ``t`` this rank writes (a DTensor's local shard)."""
    to_local = getattr(t, "to_local", None)
    if to_local is not None and type(t).__name__ == "DTensor":
        return to_local()
    return t


def _like(original: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``original`` with its local data replaced by ``local``."""
    if type(original).__name__ == "DTensor":
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(local, original.device_mesh, original.placements,
                                  run_check=False, shape=original.shape, stride=original.stride())
    return local


class ReadRecord(NamedTuple):
    """Where one read of :class:`StorageReader` came from."""

    path: str  # the file, relative to the checkpoint directory
    offset: int
    length: int
    source: str  # "local" (this node's cache) or "storage"


class StorageReader(_DCPReader):
    """DCP's ``StorageReader`` over the node's cache, for any DCP checkpoint
    directory (saved through TCE or by ``FileSystemWriter``).

    Each file is read from this node's cache when it holds it, else from
    storage; either way it is mapped and only the planned byte ranges are
    touched. :attr:`reads` lists every read with its source.

    Args:
        path: the checkpoint directory (DCP's ``checkpoint_id``).
        job: the cache job (default: the ``job`` setting).
    """

    def __init__(self, path: str | os.PathLike, *, job: str | None = None) -> None:
        super().__init__()
        self.path = _service.norm(path)
        self.job = _service.job_or_default(job)
        self.storage_data: dict[Any, Any] = {}
        self.load_id = uuid.uuid4().hex
        self.reads: list[ReadRecord] = []

    def sources(self) -> dict[str, int]:
        """How many reads came from each source."""
        return dict(collections.Counter(r.source for r in self.reads))

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        self.storage_data = {}
        self.reads = []
        if checkpoint_id:
            self.path = _service.norm(checkpoint_id)
        self.load_id = uuid.uuid4().hex

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The checkpoint's ``.metadata`` (from the cache, else storage).

        Raises:
            FileNotFoundError: the directory holds no complete checkpoint.
        """
        path = os.path.join(self.path, METADATA)
        mm, _ = self._map(path)
        if mm is None:
            raise FileNotFoundError(
                errno.ENOENT,
                f"no complete DCP checkpoint in {self.path}: its {METADATA} is neither in this "
                "node's cache nor on storage (a save that did not finish on every rank "
                "writes none)",
                path)
        try:
            metadata = pickle.loads(mm)
        finally:
            del mm
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        if metadata.storage_data is None:
            raise ValueError(f"{os.path.join(self.path, METADATA)} has no storage data")
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[Any]] = {}
        for req in plan.items:
            per_file.setdefault(self.storage_data[req.storage_index].relative_path, []).append(req)
        for name, reqs in per_file.items():
            path = os.path.join(self.path, name)
            mm, source = self._map(path)
            if mm is None:
                raise FileNotFoundError(
                    errno.ENOENT, f"DCP checkpoint {self.path}: data file {name} is neither in "
                    "this node's cache nor on storage", path)
            try:
                for req in sorted(reqs, key=lambda r: self.storage_data[r.storage_index].offset):
                    self._read(mm, name, source, req, planner)
            finally:
                del mm
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def _read(self, mm: Any, name: str, source: str, req: Any, planner: LoadPlanner) -> None:
        info = self.storage_data[req.storage_index]
        if getattr(info, "transform_descriptors", None):
            raise ValueError(f"{name}: stream transforms {info.transform_descriptors} are not "
                             "supported by tce.dcp.StorageReader; use FileSystemReader")
        if info.offset + info.length > len(mm):
            raise ValueError(f"{name}: item {req.storage_index.fqn} ends at "
                             f"{info.offset + info.length}, past the file's {len(mm)} bytes")
        self.reads.append(ReadRecord(name, info.offset, info.length, source))
        if req.type == LoadItemType.BYTE_IO:
            planner.load_bytes(req, io.BytesIO(mm[info.offset:info.offset + info.length]))
            return
        tensor = _service.load_range(mm, info.offset, info.length, map_location="cpu")
        for dim, (start, length) in enumerate(zip(req.storage_offsets, req.lengths)):
            if tensor.size(dim) != length:
                tensor = tensor.narrow(dim, start, length)
        target = planner.resolve_tensor(req).detach()
        if target.size() != tensor.size():
            raise ValueError(f"{name}: item {req.storage_index.fqn} has size "
                             f"{tuple(tensor.size())}, the plan wants {tuple(target.size())}")
        target.copy_(tensor)
        planner.commit_tensor(req, target)

    def _map(self, path: str) -> tuple[Any, str]:
        """(mapping of the file, "local" or "storage"), or (None, "") when
        neither the cache nor storage has it."""
        mm = _service.open_cached(path, job=self.job)
        if mm is not None:
            return mm, "local"
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    return b"", "storage"
                return mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE,
                                 prot=mmap.PROT_READ | mmap.PROT_WRITE), "storage"
        except FileNotFoundError:
            return None, ""

    @property
    def checkpoint_id(self) -> str:
        """The checkpoint directory."""
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))
