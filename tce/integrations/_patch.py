"""``tce.patch_torch``: torch.save / torch.load, and safetensors' save_file /
load_file, through the cache, by path prefix.

The patch replaces ``torch.save``/``torch.load`` (and the same names in
``torch.serialization``). Calls whose target is a path under one of the
prefixes go through :func:`tce.save`/:func:`tce.load`; every other call (other
paths, file-like objects, the legacy format) reaches the original function
with its arguments untouched. TCE's own fallbacks call the originals captured
at import (``tce.buffers.torch_save``), so they never recurse into the patch.

Where safetensors is installed, ``safetensors.torch.save_file`` and
``load_file`` are replaced the same way (paths under the prefixes go to
:mod:`tce.integrations.safetensors`), and so are the names libraries that
save models bound to them at import (``transformers.modeling_utils``'s
``safe_save_file``, which ``save_pretrained`` calls): those of the modules
already imported are rebound now, and a module imported later binds the
patched functions itself.

Code that bound the functions before patching (``from torch import save``)
keeps the originals, libraries in :data:`REBOUND` aside.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
from typing import Any, Callable

import torch

from tce import api, buffers
from tce.integrations import safetensors as _st

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
        cached = buffers.save_file(obj, f, pickle_module, pickle_protocol)
        if _durable and cached is not None:
            # Return only once the file is on storage, as torch.save + fsync.
            # (A fallback wrote the file directly and fsynced it already.)
            api.wait([f])
        return None
    # The legacy format and byteorder-less archives are not what the cache
    # writes: the caller asked for them, so the original writes them.
    return buffers.torch_save(obj, f, pickle_module, pickle_protocol,
                              _use_new_zipfile_serialization, _disable_byteorder_record)


def _load(f: Any, map_location: Any = None, pickle_module: Any = None, *,
          weights_only: bool | None = None, mmap: bool | None = None,
          **pickle_load_args: Any) -> Any:
    if _under_prefix(f):
        return api.load(f, map_location, pickle_module, weights_only=weights_only, mmap=mmap,
                         **pickle_load_args)
    return buffers.torch_load(f, map_location, pickle_module, weights_only=weights_only,
                              mmap=mmap, **pickle_load_args)


_save.__doc__ = f"torch.save, patched by TCE.\n\n{buffers.torch_save.__doc__ or ''}"
_load.__doc__ = f"torch.load, patched by TCE.\n\n{buffers.torch_load.__doc__ or ''}"


def _save_safetensors(tensors: dict[str, torch.Tensor], filename: str | os.PathLike,
                      metadata: dict[str, str] | None = None) -> None:
    """safetensors.torch.save_file, patched by TCE: a path under the
    prefixes goes to the cache (a dtype only safetensors names, to it)."""
    if _under_prefix(filename) and _st.lays_out(tensors):
        cached = _st.save_file(tensors, filename, metadata)
        if _durable and cached is not None:
            api.wait([filename])
        return None
    return _st.originals()[0](tensors, filename, metadata=metadata)


def _load_safetensors(filename: str | os.PathLike, device: Any = "cpu",
                      **options: Any) -> dict[str, torch.Tensor]:
    """safetensors.torch.load_file, patched by TCE: a path under the
    prefixes is read from the cache when it holds it (``options`` such as
    ``backend`` then apply to a read from storage only)."""
    if _under_prefix(filename):
        return _st.load_file(filename, device, **options)
    return _st.originals()[1](filename, device, **options)


# Packages whose modules bind safetensors' functions by name at import
# (transformers: ``from safetensors.torch import save_file as
# safe_save_file`` in modeling_utils): the patch rebinds those names too.
REBOUND = ("transformers", "accelerate", "peft", "diffusers")


def _rebind(old: tuple[Callable[..., Any], ...], new: tuple[Callable[..., Any], ...]) -> None:
    """In every imported module of :data:`REBOUND`, each name bound to one
    of ``old`` is bound to its counterpart in ``new``."""
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".", 1)[0] not in REBOUND:
            continue
        namespace = getattr(module, "__dict__", {})
        for attr, value in list(namespace.items()):
            for o, n in zip(old, new):
                if value is o:
                    namespace[attr] = n


def _patch_safetensors(on: bool) -> None:
    """Install (``on``) or remove the safetensors patch; nothing when
    safetensors is not installed."""
    try:
        originals = _st.originals()
        import safetensors.torch as st
    except ImportError:
        return
    patched = (_save_safetensors, _load_safetensors)
    old, new = (originals, patched) if on else (patched, originals)
    st.save_file, st.load_file = new
    _rebind(old, new)


def patch_torch(prefixes: list[str | os.PathLike] | tuple[str | os.PathLike, ...],
                durable: bool = False) -> None:
    """Route ``torch.save``/``torch.load`` on paths under ``prefixes`` through TCE,
    and ``safetensors.torch.save_file``/``load_file`` (with the names
    Hugging Face libraries bound to them: ``save_pretrained``) where
    safetensors is installed.

    With ``durable``, the patched saves return only once the file
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
            _patch_safetensors(True)
            _patched = True


def unpatch_torch() -> None:
    """Restore the original ``torch.save``/``torch.load`` and safetensors'
    functions, wherever the patch put its own (idempotent)."""
    global _prefixes, _patched, _durable
    with _lock:
        if _patched:
            torch.save = torch.serialization.save = buffers.torch_save
            torch.load = torch.serialization.load = buffers.torch_load
            _patch_safetensors(False)
            _patched = False
        _prefixes = ()
        _durable = False


def patched_prefixes() -> tuple[str, ...]:
    """The prefixes in effect (empty when torch is not patched)."""
    return _prefixes
