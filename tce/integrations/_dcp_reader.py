"""``tce.dcp.StorageReader``: DCP's StorageReader over the node's cache, then
storage (see :mod:`tce.integrations.dcp`)."""

from __future__ import annotations

import collections
import dataclasses
import errno
import io
import mmap
import os
import socket
import uuid
from typing import Any, NamedTuple

import torch
from torch.distributed.checkpoint import Metadata
from torch.distributed.checkpoint import StorageReader as _DCPReader
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.futures import Future

from tce import api, buffers, client, objects
from tce.errors import CorruptCheckpointError, TCEError
from tce.integrations._dcp_format import METADATA, CheckpointDir
from tce.integrations._dcp_item import (FdSource, Reads, Scratch, Source, load_tensor,
                                        read_tensor, tensor_layout)
from tce.integrations._dcp_metadata import check_storage_data, load_metadata
from tce.integrations._dcp_ranges import RingRanges

__all__ = ["ReadRecord", "StorageReader"]


class ReadRecord(NamedTuple):
    """Where one read of :class:`StorageReader` came from."""

    path: str  # the file, relative to the checkpoint directory
    offset: int
    length: int
    source: str  # "local" (this node's cache), "peer" (another node's file, through the ring) or "storage"


class StorageReader(CheckpointDir, _DCPReader):
    """DCP's ``StorageReader`` over the node's cache, for any DCP checkpoint
    directory (saved through TCE or by ``FileSystemWriter``).

    Each file is read from this node's cache when it holds it (through a
    leased file descriptor, unmapped); else its planned byte ranges are read
    through the server from another node's file as the ring keeps it (the
    copy held on this node, or the other node's memory), only those ranges
    moving (under an object storage root, ranges of the object in the
    bucket, all from the object the load's first range of the file read:
    one replaced meanwhile fails the load); else the file is read from
    storage: by the node's server into its cache, once, when other ranks of
    the node read it too (the global plan finds those) or it is an object;
    by the rank itself otherwise. Only the planned byte ranges are touched, and each tensor's
    planned region is copied once, straight into its destination. :attr:`reads` lists every read with its source,
    :attr:`copies` how the tensors' regions were copied.

    Args:
        path: the checkpoint directory (DCP's ``checkpoint_id``).
        job: the cache job (default: the ``job`` setting).
    """

    def __init__(self, path: str | os.PathLike, *, job: str | None = None) -> None:
        super().__init__()
        self.path = client.norm(path)
        self.job = client.job_or_default(job)
        self.storage_data: dict[Any, Any] = {}
        self.load_id = uuid.uuid4().hex
        # Each object read by ranges in this load: the identity it began with.
        self._pins: dict[str, objects.ObjectPin] = {}
        self.reads: list[ReadRecord] = []
        # How the tensors' regions were copied: "direct" (from the file
        # straight into the destination) or "scratch" (through a buffer).
        self.copies: collections.Counter[str] = collections.Counter()
        self._scratch = Scratch()
        self._queued = Reads()
        self._commits: list[tuple[Any, Any]] = []

    def sources(self) -> dict[str, int]:
        """How many reads came from each source."""
        return dict(collections.Counter(r.source for r in self.reads))

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        """A new load (from ``checkpoint_id`` when given); :attr:`reads` restarts."""
        self.storage_data = {}
        self.reads = []
        self._pins = {}
        self.copies = collections.Counter()
        if checkpoint_id:
            self.path = client.norm(checkpoint_id)
        self.load_id = uuid.uuid4().hex

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The checkpoint's ``.metadata`` (from the cache, else storage),
        unpickled with an allow list of what DCP metadata holds (see
        :mod:`._dcp_metadata`): nothing else it names is called.

        Raises:
            FileNotFoundError: the directory holds no complete checkpoint.
            CorruptCheckpointError: its ``.metadata`` is not DCP metadata
                (a ``ValueError``).
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
            metadata = load_metadata(mm, path)
        finally:
            del mm
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        """Keep the metadata's map of items to files, offsets and lengths,
        once checked: every item in a file of this directory, at a byte range.

        A load begins here: the objects it reads are pinned afresh.

        Raises:
            CorruptCheckpointError: the metadata has no such map, or an item
                lies elsewhere (a ``ValueError``).
        """
        path = os.path.join(self.path, METADATA)
        if metadata.storage_data is None:
            raise CorruptCheckpointError(f"{path} has no storage data")
        self.storage_data = check_storage_data(metadata.storage_data, path)
        self._pins = {}

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """The plan as DCP made it (each rank reads what it needs), with the
        node it reads on (its server) for :meth:`prepare_global_plan`."""
        return dataclasses.replace(plan, storage_data=_NodeOf(_node()))

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """The plans as DCP made them, each with the data files another rank
        of its node reads too: a file not in any memory, the node's server
        reads from storage once for all of them (identical reads merged)."""
        readers: collections.Counter[tuple[str, str]] = collections.Counter()
        files = []
        for plan in plans:
            node = plan.storage_data.node if isinstance(plan.storage_data, _NodeOf) else None
            names = {self._info(req).relative_path for req in plan.items}
            files.append((node, names))
            if node is not None:
                readers.update((node, name) for name in names)
        return [dataclasses.replace(plan, storage_data=_Shared(frozenset(
                    name for name in names if node is not None and readers[(node, name)] > 1)))
                for plan, (node, names) in zip(plans, files)]

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read the planned items, file by file, in offset order; each file
        from this node's cache, else ranges of it through the ring, else
        storage (through the server when the file is shared, see the
        class). The future is already done.

        A tensor's planned region is copied once, from the file straight
        into the destination tensor (see :mod:`._dcp_item`).

        Raises:
            FileNotFoundError: a data file is neither cached, nor in the ring,
                nor on storage.
            tce.errors.FailedPreconditionError: a data file's object was
                replaced or deleted on object storage since this load read
                its first range.
            CorruptCheckpointError: the metadata places an item past its
                file's end, or not at all, or a tensor item is not the tensor
                the plan reads (not one torch reads, a region outside it, a
                header whose elements lie outside its record); a
                ``ValueError``.
            ValueError: a destination does not have the planned size, or an
                item uses a stream transform.
        """
        self._queued, self._commits = Reads(), []  # nothing left from a failed read
        shared = plan.storage_data.files if isinstance(plan.storage_data, _Shared) else frozenset()
        per_file: dict[str, list[Any]] = {}
        for req in plan.items:
            per_file.setdefault(self._info(req).relative_path, []).append(req)
        for name, reqs in per_file.items():
            path = os.path.join(self.path, name)
            reqs = sorted(reqs, key=lambda r: self._info(r).offset)
            cached = buffers.open_fd(path, job=self.job, local_only=True)
            if cached is not None:
                with cached:
                    self._read_file(FdSource(cached.fd, cached.size), name, "local", reqs, planner)
                continue
            if self._read_from_ring(path, name, reqs, planner):
                continue
            # Under an object root, or read by other ranks of this node too:
            # the server reads it from storage into its cache, once.
            fetched = None
            if name in shared or objects.is_object_path(path):
                before = client.loaded_bytes().get("storage", 0)
                fetched = buffers.open_fd(path, job=self.job)
            if fetched is not None:
                read_here = client.loaded_bytes().get("storage", 0) > before
                with fetched:
                    self._read_file(FdSource(fetched.fd, fetched.size), name,
                                    "storage" if read_here else "local", reqs, planner)
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                raise FileNotFoundError(
                    errno.ENOENT, f"DCP checkpoint {self.path}: data file {name} is neither in "
                    "this node's cache, nor in the ring, nor on storage", path) from None
            try:
                self._read_file(FdSource(fd, os.fstat(fd).st_size), name, "storage", reqs,
                                planner)
            finally:
                os.close(fd)
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def _read_file(self, source: FdSource, name: str, kind: str, reqs: list[Any],
                   planner: LoadPlanner) -> None:
        for req in reqs:  # all of them, before any is read
            info = self._item(name, req)
            if info.offset + info.length > source.size:
                raise CorruptCheckpointError(
                    f"{name}: item {req.storage_index.fqn} ends at byte "
                    f"{info.offset + info.length}, past the file's {source.size} bytes")
        for req in reqs:
            self._read(source, name, kind, req, planner)
        self._finish(planner)

    def _finish(self, planner: LoadPlanner) -> None:
        """Run the queued reads, then commit the tensors they filled."""
        self._queued.run()
        commits, self._commits = self._commits, []
        for req, target in commits:
            planner.commit_tensor(req, target)

    def _read_from_ring(self, path: str, name: str, reqs: list[Any],
                        planner: LoadPlanner) -> bool:
        """Each item's range through the server (another node's file as the
        ring keeps it), the next items' ranges in flight while one is copied
        (see :mod:`._dcp_ranges`); False, having read nothing, when the ring
        does not have the file."""
        infos = [self._item(name, req) for req in reqs]
        # Whether anyone in the ring has the file, and every byte the items
        # need (its last one is asked for), before the reads take the
        # session's range buffer (64 MiB of the server's) for a file that
        # then comes from storage.
        end = max(info.offset + info.length for info in infos)
        pin = self._pins.setdefault(path, objects.ObjectPin(path))
        try:
            found = buffers.read_range(path, max(end, 1) - 1, 1, job=self.job, pin=pin)
        except ValueError as e:
            raise CorruptCheckpointError(f"{name}: its items end at byte {end}, past the end "
                                         f"of the file the ring holds ({e})") from None
        if found is None:
            return False
        with RingRanges(path, [(info.offset, info.length) for info in infos],
                        job=self.job, pin=pin) as ranges:
            for i, req in enumerate(reqs):
                got = ranges.next()
                if got is None:
                    if i == 0:
                        return False
                    raise FileNotFoundError(
                        errno.ENOENT, f"DCP checkpoint {self.path}: data file {name} left the "
                        "ring during the load", path)
                source, kind = got
                self._read(source, name, kind, req, planner)
                self._finish(planner)
        return True

    def _info(self, req: Any) -> Any:
        """Where the metadata says the item ``req`` reads lies."""
        info = self.storage_data.get(req.storage_index)
        if info is None:
            raise CorruptCheckpointError(f"{os.path.join(self.path, METADATA)} has no storage "
                                         f"data for item {req.storage_index.fqn}")
        return info

    def _item(self, name: str, req: Any) -> Any:
        info = self._info(req)
        if getattr(info, "transform_descriptors", None):
            raise ValueError(f"{name}: stream transforms {info.transform_descriptors} are not "
                             "supported by tce.dcp.StorageReader; use FileSystemReader")
        return info

    def _read(self, source: Source, name: str, kind: str, req: Any,
              planner: LoadPlanner) -> None:
        """Load one item of the file ``source`` reads."""
        info = self._info(req)
        self.reads.append(ReadRecord(name, info.offset, info.length, kind))
        if req.type == LoadItemType.BYTE_IO:
            data = bytearray(info.length)
            source.readinto(memoryview(data), info.offset)
            planner.load_bytes(req, io.BytesIO(data))
            return
        target = planner.resolve_tensor(req).detach()
        if target.size() != torch.Size(req.lengths):
            raise ValueError(f"{name}: item {req.storage_index.fqn}: the plan wants size "
                             f"{tuple(req.lengths)}, its destination has "
                             f"{tuple(target.size())}")
        item = f"{name}: item {req.storage_index.fqn}"
        try:
            layout = tensor_layout(source, info.offset, info.length)
        except CorruptCheckpointError as e:
            raise CorruptCheckpointError(f"{item}: {e.message}") from None
        if layout is None:  # not one plain tensor: torch.load it
            tensor = load_tensor(source, item, info.offset, info.length)
            _check_region(item, tuple(tensor.size()), req)
            for dim, (start, length) in enumerate(zip(req.storage_offsets, req.lengths)):
                tensor = tensor.narrow(dim, start, length)
            target.copy_(tensor)
            planner.commit_tensor(req, target)
            return
        _check_region(item, layout.size, req)
        how = read_tensor(source, layout, req.storage_offsets, req.lengths, target,
                          self._scratch, self._queued)
        self.copies[how] += 1
        if how == "direct":  # committed once the queued reads ran (_finish)
            self._commits.append((req, target))
        else:
            planner.commit_tensor(req, target)

    def _map(self, path: str, *, local_only: bool = False) -> tuple[Any, str]:
        """(mapping of the file, "local" or "storage"), or (None, "") when
        neither the cache nor (unless ``local_only``) storage has it."""
        mm = buffers.open_mapping(path, job=self.job, local_only=local_only)
        if mm is not None:
            return mm, "local"
        if local_only:
            return None, ""
        return self._map_storage(path)

    @staticmethod
    def _map_storage(path: str) -> tuple[Any, str]:
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    return b"", "storage"
                return mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE,
                                 prot=mmap.PROT_READ | mmap.PROT_WRITE), "storage"
        except FileNotFoundError:
            return None, ""


def _check_region(item: str, size: tuple[int, ...], req: Any) -> None:
    """The region the plan reads (``req``'s storage offsets and lengths)
    lies inside the item's tensor, of ``size``.

    Raises:
        CorruptCheckpointError: it does not (the metadata and the data file
            disagree).
    """
    if len(req.lengths) != len(size) or any(
            start < 0 or length < 0 or start + length > n
            for start, length, n in zip(req.storage_offsets, req.lengths, size)):
        raise CorruptCheckpointError(f"{item} has size {size}, the plan wants "
                                     f"{tuple(req.lengths)} at {tuple(req.storage_offsets)}")


class _NodeOf(NamedTuple):
    """A local plan's ``storage_data``: the node the rank reads on."""

    node: str


class _Shared(NamedTuple):
    """A global plan's ``storage_data``: the data files other ranks of the
    rank's node read too."""

    files: frozenset[str]


def _node() -> str | None:
    """This rank's node as its server knows it (its ring endpoint, else the
    host, its socket and pid); None without a server."""
    try:
        st = api.status()
    except (TCEError, OSError):  # no server: each rank reads for itself
        return None
    return st.get("peer_endpoint") or f"{socket.gethostname()}|{st.get('socket')}|{st.get('pid')}"
