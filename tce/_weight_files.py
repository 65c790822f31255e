"""Reading the weight files of a published version (for :mod:`tce.weights`):
which files and entries hold weights, the tensors of one mapped file, the
region of a tensor a reader asks for, and files read from storage."""

from __future__ import annotations

import builtins
import logging
import mmap
import operator
import os
import re
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

from tce.core import _safetensors
from tce.core._torchload import load_mapping
from tce.errors import (
    CorruptCheckpointError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotCachedError,
)
from tce.integrations._dcp_format import METADATA as DCP_METADATA

log = logging.getLogger("tce.weights")

_ZIP_MAGIC = b"PK\x03\x04"
_SAFETENSORS = re.compile(r"\.safetensors$")
_DS_MODEL = re.compile(r"(^|/)(zero_pp_rank_\d+_)?mp_rank_\d+_model_states\.pt$")
# ZeRO-3's model-states files (one per rank): their parameters are placeholders.
_ZERO3_MODEL = re.compile(r"(^|/)zero_pp_rank_\d+_mp_rank_\d+_model_states\.pt$")
_TORCH = re.compile(r"\.(pt|pth|bin|ckpt)$")
# The names a server never gives a following node either (server_cpp/src/cache/weight_files.h).
_NOT_WEIGHTS = re.compile(r"optim|scheduler|rng|trainer_state|training_args")


def _dcp_files(paths: list[str]) -> set[str]:
    """The ``.metadata`` and ``*.distcp`` files of every directory that has both."""
    metas = {os.path.dirname(p) for p in paths if os.path.basename(p) == DCP_METADATA}
    dirs = metas & {os.path.dirname(p) for p in paths if p.endswith(".distcp")}
    return {p for p in paths if os.path.dirname(p) in dirs
            and (os.path.basename(p) == DCP_METADATA or p.endswith(".distcp"))}


def weight_files(paths: Iterable[str]) -> list[str]:
    """Which files of a version hold the model's weights: its safetensors
    files if it has any (Hugging Face ``save_pretrained``, sharded or not);
    else its DCP checkpoints' files (a directory with ``.metadata`` and
    ``*.distcp`` files: ``torch.distributed.checkpoint``); else DeepSpeed's
    model-states files (``mp_rank_XX_model_states.pt``); else every
    torch.save file (``.pt``, ``.pth``, ``.bin``, ``.ckpt``) whose name does
    not say it holds optimizer, scheduler or RNG state. ZeRO-3's model-states
    files (``zero_pp_rank_N_mp_rank_XX_model_states.pt``) hold no weights,
    only placeholders: a version that has them and such a torch.save file
    besides (the consolidated weights, ``pytorch_model.bin``) gives that
    file; one that has only them gives them, and reading them raises
    :class:`~tce.errors.FailedPreconditionError`."""
    paths = list(paths)
    dcp = _dcp_files(paths)
    for pick in (lambda p: _SAFETENSORS.search(p),
                 lambda p: p in dcp,
                 lambda p: _DS_MODEL.search(p) and not _ZERO3_MODEL.search(p),
                 lambda p: (_TORCH.search(p) and not _DS_MODEL.search(p)
                            and not _NOT_WEIGHTS.search(os.path.basename(p))),
                 lambda p: _ZERO3_MODEL.search(p)):
        chosen = [p for p in paths if pick(p)]
        if chosen:
            return chosen
    return []


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


def state_dict_of(obj: Any, path: str) -> dict[str, torch.Tensor]:
    """The name -> tensor mapping a torch.save file holds: the object itself,
    or its ``module`` (DeepSpeed), ``state_dict`` or ``model`` entry.

    Raises:
        FailedPreconditionError: a DeepSpeed ZeRO-3 model-states file, whose
            ``module`` holds a placeholder for each parameter.
        CorruptCheckpointError: no state dict.
    """
    if isinstance(obj, dict):
        if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
            return obj
        for key in ("module", "state_dict", "model"):
            inner = obj.get(key)
            if isinstance(inner, dict) and all(isinstance(v, torch.Tensor) for v in inner.values()):
                if key == "module":
                    _refuse_partitioned(obj, inner, path)
                return inner
    raise CorruptCheckpointError(
        f"{path}: not a state dict (a dict of tensors, or one under 'module', 'state_dict' or "
        f"'model'); got {type(obj).__name__}")


def _refuse_partitioned(obj: dict, module: dict[str, torch.Tensor], path: str) -> None:
    """A DeepSpeed model-states file records each parameter's shape
    (``param_shapes``: a dict per parameter group; ``frozen_param_shapes``).
    Under ZeRO-3 the parameters in its ``module`` are placeholders of
    another shape (empty), the weights being partitioned over the ranks'
    optimizer states: reading them as weights would be silently wrong."""
    groups = obj.get("param_shapes")
    groups = [groups] if isinstance(groups, dict) else list(groups or [])
    groups.append(obj.get("frozen_param_shapes") or {})
    for shapes in groups:
        if not isinstance(shapes, dict):
            continue
        for name, shape in shapes.items():
            t = module.get(name)
            if t is not None and tuple(t.shape) != tuple(shape):
                raise FailedPreconditionError(
                    f"{path}: a DeepSpeed ZeRO-3 checkpoint's model states hold no weights: "
                    f"{name!r} is a placeholder of shape {list(t.shape)} for a parameter of shape "
                    f"{list(shape)} (the weights are partitioned over the ranks' optimizer "
                    "states). Save them whole in each checkpoint with \"tce\": "
                    "{\"consolidate_weights\": true} in the DeepSpeed config, or publish what "
                    "engine.save_16bit_model() saves (see docs/deepspeed.md)")



def mapped_tensors(mm: Any, size: int, path: str,
                   names: set[str] | None) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of a safetensors or torch.save file held in ``mm[:size]``,
    each viewing ``mm`` (a torch.save file is unpickled with
    ``weights_only``: its bytes may be another user's)."""
    if _SAFETENSORS.search(path):
        buf = memoryview(mm)[:size]
        header = _safetensors.read_header(buf, source=path)
        for name, info in header.tensors.items():
            if names is None or name in names:
                yield name, _safetensors.view_tensor(buf, info)
        return
    if bytes(mm[:4]) != _ZIP_MAGIC:
        raise CorruptCheckpointError(f"{path}: neither a torch.save nor a safetensors file")
    obj = load_mapping(mm, size, "cpu", weights_only=True)
    for name, t in state_dict_of(obj, path).items():
        if names is None or name in names:
            yield name, t


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
    yield from mapped_tensors(mm, size, path, names)
