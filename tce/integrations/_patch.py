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
:mod:`tce.integrations.safetensors`).

Names that modules bound to these functions at import (``from torch import
save``, ``from safetensors.torch import save_file``, transformers'
``safe_save_file``, which ``save_pretrained`` calls) are rebound too: the
patch walks the imported modules and replaces each module attribute that is
the original function object (by identity) with the patched one, and
unpatching puts the original back in each attribute that is the patched
function. A module imported later binds the patched functions itself, through
the attributes of ``torch`` and ``safetensors.torch``. TCE's own modules keep
the originals (its fallbacks call them), and torch's and safetensors' modules
are left to the explicit assignments above. A module whose attribute cannot
be set keeps the unpatched function, with one warning naming it.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import types
import warnings
from typing import Any, Callable

import torch

from tce import api, buffers
from tce.integrations import safetensors as _st

_lock = threading.Lock()
_prefixes: tuple[str, ...] = ()
_durable = False
_patched = False
_warned: set[tuple[str, str]] = set()  # (module, what it kept) warned of already


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


# Packages the walk over the imported modules leaves alone: TCE's own
# modules hold the originals its fallbacks call, and torch and safetensors
# get the patch by the assignments below.
_LEFT_ALONE = ("tce", "torch", "safetensors")


def _functions() -> list[tuple[Callable[..., Any], Callable[..., Any]]]:
    """(original, patched) for each function the patch replaces."""
    pairs = [(buffers.torch_save, _save), (buffers.torch_load, _load)]
    try:
        pairs += zip(_st.originals(), (_save_safetensors, _load_safetensors))
    except ImportError:  # safetensors is not installed
        pass
    return pairs


def _package(name: str, module: types.ModuleType) -> str:
    """The top-level package of ``module`` (for ``__main__``, that of the
    module it was run as, ``python -m``)."""
    spec = vars(module).get("__spec__")
    return (getattr(spec, "name", None) or name).split(".", 1)[0]


def _rebind(swaps: list[tuple[Callable[..., Any], Callable[..., Any]]]) -> list[tuple[str, str]]:
    """In every imported module outside :data:`_LEFT_ALONE`, each attribute
    that is one of the first functions of ``swaps`` (by identity) is set to
    its counterpart. Returns (module, attribute) for each attribute that could
    not be set, which keeps its function."""
    kept: list[tuple[str, str]] = []
    for name, module in list(sys.modules.items()):
        if not isinstance(module, types.ModuleType):
            continue
        try:
            namespace = vars(module)
            if _package(name, module) in _LEFT_ALONE:
                continue
        except Exception:  # a module type that hides its namespace: nothing to see
            continue
        for attr, value in list(namespace.items()):
            for old, new in swaps:
                if value is not old:
                    continue
                try:
                    setattr(module, attr, new)
                except Exception:  # its module type refuses: the check below tells
                    pass
                if namespace.get(attr) is not new:
                    kept.append((name, attr))
                break
    return kept


def _warn_kept(kept: list[tuple[str, str]], what: str, outcome: str) -> None:
    """Warn, once per module and process, that a module kept ``what``
    (called without the lock: a warning filter may raise)."""
    for name, attr in kept:
        with _lock:
            if (name, what) in _warned:
                continue
            _warned.add((name, what))
        warnings.warn(f"TCE: module {name!r} keeps {what} as {attr!r} (the attribute cannot "
                      f"be set): {outcome}", RuntimeWarning, stacklevel=3)


def _patch_safetensors(on: bool) -> None:
    """Set ``safetensors.torch``'s ``save_file``/``load_file`` to the patched
    functions (``on``) or the originals; nothing when safetensors is not
    installed."""
    try:
        originals = _st.originals()
        import safetensors.torch as st
    except ImportError:
        return
    st.save_file, st.load_file = (_save_safetensors, _load_safetensors) if on else originals


def patch_torch(prefixes: list[str | os.PathLike] | tuple[str | os.PathLike, ...],
                durable: bool = False) -> None:
    """Route ``torch.save``/``torch.load`` on paths under ``prefixes`` through TCE,
    and ``safetensors.torch.save_file``/``load_file`` where safetensors is
    installed, with the names imported modules bound to them (``from torch
    import save``; transformers' for ``save_pretrained``).

    With ``durable``, the patched saves return only once the file
    is on storage (``tce.wait`` on its path), for scripts that read the path
    with other tools right after saving; without it, it returns once the
    bytes are in the cache. Calling it again replaces the prefixes and the
    choice. Undo with :func:`unpatch_torch`.

    Raises:
        ValueError: no prefix given, or a prefix that is not a path.

    Warns:
        RuntimeWarning: once per module whose attribute bound to an original
            cannot be set (it keeps the original).
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
    kept: list[tuple[str, str]] = []
    with _lock:
        _prefixes = tuple(resolved)
        _durable = bool(durable)
        if not _patched:
            torch.save = torch.serialization.save = _save
            torch.load = torch.serialization.load = _load
            _patch_safetensors(True)
            _patched = True
            # After the assignments: a module imported meanwhile binds the patch.
            kept = _rebind(_functions())
    _warn_kept(kept, "the unpatched function", "its calls bypass the cache")


def unpatch_torch() -> None:
    """Restore the original ``torch.save``/``torch.load`` and safetensors'
    functions, in ``torch``, ``safetensors.torch`` and each module attribute
    that is a patched function (idempotent)."""
    global _prefixes, _patched, _durable
    kept: list[tuple[str, str]] = []
    with _lock:
        if _patched:
            torch.save = torch.serialization.save = buffers.torch_save
            torch.load = torch.serialization.load = buffers.torch_load
            _patch_safetensors(False)
            _patched = False
            kept = _rebind([(new, old) for old, new in _functions()])
        _prefixes = ()
        _durable = False
    _warn_kept(kept, "TCE's patched function",
               "its calls reach the originals until patch_torch is called again")


def patched_prefixes() -> tuple[str, ...]:
    """The prefixes in effect (empty when torch is not patched)."""
    return _prefixes
