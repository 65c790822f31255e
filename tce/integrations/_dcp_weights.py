"""The weights of a DCP checkpoint in a published version, for
:mod:`tce.weights`: each tensor entry of its ``.metadata``, whole or a region
of it, read from the mapped files of the version.

A tensor saved by several ranks is several chunks (DTensor and FSDP shards,
a ShardedTensor's shards). Which part of which saved chunk fills which part
of the region asked for is DCP's own resharding
(``create_read_items_for_chunk_list``, what its planner runs for a load);
where a chunk lies in its data file is :func:`._dcp_item.tensor_layout`'s,
as for :class:`tce.dcp.StorageReader`. A region inside one chunk is a view
of the mapping (nothing copied); a region spanning chunks is assembled into
a new tensor, each part copied once.

The files are trusted no more than the StorageReader trusts them: the
metadata is unpickled with its allow list, every item must lie inside its
file, and every chunk must be a tensor of the metadata's dtype and size.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Iterable, Iterator

import torch
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from tce.errors import CorruptCheckpointError
from tce.integrations._dcp_format import METADATA
from tce.integrations._dcp_item import (MemorySource, Reads, Scratch, load_tensor, read_tensor,
                                        tensor_layout, view_tensor)
from tce.integrations._dcp_metadata import check_storage_data, load_metadata

__all__ = ["DcpWeights"]

# (offset, length) per dimension of a tensor.
Region = tuple[tuple[int, int], ...]


def _narrow(t: torch.Tensor, offsets: Iterable[int], lengths: Iterable[int]) -> torch.Tensor:
    for dim, (start, length) in enumerate(zip(offsets, lengths)):
        t = t.narrow(dim, start, length)
    return t


class DcpWeights:
    """The tensor entries of the DCP checkpoint in ``directory``.

    Args:
        directory: the checkpoint directory (its ``.metadata`` and data files).
        file_bytes: a file's bytes by path, as a flat uint8 tensor viewing a
            mapping of it (page-aligned); the caller caches and leases them.
        pick: which tensor entries (FQNs, in the metadata's order) are
            weights.
    """

    def __init__(self, directory: str, file_bytes: Callable[[str], torch.Tensor],
                 pick: Callable[[list[str]], list[str]]) -> None:
        self.directory = directory
        self._file_bytes = file_bytes
        self._path = os.path.join(directory, METADATA)
        data = file_bytes(self._path)
        metadata = load_metadata(data.numpy().tobytes(), self._path)
        if metadata.storage_data is None:
            raise CorruptCheckpointError(f"{self._path} has no storage data")
        self._storage = check_storage_data(metadata.storage_data, self._path)
        self._tensors = {fqn: md for fqn, md in metadata.state_dict_metadata.items()
                         if isinstance(md, TensorStorageMetadata)}
        self.names = pick(list(self._tensors))
        self._scratch = Scratch()

    def shape(self, fqn: str) -> torch.Size:
        """The tensor's global shape (all its chunks together)."""
        return torch.Size(self._tensors[fqn].size)

    def tensors(self, names: set[str] | None,
                region_of: Callable[[str, torch.Size], Region | None]
                ) -> Iterator[tuple[str, torch.Tensor]]:
        """(FQN, tensor) for each weight (those in ``names``), its region as
        ``region_of`` says (None: the whole tensor)."""
        for fqn in self.names:
            if names is None or fqn in names:
                yield fqn, self.read(fqn, region_of(fqn, self.shape(fqn)))

    def read(self, fqn: str, region: Region | None = None) -> torch.Tensor:
        """The region (offset, length per dimension; None: all) of the tensor
        ``fqn``: a view of the mapping when it lies in one saved chunk whose
        elements are aligned in the file, else a new tensor.

        Raises:
            CorruptCheckpointError: the saved chunks do not cover the region,
                or a chunk is not the tensor the metadata says.
        """
        md = self._tensors[fqn]
        if region is None:
            region = tuple((0, n) for n in md.size)
        offsets = [o for o, _ in region]
        lengths = [n for _, n in region]
        dtype = md.properties.dtype
        numel = math.prod(lengths)
        if numel == 0:
            return torch.empty(lengths, dtype=dtype)
        want = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(lengths))
        items = create_read_items_for_chunk_list(fqn, md, [want])
        covered = sum(math.prod(item.lengths) for item in items)
        if covered != numel:
            raise CorruptCheckpointError(
                f"{self._path}: the saved chunks of {fqn} hold {covered} of the {numel} elements "
                f"at {tuple(offsets)} of size {tuple(lengths)}")
        if len(items) == 1:
            view, _, _ = self._chunk(fqn, md, items[0].storage_index)
            if view is not None:
                return _narrow(view, items[0].storage_offsets, items[0].lengths)
        out = torch.empty(lengths, dtype=dtype)
        reads = Reads()
        for item in items:
            target = _narrow(out, item.dest_offsets, item.lengths)
            view, source, layout = self._chunk(fqn, md, item.storage_index)
            if view is not None:
                target.copy_(_narrow(view, item.storage_offsets, item.lengths))
            else:  # not aligned for its dtype: read its bytes
                read_tensor(source, layout, item.storage_offsets, item.lengths, target,
                            self._scratch, reads)
        reads.run()
        return out

    def _chunk(self, fqn: str, md: TensorStorageMetadata,
               index: Any) -> tuple[torch.Tensor | None, MemorySource, Any]:
        """The saved chunk at ``index``: (a view of it, or None where its
        elements are not aligned; its file; its layout)."""
        info = self._storage.get(index)
        if info is None:
            raise CorruptCheckpointError(f"{self._path} has no storage data for item {fqn}")
        if getattr(info, "transform_descriptors", None):
            raise ValueError(f"{info.relative_path}: stream transforms "
                             f"{info.transform_descriptors} are not supported; use DCP's "
                             "FileSystemReader")
        data = self._file_bytes(os.path.join(self.directory, info.relative_path))
        item = f"{info.relative_path}: item {fqn}"
        if info.offset + info.length > data.numel():
            raise CorruptCheckpointError(f"{item} ends at byte {info.offset + info.length}, "
                                         f"past the file's {data.numel()} bytes")
        source = MemorySource(data)
        try:
            layout = tensor_layout(source, info.offset, info.length)
        except CorruptCheckpointError as e:
            raise CorruptCheckpointError(f"{item}: {e.message}") from None
        if layout is None:  # not one plain tensor: torch.load it (a copy)
            view: torch.Tensor | None = load_tensor(source, item, info.offset, info.length)
            size, dtype = tuple(view.size()), view.dtype
        else:
            view = view_tensor(data, layout)
            size, dtype = layout.size, layout.dtype
        chunk = md.chunks[index.index] if index.index is not None else None
        want = tuple(chunk.sizes) if chunk is not None else None
        if size != want or dtype != md.properties.dtype:
            raise CorruptCheckpointError(f"{item} is a {dtype} tensor of size {size}; the "
                                         f"metadata says {md.properties.dtype}, size {want}")
        return view, source, layout
