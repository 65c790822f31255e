"""The hook that makes DeepSpeed select TCE's engine
(:mod:`tce.integrations._deepspeed`) for ``"checkpoint_engine": "tce"``:
the wrappers of ``deepspeed/runtime/engine.py`` described there, applied
when that module is loaded (an import hook) or at once when it is loaded
already, and ``attach`` for an engine made without the config entry."""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
import threading
from typing import Any

from tce.integrations import _deepspeed_loading as _loading
from tce.integrations import _deepspeed_weights as _ds_weights
from tce.integrations._deepspeed import ENGINE_NAME, _is_tce, _options, engine_class, log, wants_tce

_ENGINE_MODULE = "deepspeed.runtime.engine"
_MARK = "__tce_original__"
_install_lock = threading.RLock()
_finder: _EngineFinder | None = None  # noqa: F821 (defined below)


def _wrap_create(original):
    @functools.wraps(original)
    def create_checkpoint_engine(config_params=None, *args, **kwargs):
        if wants_tce(config_params):
            return engine_class()(config_params)
        return original(config_params, *args, **kwargs)

    setattr(create_checkpoint_engine, _MARK, original)
    return create_checkpoint_engine


def _wrap_configure(original):
    """Older DeepSpeed: no create_checkpoint_engine; swap after it ran."""
    @functools.wraps(original)
    def _configure_checkpointing(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if wants_tce(getattr(self, "_config", None)) and not _is_tce(self.checkpoint_engine):
            self.checkpoint_engine = engine_class()(self._config)
        return result

    setattr(_configure_checkpointing, _MARK, original)
    return _configure_checkpointing


def _wrap_load_checkpoint(original):
    @functools.wraps(original)
    def load_checkpoint(self, load_dir, tag=None, *args, **kwargs):
        engine = getattr(self, "checkpoint_engine", None)
        if not _is_tce(engine):
            return original(self, load_dir, tag, *args, **kwargs)
        universal = getattr(self, "load_universal_checkpoint", lambda: False)()
        loading_tag = tag
        if tag is None and not universal:
            tag = engine.resolve_tag(load_dir)
            loading_tag = tag if tag is not None else engine.latest_named  # DeepSpeed reads 'latest' then
        else:
            engine.learn_tags(load_dir, tag)  # DeepSpeed's file discovery sees the tag's files
        if loading_tag and engine.ring:  # empty nodes: every node starts reading its share of the tag
            _loading.prefetch(os.path.join(load_dir, str(loading_tag)), engine.job)
        _loading.loading.engine = engine
        before = _loading.load_split(engine)
        try:
            result = original(self, load_dir, tag, *args, **kwargs)
        finally:
            _loading.loading.engine = None
        _loading.log_load_split(engine, loading_tag, before)
        return result

    setattr(load_checkpoint, _MARK, original)
    return load_checkpoint


def _wrap_save_checkpoint(original):
    """DeepSpeed saved the model states of a tag (not committed yet): with
    consolidate_weights under ZeRO-3, add the gathered weights to the tag."""
    @functools.wraps(original)
    def _save_checkpoint(self, save_dir, tag, *args, **kwargs):
        result = original(self, save_dir, tag, *args, **kwargs)
        if _is_tce(getattr(self, "checkpoint_engine", None)) and _ds_weights.wanted(self):
            exclude = kwargs.get("exclude_frozen_parameters", args[1] if len(args) > 1 else False)
            _ds_weights.save_consolidated(self, save_dir, tag, bool(exclude))
        return result

    setattr(_save_checkpoint, _MARK, original)
    return _save_checkpoint


def _wrap_ckpt_names(original):
    @functools.wraps(original)
    def _get_all_ckpt_names(self, checkpoints_path, tag):
        names = original(self, checkpoints_path, tag)
        engine = getattr(self, "checkpoint_engine", None)
        if names or not _is_tce(engine):
            return names
        # Not on disk (yet): the cache may hold them.
        pattern = self._get_ckpt_name(checkpoints_path, tag, mp_placeholder="*")
        return engine.cached_matches(pattern)

    setattr(_get_all_ckpt_names, _MARK, original)
    return _get_all_ckpt_names


def _wrapped(fn: Any) -> bool:
    return getattr(fn, _MARK, None) is not None


def _patch_engine_module(module: Any) -> None:
    """Apply every wrapper to a loaded deepspeed.runtime.engine (idempotent)."""
    with _install_lock:
        if hasattr(module, "create_checkpoint_engine"):
            if not _wrapped(module.create_checkpoint_engine):
                module.create_checkpoint_engine = _wrap_create(module.create_checkpoint_engine)
        cls = module.DeepSpeedEngine
        wrappers = [("load_checkpoint", _wrap_load_checkpoint),
                    ("_get_all_ckpt_names", _wrap_ckpt_names),
                   ("_save_checkpoint", _wrap_save_checkpoint)]
        if not hasattr(module, "create_checkpoint_engine"):
            wrappers.append(("_configure_checkpointing", _wrap_configure))
        for name, wrap in wrappers:
            fn = cls.__dict__.get(name)
            if fn is not None and not _wrapped(fn):
                setattr(cls, name, wrap(fn))
        _loading.patch_state_dict_factory()
        log.debug("TCE hooked into %s", module.__name__)


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        _patch_engine_module(module)


class _EngineFinder(importlib.abc.MetaPathFinder):
    """Patches deepspeed.runtime.engine right after it is first imported."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _ENGINE_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


def install_deepspeed() -> None:
    """Make ``"checkpoint_engine": "tce"`` select TCE (idempotent, harmless
    without DeepSpeed). ``import tce`` calls it."""
    global _finder
    with _install_lock:
        module = sys.modules.get(_ENGINE_MODULE)
        if module is not None and hasattr(module, "DeepSpeedEngine"):
            _patch_engine_module(module)
        elif _finder is None:
            _finder = _EngineFinder()
            sys.meta_path.insert(0, _finder)


def attach(engine: Any, **options: Any) -> Any:
    """Use TCE for an engine returned by ``deepspeed.initialize`` (the explicit
    form of the config entry). ``options`` are client settings, like the
    ``"tce"`` block. Returns the TCE checkpoint engine."""
    import deepspeed.runtime.engine as module  # loaded already: the caller has an engine

    _patch_engine_module(module)
    current = getattr(engine, "checkpoint_engine", None)
    if _is_tce(current) and not options:
        return current
    merged = {**_options(getattr(engine, "_config", None)), **options}
    new = engine_class()(getattr(engine, "_config", None), options=merged)
    if current is not None and not _is_tce(current):
        message = f"[TCE] replacing {type(current).__name__} with {ENGINE_NAME}"
        log.info(message)
        _loading.ds_log(message)
    engine.checkpoint_engine = new
    return new

