"""What a TCE engine's load_checkpoint does around DeepSpeed's: the
prefetch of the tag on a ring of several nodes, one log line with where the
bytes came from, and DeepSpeed's file discovery (its state_dict_factory
checks ``os.path.exists`` for each file of a tag, which must also see files
that are only in the cache, in the ring, or named by a complete tag, while
:data:`loading` names the TCE engine)."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from tce import api, client, objects
from tce.errors import TCEError

log = logging.getLogger("tce.deepspeed")

loading = threading.local()  # .engine: the TCE engine inside load_checkpoint


class _CacheAwarePath:
    """os.path for DeepSpeed's state_dict_factory: exists() also sees files
    that are only in the cache, while a TCE engine loads."""

    def __getattr__(self, name: str) -> Any:
        return getattr(os.path, name)

    @staticmethod
    def exists(path: Any) -> bool:
        if os.path.exists(path):
            return True
        engine = getattr(loading, "engine", None)
        return engine is not None and (engine.knows(path) or api.cached(path, job=engine.job))


class _CacheAwareOs:
    path = _CacheAwarePath()

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


def patch_state_dict_factory() -> None:
    """Point DeepSpeed's state_dict_factory at the cache-aware os (idempotent)."""
    try:
        import deepspeed.runtime.state_dict_factory as factory
    except ImportError:
        return
    if isinstance(getattr(factory, "os", None), _CacheAwareOs) or getattr(factory, "os", None) is not os:
        return
    factory.os = _CacheAwareOs()


def size_on_storage(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0



def latest_tag(load_dir: str, job: str) -> str | None:
    """The tag DeepSpeed's ``latest`` in ``load_dir`` names: the file, else
    (under an object root) the object; None without one."""
    path = os.path.join(os.path.abspath(load_dir), "latest")
    if os.path.isfile(path):
        with open(path) as fd:
            return fd.read().strip() or None
    if objects.is_object_path(path):  # in the bucket only
        return (objects.read_bytes(path, job=job) or b"").decode(errors="replace").strip() or None
    return None


def prefetch(tag_dir: str, job: str) -> None:
    try:
        client.prefetch(tag_dir, job=job)
    except TCEError as e:  # an older server, or none: the loads read as they go
        log.debug("no prefetch of %s: %s", tag_dir, e)



def load_split(engine: Any) -> dict[str, int]:
    """Bytes this process's loads took so far, by where (client.loaded_bytes),
    and ``"direct"``: those it read from storage itself."""
    return {**client.loaded_bytes(), "direct": engine.bytes_read_directly}



def log_load_split(engine: Any, tag: Any, before: dict[str, int]) -> None:
    """One line per load_checkpoint: where its bytes came from."""
    after = load_split(engine)
    d = {k: (after.get(k, 0) - before.get(k, 0)) / 2**20 for k in ("cache", "peer", "storage", "direct")}
    message = (f"[TCE] loaded tag {tag}: {d['cache']:.1f} MiB from this node's memory, {d['peer']:.1f} MiB "
               f"from other nodes' memory, {d['storage']:.1f} MiB read from storage by this node's server, "
               f"{d['direct']:.1f} MiB read from storage by this rank")
    log.info(message)
    ds_log(message)



def ds_log(message: str, warning: bool = False) -> None:
    """Log through DeepSpeed's logger too, so the line shows in its output."""
    try:
        from deepspeed.utils import logger
    except ImportError:
        return
    (logger.warning if warning else logger.info)(message)
