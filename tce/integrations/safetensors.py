"""safetensors files through the cache: ``save_file`` / ``load_file`` with
the signatures of ``safetensors.torch``'s.

    from tce.integrations.safetensors import load_file, save_file

    save_file(model.state_dict(), "/ckpt/model.safetensors", metadata={"format": "pt"})
    weights = load_file("/ckpt/model.safetensors")   # views of the cached bytes

A save writes the bytes ``safetensors.torch.save_file`` writes for the same
input straight into a cache buffer (one copy per tensor, no file-sized
staging) and returns once they are committed; the server persists them as
an ordinary safetensors file. A load of a cached file gives tensors that
view a private, copy-on-write mapping of the cached bytes (no copy, and
writing to them never changes the cache); a file the cache does not hold is
read by ``safetensors.torch.load_file``. :func:`tce.patch_torch` sends
``safetensors.torch.save_file`` / ``load_file`` here for paths under its
prefixes.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch

from tce import buffers, client
from tce.v1 import tce_pb2 as pb

__all__ = ["lays_out", "load_file", "originals", "save_file"]

_originals: tuple[Callable[..., Any], Callable[..., Any]] | None = None


def originals() -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``safetensors.torch``'s own ``save_file`` and ``load_file``, never the
    patch (captured the first time this is called, which the patch does
    before it replaces them).

    Raises:
        ImportError: safetensors is not installed.
    """
    global _originals
    if _originals is None:
        import safetensors.torch as st

        _originals = (st.save_file, st.load_file)
    return _originals


def lays_out(tensors: Any) -> bool:
    """Whether :func:`save_file` writes these tensors' dtypes (False: one
    only safetensors itself names, e.g. a sub-byte float)."""
    return not isinstance(tensors, dict) or all(
        not isinstance(t, torch.Tensor) or t.dtype in buffers.SAFETENSORS_DTYPES.values()
        for t in tensors.values())


def save_file(tensors: dict[str, torch.Tensor], filename: str | os.PathLike,
              metadata: dict[str, str] | None = None, *, job: str | None = None, tag: str = "",
              rank: int | None = None) -> pb.FileInfo | None:
    """``safetensors.torch.save_file`` into the cache: the same bytes, the
    same refusals (``ValueError``, ``RuntimeError`` for tensors sharing
    memory, ``TypeError``), raised before anything is allocated. Metadata
    with several entries keeps the dict's order (safetensors' own order is
    a hash's).

    GPU tensors are copied device-to-host one at a time, straight into the
    buffer (synchronous copies into pageable memory).

    Returns:
        The committed file's ``FileInfo``; None when the server could not
        take it and the file was written directly (atomically, fsynced).

    Raises:
        MissingDirectoryError: the directory does not exist.
        CacheFullError, ServerUnavailableError: with ``on_unavailable = "raise"``.
    """
    plan = buffers.safetensors_layout(tensors, metadata)
    dest = buffers.allocate(filename, plan.size, job=job, tag=tag, rank=rank)
    try:
        plan.write(dest.tensor)
    except BaseException:
        dest.abort()
        raise
    return dest.commit()


def load_file(filename: str | os.PathLike, device: str | int | torch.device = "cpu", *,
              job: str | None = None, **options: Any) -> dict[str, torch.Tensor]:
    """``safetensors.torch.load_file``: the file's tensors by name, in file
    order. A cached file is read from the cache: on the CPU the tensors view
    a private mapping of it (no copy); on another device (``"cuda:0"``, or
    an int for a CUDA device, as safetensors takes it) they are copied
    there from the mapping. Otherwise ``safetensors.torch.load_file`` reads
    the file, with ``options`` (e.g. ``backend``).

    Raises:
        CorruptCheckpointError: the cached bytes are not a safetensors file.
        ImportError: the cache does not hold the file and safetensors is
            not installed.
    """
    opened = buffers.open_mapped_file(filename, job=job)
    if opened is None:
        return originals()[1](filename, device, **options)
    info, mapping = opened
    # The mapping is rounded up to whole pages: the file is its first
    # info.size bytes (a memoryview of them keeps the mapping, and so the
    # lease on the cached bytes, as long as a tensor views it).
    view = memoryview(mapping)[:info.size]
    tensors = dict(buffers.iter_safetensors(view, source=client.norm(filename)))
    target = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if target.type != "cpu":
        tensors = {name: t.to(target) for name, t in tensors.items()}
    return tensors
