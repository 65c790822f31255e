"""``tce.dcp.StorageWriter``: DCP's StorageWriter and AsyncStager over the
node's cache (see :mod:`tce.integrations.dcp`)."""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import pickle
import uuid
from typing import Any

import torch
from torch.distributed.checkpoint import Metadata
from torch.distributed.checkpoint import StorageWriter as _DCPWriter
from torch.distributed.checkpoint.filesystem import _StorageInfo  # the .metadata format
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from tce import api, buffers, client, objects
from tce.core import dist
from tce.errors import NotCachedError, ServerUnavailableError, TCEError
from tce.integrations._dcp_format import (
    DCP_VERSION,
    METADATA,
    CheckpointDir,
    aligned,
    data_name,
    rank_of,
)
from tce.v1 import tce_pb2 as pb

__all__ = ["StorageWriter"]

log = logging.getLogger("tce.dcp")


def _compact(t: torch.Tensor) -> torch.Tensor:
    """``t``, on its device, its storage exactly its elements (what torch.save
    should write for it: a view would save its whole storage)."""
    t = t.detach()
    if t.untyped_storage().nbytes() != t.numel() * t.element_size() or t.storage_offset() != 0:
        t = t.clone(memory_format=torch.contiguous_format)
    return t


class _TensorArchive:
    """The torch.save archive of one compact tensor, as DCP's files hold it
    (its storage saved as a CPU one), written into a cache buffer. A GPU
    tensor's bytes are copied device-to-host straight into the buffer: no
    host copy of the tensor is made on the way."""

    def __init__(self, t: torch.Tensor) -> None:
        self.tensor = t
        if t.device.type == "cpu":
            self.layout = buffers.object_layout(t)
        else:  # laid out from a CPU stand-in (never touched: no memory used)
            self.layout = buffers.object_layout(
                torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="cpu"))
        self.size = self.layout.size

    def write(self, view: memoryview, tensor: torch.Tensor) -> None:
        if self.tensor.device.type == "cpu":
            self.layout.write(view, tensor)
            return
        self.layout.write_fixed(view)
        rec = self.layout.records[4]  # the one storage
        if rec.size:
            tensor[rec.data_offset:rec.data_offset + rec.size].copy_(
                _bytes_of(self.tensor.untyped_storage()))


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """A flat uint8 tensor over all of ``storage``, on its device."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _storage_view(buffer: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A tensor over ``buffer`` (uint8, the storage's bytes) shaped like ``like``."""
    if like.numel() == 0:
        return torch.empty_like(like, device="cpu")
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
            self.layout = _TensorArchive(_compact(data))
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


class StorageWriter(CheckpointDir, _DCPWriter, AsyncStager):
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
        self.path = client.norm(path)
        self.job = client.job_or_default(job)
        self._tag = tag
        self.rank = 0
        self.is_coordinator = False
        self.save_id = uuid.uuid4().hex
        self.saved: list[str] = []  # paths this rank committed (for wait())
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
        """A new save, into ``checkpoint_id`` when given.

        Raises:
            ValueError: ``stage`` laid this save out for another directory.
        """
        if checkpoint_id:
            path = client.norm(checkpoint_id)
            if self._staged_file is not None and path != self.path:
                raise ValueError(f"this writer staged into {self.path}; async_save was given "
                                 f"checkpoint_id={path!r}")
            self.path = path
        self.save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Note whether this rank coordinates, and its rank (DCP's ``rank=``)."""
        self.is_coordinator = is_coordinator
        rank = kwargs.get("rank")
        self.rank = dist.rank() if rank is None else int(rank)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """Create the directory (every rank: each may be on its own node)."""
        if not objects.is_object_path(self.path):  # an object root has no directories
            os.makedirs(self.path, exist_ok=True)
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """The coordinator, before any rank writes: a previous checkpoint's
        ``.metadata`` in this directory goes first, so a save that does not
        finish leaves none (never old metadata over new data files)."""
        meta = os.path.join(self.path, METADATA)
        try:
            client.remove(meta, job=self.job)
        except (NotCachedError, ServerUnavailableError):
            pass
        if objects.is_object_path(meta):
            objects.delete_object(meta, job=self.job)  # the bucket's old .metadata goes first too
        elif os.path.lexists(meta):
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
            name = data_name(rank, index)
            offsets, offset = [], 0
            for p in parts:
                offsets.append(offset)
                offset = aligned(offset + p.size)
            dest = buffers.allocate(os.path.join(self.path, name),
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
        metadata.version = DCP_VERSION
        metadata.storage_data = {r.index: r.storage_data for rs in results for r in rs}
        metadata.storage_meta = self.storage_meta()
        data = pickle.dumps(metadata)
        dest = buffers.allocate(os.path.join(self.path, METADATA), len(data), job=self.job,
                                tag=self.tag, rank=self.rank)
        dest.view[:] = data
        self._commit(dest)
        ends: dict[str, int] = {}
        for rs in results:
            for r in rs:
                info = r.storage_data
                end = info.offset + info.length
                ends[info.relative_path] = max(ends.get(info.relative_path, 0), end)
        files = [pb.TagFile(rank=rank_of(n), path=os.path.join(self.path, n),
                            size=self._size(os.path.join(self.path, n), end))
                 for n, end in sorted(ends.items())]
        files.append(pb.TagFile(rank=self.rank, path=os.path.join(self.path, METADATA),
                                size=len(data)))
        record = pb.TagInfo(job=self.job, tag=self.tag, world_size=len(results), files=files)
        try:
            client.commit_tag(record)
        except TCEError as e:
            log.warning("TCE: could not record %s as a complete tag: %s", self.path, e)

    def _size(self, path: str, at_least: int) -> int:
        """A data file's size: this node's cache knows it (a staged file may
        hold unreferenced items after the last one); else its last item's end."""
        try:
            return client.lookup(path, job=self.job).size
        except TCEError:
            return at_least

    def storage_meta(self) -> StorageMeta | None:
        """The checkpoint's id (its directory) and this save's id."""
        return StorageMeta(checkpoint_id=self.path, save_id=self.save_id)

    # -- asynchronous save -------------------------------------------------
    @property
    def should_synchronize_after_execute(self) -> bool:
        """False: DCP need not wait for the copies; the fence does."""
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
                    leaves.append((t, _TensorArchive(t)))

        collect(state_dict)
        if not leaves:
            return state_dict  # nothing to stage: write_data writes what there is
        os.makedirs(self.path, exist_ok=True)
        offsets, offset = [], 0
        for _, layout in leaves:
            offsets.append(offset)
            offset = aligned(offset + layout.size)
        size = offsets[-1] + leaves[-1][1].size
        name = data_name(dist.rank(), 0)
        dest = buffers.allocate(os.path.join(self.path, name), size, job=self.job,
                                tag=self.tag, rank=dist.rank())
        staged: dict[int, _Staged] = {}
        views: dict[int, torch.Tensor] = {}
        for (t, layout), offset in zip(leaves, offsets):
            rec = layout.layout.records[4]  # the first (only) storage's record
            view = _storage_view(dest.tensor[offset + rec.data_offset:
                                             offset + rec.data_offset + rec.size], t)
            if view.numel():
                staged[view.data_ptr()] = _Staged(offset, layout.size, view.shape, view.dtype)
            views[id(t)] = view

        def copy() -> None:
            for (t, layout), at in zip(leaves, offsets):
                layout.write(dest.view[at:at + layout.size], dest.tensor[at:at + layout.size])

        self._staged_file, self._staged = dest, staged
        self._staged_done = buffers.stage_later(dest.path, size, copy)
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
