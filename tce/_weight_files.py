"""Reading the weight files of a published version (for :mod:`tce.weights`):
which entries of a checkpoint hold weights, the region of a tensor a reader
asks for, and files read from storage or brought back into the cache. Which
files hold weights and how each format is read: :mod:`tce._weight_formats`."""

from __future__ import annotations

import builtins
import logging
import mmap
import operator
import os
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

from tce._weight_formats import read_file
from tce.errors import FailedPreconditionError, InvalidArgumentError, NotCachedError

log = logging.getLogger("tce.weights")


def weight_entries(fqns: Iterable[str]) -> list[str]:
    """Which tensor entries of a DCP checkpoint are weights: every one but
    the optimizer's, whose FQN's first component starts with ``optim``
    (``optim``, ``optimizer``, Lightning's ``optimizer_0``: what
    ``get_state_dict`` users, torchtitan and Lightning save it under).
    Entries that are not tensors (bytes) are never weights."""
    return [f for f in fqns if not f.split(".", 1)[0].startswith("optim")]


# (offset, length) per dimension: the part of a tensor a reader asks for.
Region = tuple[tuple[int, int], ...]
# shard(name, global shape) -> the region of that tensor to read, None for all of it.
Shard = Callable[[str, torch.Size], Sequence[tuple[int, int]] | None]


def part(shape: Sequence[int], dim: int, index: int, count: int) -> Region:
    """The region of a tensor of ``shape`` that is part ``index`` of
    ``count`` equal parts along ``dim`` (all of every other dimension): what
    a tensor-parallel rank ``index`` of ``count`` holds of a tensor split on
    ``dim``. For :meth:`Weights.tensors`' ``shard``::

        def shard(name, shape):
            if name.endswith(("q_proj.weight", "up_proj.weight")):
                return weights.part(shape, 0, tp_rank, tp_size)   # column parallel
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                return weights.part(shape, 1, tp_rank, tp_size)   # row parallel
            return None                                          # replicated

    Raises:
        InvalidArgumentError: ``dim`` is not a dimension of ``shape``,
            ``index`` not in ``[0, count)``, or ``count`` does not divide
            the dimension.
    """
    shape = tuple(shape)
    if not -len(shape) <= dim < len(shape):
        raise InvalidArgumentError(f"part: dimension {dim} of a tensor of shape {shape}")
    dim %= len(shape)
    if not 0 <= index < count or shape[dim] % count:
        raise InvalidArgumentError(f"part: part {index} of {count} equal parts of dimension {dim} "
                                   f"of shape {shape}")
    n = shape[dim] // count
    return tuple((index * n, n) if d == dim else (0, size) for d, size in enumerate(shape))


def region_of(name: str, shape: torch.Size, shard: Shard | None) -> Region | None:
    """What ``shard`` asks of the tensor ``name``, checked (None: all of it).

    Raises:
        InvalidArgumentError: not one (offset, length) pair per dimension,
            inside the tensor.
    """
    got = None if shard is None else shard(name, torch.Size(shape))
    if got is None:
        return None
    try:
        region = tuple((operator.index(o), operator.index(n)) for o, n in got)
    except (TypeError, ValueError):
        region = None
    if region is None or len(region) != len(shape) or any(
            o < 0 or n < 0 or o + n > size for (o, n), size in zip(region, shape)):
        raise InvalidArgumentError(f"shard({name!r}, {tuple(shape)}) gave {got!r}: not an "
                                   "(offset, length) pair inside each dimension")
    return region


def map_storage(path: str, f: Any) -> tuple[Any, int]:
    """A private mapping of a file of the version on storage, and its size.

    Raises:
        NotCachedError: storage has no such file.
        FailedPreconditionError: the file there is not the version's (its
            size differs from the one published: saved again since).
    """
    try:
        with builtins.open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if f is not None and f.size != size:
                raise FailedPreconditionError(
                    f"{path} on storage is not the version's file: {size} bytes, the version's "
                    f"has {f.size} (it was saved again since; read a newer version)")
            log.debug("reading %s from storage: %s", path, getattr(f, "reason", "") or "evicted")
            if size == 0:
                return b"", 0
            return mmap.mmap(fh.fileno(), size, flags=mmap.MAP_PRIVATE,
                             prot=mmap.PROT_READ | mmap.PROT_WRITE), size
    except FileNotFoundError:
        why = (f.reason or "evicted") if f is not None else "not a file of the version"
        raise NotCachedError(f"{path} is neither in this node's cache nor on storage "
                             f"({why})") from None


def through_cache(client: Any, job: str, path: str, f: Any) -> tuple[Any, int] | None:
    """A file of the version this server evicted, brought back into its
    cache as a load brings it (from a node's memory over the ring, else
    from storage: one read for all this node's readers, and by one node of
    the job's ring), still the version's (the server knows the file it
    wrote there): a private mapping and its size, under a lease its mapping
    holds. None for a file this server never held (another node's) or
    does not bring back: the reader reads storage itself.

    Raises:
        FailedPreconditionError: what the cache has is not the version's
            file (its size or record checksums differ: saved again since).
    """
    from tce.v1 import tce_pb2 as pb

    if f.state != pb.FILE_STATE_EVICTED:
        return None
    try:
        info, mm = client.open(job, path)
    except NotCachedError:
        return None
    differs = info.size != f.size or (
        info.records and f.records and
        [(r.name, r.crc32) for r in info.records] != [(r.name, r.crc32) for r in f.records])
    if differs:
        raise FailedPreconditionError(
            f"{path} in the cache is not the version's file ({info.size} bytes, the version's has "
            f"{f.size}; it was saved again since): read a newer version")
    return mm, info.size


def from_storage(path: str, f: Any, names: set[str] | None) -> Iterator[tuple[str, torch.Tensor]]:
    """A file of the version this server does not hold in memory (evicted,
    or another node's): mapped from storage with the reader's own rights."""
    mm, size = map_storage(path, f)
    yield from read_file(mm, size, path, names)
