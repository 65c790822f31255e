"""``torch.load`` semantics over a cache mapping, without copying the data.

The zip directory and ``data.pkl`` are read through a small file object over
the mapping; every storage is a slice of one UntypedStorage that views the
mapping itself (as ``torch.load(mmap=True)`` does with a file). Argument
handling is torch.load's own (see load_mapping).
"""

from __future__ import annotations

import io
import mmap
import threading
from typing import Any

import torch
import torch.serialization as _ts

from tce.core._originals import torch_load  # the original torch.load, never the patch


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


# torch.load's private worker, which builds the tensors; torch.load passes it
# the archive's storage when it maps a file (mmap=True). Loads from the cache
# hand it the mapping of the cached bytes the same way.
_torch_private_load = _ts._load
_local = threading.local()


def _load_viewing_mapping(zip_file, map_location, pickle_module, pickle_file="data.pkl",
                          overall_storage=None, **pickle_load_args):
    overall = getattr(_local, "overall", None)
    if overall is not None and overall_storage is None:
        _local.overall = None  # this archive only
        overall_storage = overall
    return _torch_private_load(zip_file, map_location, pickle_module, pickle_file=pickle_file,
                               overall_storage=overall_storage, **pickle_load_args)


def load_mapping(
    mm: mmap.mmap,
    size: int,
    map_location: Any = None,
    pickle_module: Any = None,
    *,
    weights_only: bool | None = None,
    offset: int = 0,
    **pickle_load_args: Any,
) -> Any:
    """Unpickle the torch-zip file held in ``mm[offset:offset + size]``;
    storages view ``mm``.

    The call is torch.load's own, on a file object over the mapping, so every
    argument check, environment override (``TORCH_FORCE_WEIGHTS_ONLY_LOAD``,
    ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``), warning and error message is the
    installed torch's, word for word. Only the bytes differ: instead of
    reading each storage out of the file object (a copy), torch's worker gets
    the mapping as the archive's storage, as it gets a file's with mmap=True.
    """
    if _ts._load is not _load_viewing_mapping:  # once; a no-op for every other load
        _ts._load = _load_viewing_mapping
    overall = torch.frombuffer(mm, dtype=torch.uint8, count=size, offset=offset).untyped_storage()
    reader = _ViewReader(memoryview(mm)[offset : offset + size])
    _local.overall = overall
    try:
        return torch_load(reader, map_location, pickle_module, weights_only=weights_only,
                           mmap=False, **pickle_load_args)
    finally:
        _local.overall = None
        reader.close()
