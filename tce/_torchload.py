"""``torch.load`` semantics over a cache mapping, without copying the data.

The zip directory and ``data.pkl`` are read through a small file object over
the mapping; every storage is a slice of one UntypedStorage that views the
mapping itself (as ``torch.load(mmap=True)`` does with a file). Argument
handling (``weights_only`` and its environment overrides, ``pickle_module``,
``map_location`` in every form, extra pickle arguments) follows torch.load.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import warnings
from typing import Any

import torch
import torch.serialization as _ts

_TRUE = ("1", "y", "yes", "true")


class _ViewReader(io.RawIOBase):
    """A seekable read-only file over a memoryview (no copies but reads)."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def readinto(self, b) -> int:  # type: ignore[override]
        n = max(0, min(len(b), len(self._view) - self._pos))
        b[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def close(self) -> None:
        self._view.release()
        super().close()


def _resolve_weights_only(weights_only: bool | None, pickle_module: Any) -> bool:
    explicit = weights_only is not None
    if not explicit:
        weights_only = _ts._default_to_weights_only(pickle_module)
    force_on = os.getenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "0").lower() in _TRUE
    force_off = os.getenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0").lower() in _TRUE
    if force_on and force_off:
        raise RuntimeError(
            "Only one of `TORCH_FORCE_WEIGHTS_ONLY_LOAD` or "
            "`TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD` should be set, but both were set."
        )
    if force_on:
        return True
    if force_off and not explicit:
        return False
    return bool(weights_only)


def load_mapping(
    mm: mmap.mmap,
    size: int,
    map_location: Any = None,
    pickle_module: Any = None,
    *,
    weights_only: bool | None = None,
    **pickle_load_args: Any,
) -> Any:
    """Unpickle the torch-zip file held in ``mm[:size]``; storages view ``mm``."""
    weights_only = _resolve_weights_only(weights_only, pickle_module)
    if weights_only:
        if pickle_module is not None:
            raise RuntimeError(
                "Can not safely load weights when explicit pickle_module is specified"
            )
        if pickle_load_args:
            warnings.warn("pickle_load_args only works if `weights_only=False`.")
    elif pickle_module is None:
        pickle_module = pickle
    pickle_load_args.setdefault("encoding", "utf-8")
    overall = torch.frombuffer(mm, dtype=torch.uint8, count=size).untyped_storage()
    reader = _ViewReader(memoryview(mm)[:size])
    try:
        zip_file = torch._C.PyTorchFileReader(reader)
        if weights_only:
            try:
                return _ts._load(
                    zip_file, map_location, _ts._weights_only_unpickler,
                    overall_storage=overall, **pickle_load_args,
                )
            except pickle.UnpicklingError as e:
                raise pickle.UnpicklingError(
                    f"Weights only load failed (load with weights_only=False if you "
                    f"trust this checkpoint): {e}"
                ) from None
        return _ts._load(
            zip_file, map_location, pickle_module, overall_storage=overall, **pickle_load_args
        )
    finally:
        reader.close()
