"""vLLM takes its weights from TCE (see docs/weights.md, "In vLLM").

The engine side is a weight-transfer backend named ``tce``, registered in
every vLLM process by :func:`register` (the ``vllm.general_plugins`` entry
point TCE installs), so an engine started with
``weight_transfer_config={"backend": "tce"}`` (``--weight-transfer-config
'{"backend": "tce"}'``) needs no code of its own: each worker reads the
version it is told to load from its node's cache.

The trainer's side is here, and needs no vLLM: :class:`Engine` drives one
engine (an offline ``vllm.LLM`` in this process, or a server's URL) through
vLLM's update sequence, :func:`update` drives several at once, and
:func:`publish` is what a reinforcement-learning loop calls after
``optimizer.step()`` and the save::

    from tce import vllm as tce_vllm

    engines = tce_vllm.connect(["http://rollout-0:8000", "http://rollout-1:8000"], job="rl-run")
    ...
    model.save_pretrained(f"/ckpt/rl-run/step{n}")            # under tce.patch_torch
    tce_vllm.publish(f"step{n}", [f"/ckpt/rl-run/step{n}"], engines=engines)

:func:`follow` (``tce vllm follow``) is the asynchronous loop instead: it
waits for each version the trainer publishes and brings every engine to it.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from tce import weights
from tce.errors import InvalidArgumentError, TCEError

__all__ = ["Engine", "EngineUpdate", "UpdateFailedError", "connect", "follow", "publish",
           "register", "update"]

log = logging.getLogger("tce.vllm")

BACKEND = "tce"
PAUSE_MODES = ("keep", "wait", "abort")


def register() -> None:
    """Put the ``tce`` backend in vLLM's weight-transfer registry (the
    ``vllm.general_plugins`` entry point; vLLM calls it in each of its
    processes, possibly more than once)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(
            BACKEND, "tce._vllm_engine", "TCEWeightTransferEngine")


class UpdateFailedError(TCEError):
    """An engine refused or failed an update; it serves the version it served."""


@dataclass
class EngineUpdate:
    """How one engine's update went."""

    engine: str
    version: int
    seconds: float
    error: str | None = None


class Engine:
    """One vLLM engine the trainer (or a follower) updates: an offline
    ``vllm.LLM`` object in this process, or the base URL of a vLLM server
    started with ``VLLM_SERVER_DEV_MODE=1`` (which serves the update routes).

    Args:
        target: the ``LLM``, or ``http://host:port``.
        timeout: seconds one HTTP call may take.
    """

    def __init__(self, target: Any, *, timeout: float = 600.0) -> None:
        self.target = target
        self.timeout = timeout
        if isinstance(target, str):
            u = urllib.parse.urlsplit(target)
            if u.scheme not in ("http", "https") or not u.netloc:
                raise InvalidArgumentError(
                    f"a vLLM server is named by its URL (http://host:port), got {target!r}")
            self.name = target.rstrip("/")
        else:
            for call in ("init_weight_transfer_engine", "start_weight_update", "update_weights",
                         "finish_weight_update", "get_weight_version"):
                if not callable(getattr(target, call, None)):
                    raise InvalidArgumentError(f"{type(target).__name__} is neither a vLLM LLM nor a URL: "
                                               f"it has no {call}()")
            self.name = f"LLM@{id(target):x}"
        self._init_args: tuple[str, dict[str, Any]] | None = None
        self.initialised = False  # init answered (the engine may forget it by restarting)

    def __repr__(self) -> str:
        return f"Engine({self.name})"

    # -- vLLM's calls -------------------------------------------------------

    def _post(self, route: str, body: dict[str, Any] | None = None, **query: Any) -> Any:
        url = f"{self.name}/{route}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = json.dumps(body or {}).encode()
        req = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        return self._open(req)

    def _open(self, req: urllib.request.Request) -> Any:
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                raw = r.read(1 << 20)
        except urllib.error.HTTPError as e:
            detail = e.read(4096).decode(errors="replace")
            raise UpdateFailedError(f"{self.name}: {req.full_url.rsplit('/', 1)[-1]} answered "
                                    f"{e.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            raise UpdateFailedError(f"{self.name}: {getattr(e, 'reason', e)}") from None
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            raise UpdateFailedError(f"{self.name}: not a JSON answer: {raw[:200]!r}") from None

    def init(self, job: str, *, socket: str | None = None, sources: Sequence[str] | None = None,
             lease_s: float | None = None, chunk_mib: int | None = None) -> None:
        """``init_weight_transfer_engine``: the engine's workers will read
        ``job``'s versions from their node's server (``socket``), following
        it from ``sources`` (peer endpoints) when it is published on
        another node."""
        self._init_args = (job, dict(socket=socket, sources=sources, lease_s=lease_s, chunk_mib=chunk_mib))
        info: dict[str, Any] = {"job": job}
        for key, value in (("socket", socket), ("sources", list(sources) if sources else None),
                           ("lease_s", lease_s), ("chunk_mib", chunk_mib)):
            if value is not None:
                info[key] = value
        if isinstance(self.target, str):
            self._post("init_weight_transfer_engine", {"init_info": info})
        else:
            self.target.init_weight_transfer_engine({"init_info": info})
        self.initialised = True

    def version(self) -> int | None:
        """The version the engine serves (its ``weight_version``), or None
        when it serves none of TCE's (the weights it started with)."""
        if isinstance(self.target, str):
            req = urllib.request.Request(f"{self.name}/weight_info")
            v = (self._open(req) or {}).get("weight_version")
        else:
            v = self.target.get_weight_version()
        return int(v) if isinstance(v, str) and v.isdigit() else None

    def update(self, version: int, *, mode: str = "keep") -> EngineUpdate:
        """Bring the engine to ``version``: pause it (``mode``: ``keep``
        freezes requests in flight and resumes them on the new weights,
        ``wait`` lets them finish first, ``abort`` ends them), load, record
        the version (``/weight_info``), reset the prefix cache (its blocks
        were computed with the old weights), resume. A refused or failed
        load leaves the engine on the version it served, resumed; the
        error says why (raised as :class:`UpdateFailedError`)."""
        if mode not in PAUSE_MODES:
            raise InvalidArgumentError(f"mode must be one of {PAUSE_MODES}, got {mode!r}")
        start = time.monotonic()
        paused = False
        try:
            if isinstance(self.target, str):
                self._post("pause", mode=mode, clear_cache="false")
                paused = True
                self._post("start_weight_update")
                self._post("update_weights", {"update_info": {"version": version}})
                self._post("finish_weight_update", {"weight_version": str(version)})
                self._post("reset_prefix_cache")
            else:  # an offline LLM runs nothing between its calls: nothing to pause
                llm = self.target
                llm.start_weight_update()
                llm.update_weights({"update_info": {"version": version}})
                llm.finish_weight_update(weight_version=str(version))
                llm.reset_prefix_cache()
        except UpdateFailedError:
            raise
        except Exception as e:  # an offline engine's worker error comes as whatever it raised
            raise UpdateFailedError(f"{self.name}: {type(e).__name__}: {e}") from None
        finally:
            if paused:
                self._post("resume")
        return EngineUpdate(self.name, version, time.monotonic() - start)


def _engines(engines: Iterable[Any]) -> list[Engine]:
    out = [e if isinstance(e, Engine) else Engine(e) for e in engines]
    if not out:
        raise InvalidArgumentError("name at least one engine (a vLLM LLM or a server URL)")
    return out


def connect(engines: Iterable[Any], job: str | None = None, *, socket: str | None = None,
            sources: Sequence[str] | None = None, lease_s: float | None = None) -> list[Engine]:
    """Initialise TCE's backend on each engine (``LLM`` objects or server
    URLs) for ``job``; returns them as :class:`Engine` s."""
    from tce import _service

    job = _service.job_or_default(job)
    out = _engines(engines)
    for e in out:
        e.init(job, socket=socket, sources=sources, lease_s=lease_s)
    return out


def update(engines: Iterable[Any], version: int, *, mode: str = "keep") -> list[EngineUpdate]:
    """Bring every engine to ``version`` at once (a thread each).
    Returns each engine's outcome; raises :class:`UpdateFailedError`
    naming every engine that failed (the others serve ``version``)."""
    out = _engines(engines)
    with concurrent.futures.ThreadPoolExecutor(len(out)) as pool:
        futures = [pool.submit(e.update, version, mode=mode) for e in out]
    done: list[EngineUpdate] = []
    failed: list[str] = []
    for e, f in zip(out, futures):
        try:
            done.append(f.result())
        except Exception as err:
            failed.append(str(err) if isinstance(err, UpdateFailedError) else f"{e.name}: {err}")
    if failed:
        raise UpdateFailedError(f"version {version}: " + "; ".join(failed))
    return done


def publish(tag: str, paths: Iterable[str | os.PathLike] | None = None, *, engines: Iterable[Any],
            job: str | None = None, mode: str = "keep", world_size: int | None = None
            ) -> weights.VersionInfo:
    """What a trainer calls once every rank saved ``tag``: publish it as
    the job's next version (:func:`tce.weights.publish`), then bring every
    engine to it (:func:`update`). Returns the version."""
    info = weights.publish(tag, paths, job=job, world_size=world_size)
    update(engines, info.version, mode=mode)
    return info


def follow(engines: Iterable[Any], job: str | None = None, *, mode: str = "keep",
           wait_s: float = 600.0, stop: Callable[[], bool] | None = None,
           report: Callable[[weights.VersionInfo, list[EngineUpdate]], None] | None = None) -> None:
    """Keep every engine on the job's newest version: wait for each version
    the trainer publishes (``wait_newer``, answered when it is published,
    on this node or, for a followed job, when it reaches this node) and
    update each engine that serves an older one. An engine that fails is
    left on its version and tried again with the next. ``report`` gets
    each version and every engine's outcome, their lag included; ``stop``
    is asked after each round (None: forever)."""
    from tce import _service
    from tce.errors import DeadlineExceededError

    job = _service.job_or_default(job)
    out = _engines(engines)
    newest = 0
    while stop is None or not stop():
        try:
            info = weights.wait_newer(job, after=newest, timeout=wait_s)
        except DeadlineExceededError:
            continue
        newest = info.version
        results: list[EngineUpdate] = []
        with concurrent.futures.ThreadPoolExecutor(len(out)) as pool:
            futures = {e: pool.submit(_bring, e, newest, mode) for e in out}
        for e, f in futures.items():
            results.append(f.result())
        if report is not None:
            report(info, results)


def _bring(e: Engine, version: int, mode: str) -> EngineUpdate:
    """Update ``e`` to ``version`` unless it serves it already; never raises."""
    start = time.monotonic()
    try:
        if not e.initialised and e._init_args is not None:  # it was not up when first asked
            job, kw = e._init_args
            e.init(job, **kw)
        have = e.version()
        if have is not None and have >= version:
            return EngineUpdate(e.name, have, 0.0)
        try:
            return e.update(version, mode=mode)
        except UpdateFailedError as err:
            if "not initialised" not in str(err) or e._init_args is None:
                raise
            job, kw = e._init_args  # the engine restarted: it forgot the job
            e.init(job, **kw)
            return e.update(version, mode=mode)
    except Exception as err:
        try:
            have = e.version() or 0
        except Exception:
            have = 0
        return EngineUpdate(e.name, have, time.monotonic() - start, str(err))
