"""``tce.patch_torch``: torch.save / torch.load through the cache, by path prefix.

The patch replaces ``torch.save``/``torch.load`` (and the same names in
``torch.serialization``). Calls whose target is a path under one of the
prefixes go through :func:`tce.save`/:func:`tce.load`; every other call (other
paths, file-like objects, the legacy format) reaches the original function
with its arguments untouched. TCE's own fallbacks call the originals captured
at import (``tce.client.torch_save``), so they never recurse into the patch.

Code that bound the functions before patching (``from torch import save``)
keeps the originals.
"""

from __future__ import annotations

import os
import pickle
import threading
from typing import Any

import torch

from tce import api, client

_lock = threading.Lock()
_prefixes: tuple[str, ...] = ()
_durable = False
_patched = False


def _under_prefix(f: Any) -> bool:
    if not isinstance(f, (str, os.PathLike)):
        return False
    path = os.path.abspath(os.fspath(f))
    return any(path == p or path.startswith(p.rstrip(os.sep) + os.sep) for p in _prefixes)


def _save(obj: Any, f: Any, pickle_module: Any = pickle,
          pickle_protocol: int = torch.serialization.DEFAULT_PROTOCOL,
          _use_new_zipfile_serialization: bool = True,
          _disable_byteorder_record: bool = False) -> None:
    if (_under_prefix(f) and _use_new_zipfile_serialization
            and not _disable_byteorder_record):
        cached = client.save_file(obj, f, pickle_module, pickle_protocol)
        if _durable and cached is not None:
            # Return only once the file is on storage, as torch.save + fsync.
            # (A fallback wrote the file directly and fsynced it already.)
            api.wait([f])
        return None
    # The legacy format and byteorder-less archives are not what the cache
    # writes: the caller asked for them, so the original writes them.
    return client.torch_save(obj, f, pickle_module, pickle_protocol,
                               _use_new_zipfile_serialization, _disable_byteorder_record)


def _load(f: Any, map_location: Any = None, pickle_module: Any = None, *,
          weights_only: bool | None = None, mmap: bool | None = None,
          **pickle_load_args: Any) -> Any:
    if _under_prefix(f):
        return api.load(f, map_location, pickle_module, weights_only=weights_only, mmap=mmap,
                         **pickle_load_args)
    return client.torch_load(f, map_location, pickle_module, weights_only=weights_only,
                               mmap=mmap, **pickle_load_args)


_save.__doc__ = f"torch.save, patched by TCE.\n\n{client.torch_save.__doc__ or ''}"
_load.__doc__ = f"torch.load, patched by TCE.\n\n{client.torch_load.__doc__ or ''}"


def patch_torch(prefixes: list[str | os.PathLike] | tuple[str | os.PathLike, ...],
                durable: bool = False) -> None:
    """Route ``torch.save``/``torch.load`` on paths under ``prefixes`` through TCE.

    With ``durable``, the patched ``torch.save`` returns only once the file
    is on storage (``tce.wait`` on its path), for scripts that read the path
    with other tools right after saving; without it, it returns once the
    bytes are in the cache. Calling it again replaces the prefixes and the
    choice. Undo with :func:`unpatch_torch`.

    Raises:
        ValueError: no prefix given, or a prefix that is not a path.
    """
    global _prefixes, _patched, _durable
    if isinstance(prefixes, (str, os.PathLike)):
        prefixes = [prefixes]
    if not prefixes:
        raise ValueError("patch_torch needs at least one path prefix, e.g. patch_torch(['/ckpt'])")
    resolved = []
    for p in prefixes:
        if not isinstance(p, (str, os.PathLike)) or not os.fspath(p):
            raise ValueError(f"patch_torch: {p!r} is not a path prefix")
        resolved.append(os.path.abspath(os.fspath(p)))
    with _lock:
        _prefixes = tuple(resolved)
        _durable = bool(durable)
        if not _patched:
            torch.save = torch.serialization.save = _save
            torch.load = torch.serialization.load = _load
            _patched = True


def unpatch_torch() -> None:
    """Restore the original ``torch.save``/``torch.load`` (idempotent)."""
    global _prefixes, _patched, _durable
    with _lock:
        if _patched:
            torch.save = torch.serialization.save = client.torch_save
            torch.load = torch.serialization.load = client.torch_load
            _patched = False
        _prefixes = ()
        _durable = False


def patched_prefixes() -> tuple[str, ...]:
    """The prefixes in effect (empty when torch is not patched)."""
    return _prefixes
