"""DeepSpeed integration: TCE's checkpoint engine (``TCECheckpointEngine``),
and what ``"checkpoint_engine": "tce"`` configures it with. The hook that
makes DeepSpeed select it is :mod:`tce.integrations._deepspeed_hook`:

DeepSpeed (0.17.1 and later) builds its checkpoint engine with
``create_checkpoint_engine(...)``, which ``deepspeed/runtime/engine.py``
imports by name: wrapping the function where it is defined would not reach
that name, so the hook wraps the name in ``engine.py``'s globals. Older
DeepSpeed constructs ``TorchCheckpointEngine()`` inside
``DeepSpeedEngine._configure_checkpointing``; there the hook wraps that method
and swaps the engine afterwards. Either way the hook also wraps
``load_checkpoint`` (to land on the newest complete, recoverable tag),
``_get_all_ckpt_names`` (DeepSpeed globs the disk for model files, which may
exist only in the cache) and ``_save_checkpoint`` (ZeRO-3: the gathered
weights join the tag, see ``_deepspeed_weights``), and gives
``deepspeed.runtime.state_dict_factory`` an ``os`` whose ``path.exists``
also sees cached files while a TCE engine loads (it asserts the model file
exists on disk).

Importing DeepSpeed takes seconds, so ``import tce`` never does: when
DeepSpeed is not imported yet, an import hook applies the wrappers the moment
``deepspeed.runtime.engine`` finishes loading, in whatever order the user
imports things.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import sys
from typing import Any

from tce import api, buffers, client, objects
from tce.core import dist
from tce.integrations import _deepspeed_loading as _loading
from tce.errors import DeadlineExceededError, TCEError
from tce.v1 import tce_pb2 as pb

log = logging.getLogger("tce.deepspeed")

ENGINE_NAME = "TCECheckpointEngine"


# ---------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------

def _param_dict(config_params: Any) -> dict:
    """The user's DeepSpeed config as a dict (DeepSpeedConfig keeps it)."""
    if config_params is None:
        return {}
    if isinstance(config_params, dict):
        return config_params
    return getattr(config_params, "_param_dict", None) or {}


def wants_tce(config_params: Any) -> bool:
    """Whether the DeepSpeed config selects TCE (``"checkpoint_engine": "tce"``)."""
    value = _param_dict(config_params).get("checkpoint_engine")
    return isinstance(value, str) and value.strip().lower() == "tce"


def _options(config_params: Any) -> dict[str, Any]:
    block = _param_dict(config_params).get("tce") or {}
    if not isinstance(block, dict):
        raise TCEError(f'the DeepSpeed config\'s "tce" block must be an object, got {block!r}')
    return dict(block)


# ---------------------------------------------------------------------------
# Tags and paths
# ---------------------------------------------------------------------------

def _tag_of(info: Any) -> str:
    """The tag of a create/commit argument: CheckpointCommitInfo or (older API) a string."""
    tag = getattr(info, "tag", info)
    return "" if tag is None else str(tag)


def _in_tag_dir(path: str, tag: str) -> bool:
    """Whether ``path`` lies in a directory named ``tag`` (DeepSpeed's layout)."""
    parent = os.path.dirname(path)
    while parent and parent != os.path.dirname(parent):
        if os.path.basename(parent) == tag:
            return True
        parent = os.path.dirname(parent)
    return False


# ---------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------

def _engine_class():
    # Here, not at the top: DeepSpeed is optional and takes seconds to import.
    from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine

    class TCECheckpointEngine(CheckpointEngine):
        """DeepSpeed's checkpoint engine contract, over the node's TCE cache.

        ``save`` returns once the file is in the cache (a memory copy);
        persistence happens in the server. ``commit`` synchronises the ranks
        and rank 0 records the complete tag, so ``latest`` (written by rank 0
        right after commit) never names a tag some rank did not finish.
        Options come from the config's ``"tce"`` block: any client setting
        (``socket``, ``job``, ``on_unavailable``, ``rpc_timeout``).
        """

        def __init__(self, config_params: Any = None, options: dict[str, Any] | None = None):
            super().__init__(config_params)
            self.name = ENGINE_NAME
            settings = _options(config_params) if options is None else dict(options)
            if settings:
                client.configure(**settings)  # unknown names raise here, clearly
            self.job = client.setting("job")
            # Asynchronous: saves return once their copies are enqueued; the
            # engine is "decoupled", so DeepSpeed commits (and writes
            # `latest`) at the next step, which is when commit() waits for them.
            self.async_save = bool(client.setting("async"))
            # ZeRO-3: each tag also carries the gathered weights (_deepspeed_weights).
            self.consolidate_weights = bool(client.setting("consolidate_weights"))
            self._pending_commit: Any = None
            self._tag = ""
            self._files: list[tuple[int, str, int]] = []  # this rank's (rank, path, size)
            self._saved_paths: list[str] = []
            self._tag_files: set[str] = set()  # files of the complete tags (learn_tags)
            self.loads_from_cache = 0
            self.loads_from_storage = 0
            self.bytes_read_directly = 0  # bytes of the files loads read from storage themselves
            self.latest_named: str | None = None  # what 'latest' named at the last resolve_tag
            self.ring = dist.join_ring(self.job)  # every rank builds the engine: a collective
            rank = dist.rank()
            message = (f"[TCE] checkpoint engine active: {ENGINE_NAME} "
                       f"(socket={client.setting('socket')}, job={self.job})")
            log.info(message)
            if rank == 0:
                # Printed whatever the log level: the failure this guards
                # against (no hook, DeepSpeed quietly using torch.save) is
                # silent, so the success must not be.
                print(message, file=sys.stderr, flush=True)

        # -- save ----------------------------------------------------------
        def create(self, info: Any) -> None:
            if self._pending_commit is not None:  # saved twice without a step in between
                self.commit(self._pending_commit)
            self._tag = _tag_of(info)
            self._files = []
            if self.async_save:
                self._pending_commit = info

        def makedirs(self, path: str, exist_ok: bool = False) -> None:
            os.makedirs(path, exist_ok=exist_ok)

        def save(self, state_dict: Any, path: str) -> None:
            rank = dist.rank()
            cached = buffers.save_file(state_dict, path, job=self.job, tag=self._tag, rank=rank,
                                       blocking=not self.async_save)
            path = os.path.abspath(path)
            size = cached.size if cached is not None else os.path.getsize(path)
            self._files.append((rank, path, size))
            self._saved_paths.append(path)

        def commit(self, info: Any) -> bool:
            """Every rank's files are cached (each save returned); gather them,
            and rank 0 records the tag as complete."""
            if self.async_save:
                self._pending_commit = None
                api.wait_staged()  # this rank's files are committed (or this raises)
            tag = _tag_of(info) or self._tag
            mine = [f for f in self._files if _in_tag_dir(f[1], tag)]
            everyone = dist.all_gather(mine)  # also the barrier: every rank finished
            rank, world = dist.rank(), dist.world_size()
            files = sorted(f for part in everyone for f in part)
            if rank == 0 and files:
                self._record_tag(tag, world, files)
                latest = os.path.join(getattr(info, "save_dir", None) or "", "latest")
                if getattr(info, "save_latest", True) and objects.is_object_path(latest):  # into the bucket,
                    objects.save_bytes(latest, tag.encode(), job=self.job, tag=tag, rank=rank)  # after the tag's files
            self._files = []
            return True

        def _record_tag(self, tag: str, world: int, files: list[tuple[int, str, int]]) -> None:
            record = pb.TagInfo(job=self.job, tag=tag, world_size=world,
                                files=[pb.TagFile(rank=r, path=p, size=s) for r, p, s in files])
            try:
                client.commit_tag(record)
            except TCEError as e:
                if client.setting("on_unavailable") == "raise":
                    raise
                log.warning("TCE: could not record tag %s as complete: %s", tag, e)

        # -- load ----------------------------------------------------------
        def load(self, path: str, map_location: Any = None) -> Any:
            api.wait_staged()  # a file this process is still staging loads complete
            # weights_only=False like DeepSpeed's own engine: client state
            # carries arbitrary objects (e.g. argparse.Namespace).
            obj, from_cache = buffers.load_file(path, map_location=map_location, weights_only=False,
                                                job=self.job)
            if from_cache:
                self.loads_from_cache += 1
            else:
                self.loads_from_storage += 1
                self.bytes_read_directly += _loading.size_on_storage(path)
            return obj

        # -- the rest of the contract --------------------------------------
        def is_data_parallel_writer(self, dp_rank: int) -> bool:
            return dp_rank == 0

        def is_decoupled(self) -> bool:
            # Synchronous: commit right after the saves, then `latest`.
            # Asynchronous: DeepSpeed asks get_commit_info() at every step.
            return self.async_save

        def get_commit_info(self) -> Any:
            return self._pending_commit

        def preserves_storage_sharing(self) -> bool:
            return True  # the layout keeps torch.save's storage sharing

        def cleanup(self) -> None:
            """engine.destroy(): a checkpoint saved since the last step is
            committed now (DeepSpeed would never write its `latest`)."""
            info = self._pending_commit
            if info is None:
                return
            self.commit(info)
            if getattr(info, "save_latest", False) and dist.rank() == 0:
                with open(os.path.join(info.save_dir, "latest"), "w") as f:
                    f.write(_tag_of(info))

        def wait(self, timeout: float | None = None) -> None:
            """Block until every file this engine saved is durable on storage."""
            paths, self._saved_paths = self._saved_paths, []
            if paths:
                api.wait(paths, timeout=timeout, job=self.job)

        # -- which tag to load ---------------------------------------------
        def learn_tags(self, load_dir: str,
                       tag: str | None = None) -> list[tuple[str, list[tuple[int, str, int]]]]:
            """The complete tags TCE knows in ``load_dir``, oldest first, as
            rank 0's server recorded them (collective); none recorded (empty
            nodes) under an object root: ``tag`` (the one being loaded) with the
            files the bucket holds of it. Their files count as present for
            DeepSpeed's file discovery on every rank, wherever they live: a load
            reads them from this node's cache, the ring or storage."""
            load_dir = os.path.abspath(load_dir)
            known = self._known_tags(load_dir, tag) if dist.rank() == 0 else None
            known = dist.broadcast(known) or []
            self._tag_files = {p for _, files in known for _, p, _ in files}
            return known

        def resolve_tag(self, load_dir: str) -> str | None:
            """The tag ``load_checkpoint(load_dir)`` should load (collective).

            ``latest`` when it names a complete tag whose files are all
            recoverable (each rank's own files in its node's cache, once a
            ring restore in flight has ended, or on storage); else the newest
            such tag, with a warning. None: TCE knows no tag here, so
            DeepSpeed reads ``latest`` itself. Raises when TCE knows tags but
            none is recoverable, naming the files that are missing.
            """
            load_dir = os.path.abspath(load_dir)
            latest = self.latest_named = _loading.latest_tag(load_dir, self.job)
            rank, world = dist.rank(), dist.world_size()
            known = self.learn_tags(load_dir, latest)
            if not known:
                return None
            in_memory = self._in_memory()  # one call, not one per file
            mine = [[(p, p in in_memory) for r, p, s in files
                     if r % world == rank and (p in in_memory or _on_storage(p, s))] for _, files in known]
            everyone = dist.all_gather(mine)
            names = [tag for tag, _ in known]
            found = [{p: cached for part in everyone for p, cached in part[i]} for i in range(len(known))]
            missing = [[p for _, p, _ in files if p not in found[i]] for i, (_, files) in enumerate(known)]
            good = [tag for tag, m in zip(names, missing) if not m]
            if latest is not None and latest not in names:
                return None  # not a TCE tag (e.g. written by another engine): DeepSpeed's way
            if latest is not None and latest in good:
                chosen = latest
            elif not good:
                want = latest if latest is not None else names[-1]
                lost = missing[names.index(want)]
                raise TCEError(
                    f"no recoverable checkpoint in {load_dir}: "
                    + (f"'latest' names {latest!r}, " if latest else "")
                    + f"complete tag(s) {names} have files that are neither cached nor on storage; "
                    + f"{want!r} misses {len(lost)}: " + ", ".join(lost[:8])
                    + (" ..." if len(lost) > 8 else "")
                )
            else:
                chosen = good[-1]
                lost = missing[names.index(latest)] if latest is not None else []
                if latest is not None:
                    message = (f"[TCE] 'latest' in {load_dir} names {latest!r}, whose files are "
                               f"lost (not cached and not on storage: {', '.join(lost[:8])}); loading "
                               f"{chosen!r}, the newest recoverable tag (recoverable: {good})")
                else:
                    message = f"[TCE] no 'latest' in {load_dir}; loading {chosen!r}, the newest recoverable tag"
                log.warning(message)
                if rank == 0:
                    _loading.ds_log(message, warning=True)
            from_storage = sorted(p for p, cached in found[names.index(chosen)].items() if not cached)
            if from_storage and rank == 0:
                message = (f"[TCE] tag {chosen!r}: {len(from_storage)} file(s) are in no node's cache "
                           f"and load from storage: {', '.join(from_storage[:8])}"
                           + (" ..." if len(from_storage) > 8 else ""))
                log.warning(message)
                _loading.ds_log(message, warning=True)
            return chosen

        def _known_tags(self, load_dir: str, tag: str | None) -> list[tuple[str, list[tuple[int, str, int]]]]:
            """Complete tags in ``load_dir``, oldest first (see learn_tags)."""
            try:
                # A replaced node 0 gets the tags it recorded back from the ring.
                tags = client.tags(self.job, wait_for_restore=True)
            except TCEError as e:
                log.warning("TCE: cannot list tags (%s); DeepSpeed reads 'latest' itself", e)
                return []
            out = []
            for t in tags:
                files = [(f.rank, f.path, f.size) for f in t.files]
                prefix = os.path.join(load_dir, t.tag) + os.sep
                if files and all(p.startswith(prefix) for _, p, _ in files):
                    out.append((t.tag, files))
            one_dir = tag not in (None, "", ".", "..") and "/" not in tag  # the bucket's bytes: checked
            tag_dir = os.path.join(load_dir, tag or ".")
            if not out and one_dir and objects.is_object_path(tag_dir):
                files = objects.stored_files(tag_dir, job=self.job)
                out = [(tag, [(0, p, s) for p, s in files])] if files else []
            return out

        def _in_memory(self) -> set[str]:
            """The job's paths this node's cache can serve (what tce.load reads
            from memory), once a ring restore of the job in flight has ended."""
            try:  # a file deleted or replaced on storage no longer counts
                files = client.files(self.job, check_storage=True, wait_for_restore=True)
            except DeadlineExceededError:
                raise  # the restore did not end in time: say so, never guess
            except TCEError:
                return set()
            return {f.path for f in files
                    if f.buffer_id and f.state not in (pb.FILE_STATE_PENDING, pb.FILE_STATE_EVICTED)}

        def cached_matches(self, pattern: str) -> list[str]:
            """Paths matching a glob pattern that are not on disk (yet): in
            this node's cache, or files of a complete tag (learn_tags), which
            a load finds in the ring or on storage."""
            pattern = os.path.abspath(pattern)
            return sorted(p for p in self._in_memory() | self._tag_files if fnmatch.fnmatchcase(p, pattern))

        def knows(self, path: str) -> bool:
            """Whether ``path`` is a file of a complete tag learn_tags found."""
            return os.path.abspath(path) in self._tag_files

    return TCECheckpointEngine


def _on_storage(path: str, size: int) -> bool:
    """Complete on storage (persisted files are renamed into place whole;
    an object root's files are fetched by the load, which says if one is gone)."""
    if objects.is_object_path(path):
        return True
    try:
        return os.path.getsize(path) == size
    except OSError:
        return False


_ENGINE_CLASS = None


def engine_class():
    """TCECheckpointEngine (needs DeepSpeed; built on first use)."""
    global _ENGINE_CLASS
    if _ENGINE_CLASS is None:
        _ENGINE_CLASS = _engine_class()
    return _ENGINE_CLASS


def _is_tce(engine: Any) -> bool:
    return type(engine).__name__ == ENGINE_NAME and hasattr(engine, "resolve_tag")
