"""The checkpoint formats :mod:`tce.weights` reads, in one table.

Each :class:`WeightFormat` says which files of a published version it
reads as the model's weights (:attr:`~WeightFormat.select`) and how:
a file on its own (:attr:`~WeightFormat.read`: the tensors of its bytes,
each viewing them), or a checkpoint of several files read through the one
that names its tensors (:attr:`~WeightFormat.anchor`,
:attr:`~WeightFormat.checkpoint`: DCP's ``.metadata``). :data:`FORMATS`
is in order of preference: a version's weights are the files of the first
format that selects any (:func:`weight_files`), so a version with
safetensors files is read from them, whatever else it holds.

A new format is one entry: its ``select`` and its reader, inserted where
it ranks. Nothing else in :mod:`tce.weights` names a format.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Callable, Iterable, Iterator

import torch

from tce.core import _safetensors
from tce.core._torchload import load_mapping
from tce.errors import CorruptCheckpointError, FailedPreconditionError
from tce.integrations._dcp_format import METADATA as DCP_METADATA

# (name, tensor) pairs, each viewing a file's bytes.
Tensors = Iterator[tuple[str, torch.Tensor]]
# read(bytes, size, path, names): the tensors of a file held in bytes[:size] (only names, if given).
FileReader = Callable[[Any, int, str, "set[str] | None"], Tensors]
# checkpoint(directory, file_bytes, pick): a reader of the checkpoint in directory with
# shape(fqn) and tensors(names, region_of); file_bytes(path) is a file's bytes as a flat
# uint8 tensor (mapped, leased by the caller); pick(fqns) chooses the entries that are weights.
CheckpointReader = Callable[[str, Callable[[str], torch.Tensor], Callable[[list[str]], list[str]]], Any]

_ZIP_MAGIC = b"PK\x03\x04"
_SAFETENSORS = re.compile(r"\.safetensors$")
_DS_MODEL = re.compile(r"(^|/)(zero_pp_rank_\d+_)?mp_rank_\d+_model_states\.pt$")
# ZeRO-3's model-states files (one per rank): their parameters are placeholders.
_ZERO3_MODEL = re.compile(r"(^|/)zero_pp_rank_\d+_mp_rank_\d+_model_states\.pt$")
_TORCH = re.compile(r"\.(pt|pth|bin|ckpt)$")
# The names a server never gives a following node either (server_cpp/src/cache/weight_files.h).
_NOT_WEIGHTS = re.compile(r"optim|scheduler|rng|trainer_state|training_args")


@dataclasses.dataclass(frozen=True)
class WeightFormat:
    """One checkpoint format: which files of a version hold its weights,
    and how they are read."""

    name: str
    select: Callable[[list[str]], list[str]]  # the version's files this format reads, in order
    read: FileReader | None = None             # a file read on its own
    anchor: str | None = None                  # a checkpoint's file that names its tensors
    checkpoint: CheckpointReader | None = None  # reads the checkpoint in the anchor's directory


def _each(holds: Callable[[str], Any]) -> Callable[[list[str]], list[str]]:
    return lambda paths: [p for p in paths if holds(p)]


# ---- the readers -------------------------------------------------------------


def safetensors_tensors(mm: Any, size: int, path: str, names: set[str] | None) -> Tensors:
    """The tensors of a safetensors file, viewing its bytes."""
    buf = memoryview(mm)[:size]
    header = _safetensors.read_header(buf, source=path)
    for name, info in header.tensors.items():
        if names is None or name in names:
            yield name, _safetensors.view_tensor(buf, info)


def torch_tensors(mm: Any, size: int, path: str, names: set[str] | None) -> Tensors:
    """The state dict a torch.save file holds, unpickled with
    ``weights_only`` (its bytes may be another user's), viewing its bytes."""
    if bytes(mm[:4]) != _ZIP_MAGIC:
        raise CorruptCheckpointError(f"{path}: neither a torch.save nor a safetensors file")
    obj = load_mapping(mm, size, "cpu", weights_only=True)
    for name, t in state_dict_of(obj, path).items():
        if names is None or name in names:
            yield name, t


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


def _dcp_files(paths: list[str]) -> list[str]:
    """The ``.metadata`` and ``*.distcp`` files of every directory that has both."""
    metas = {os.path.dirname(p) for p in paths if os.path.basename(p) == DCP_METADATA}
    dirs = metas & {os.path.dirname(p) for p in paths if p.endswith(".distcp")}
    return [p for p in paths if os.path.dirname(p) in dirs
            and (os.path.basename(p) == DCP_METADATA or p.endswith(".distcp"))]


def _dcp_checkpoint(directory: str, file_bytes: Callable[[str], torch.Tensor],
                    pick: Callable[[list[str]], list[str]]) -> Any:
    from tce.integrations._dcp_weights import DcpWeights  # torch.distributed's, on first use
    return DcpWeights(directory, file_bytes, pick)


# ---- the table -----------------------------------------------------------------

FORMATS: list[WeightFormat] = [
    # Hugging Face save_pretrained (sharded or not), safetensors' save_file.
    WeightFormat("safetensors", _each(_SAFETENSORS.search), read=safetensors_tensors),
    # torch.distributed.checkpoint: a directory of .distcp files and a .metadata.
    WeightFormat("dcp", _dcp_files, anchor=DCP_METADATA, checkpoint=_dcp_checkpoint),
    # DeepSpeed's model states (its weights under "module"), ZeRO-1/2.
    WeightFormat("deepspeed", _each(lambda p: _DS_MODEL.search(p) and not _ZERO3_MODEL.search(p)),
                 read=torch_tensors),
    # torch.save files whose names do not say optimizer, scheduler or RNG state.
    WeightFormat("torch.save", _each(lambda p: _TORCH.search(p) and not _DS_MODEL.search(p)
                                     and not _NOT_WEIGHTS.search(os.path.basename(p))),
                 read=torch_tensors),
    # ZeRO-3's model states alone: placeholders, which reading refuses (state_dict_of).
    WeightFormat("deepspeed-zero3", _each(_ZERO3_MODEL.search), read=torch_tensors),
]


def weight_files(paths: Iterable[str]) -> list[str]:
    """Which files of a version hold the model's weights: those of the first
    format of :data:`FORMATS` that selects any. That is, its safetensors
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
    for fmt in FORMATS:
        chosen = fmt.select(paths)
        if chosen:
            return chosen
    return []


def read_file(mm: Any, size: int, path: str, names: set[str] | None) -> Tensors:
    """The tensors of a file read on its own, held in ``mm[:size]``: by the
    first format that would select it; a torch.save file otherwise (a file
    a reader named itself, under any name)."""
    fmt = next((f for f in FORMATS if f.read is not None and f.select([path])), None)
    return (fmt.read if fmt is not None else torch_tensors)(mm, size, path, names)


def checkpoints(paths: Iterable[str]) -> dict[str, WeightFormat]:
    """The checkpoints of several files among ``paths``: directory -> its
    format, for each directory that holds a format's anchor."""
    anchors = {f.anchor: f for f in FORMATS if f.anchor is not None}
    return {os.path.dirname(p): anchors[os.path.basename(p)] for p in paths
            if os.path.basename(p) in anchors}
