"""Every client setting: one name, one default, one ``TCE_*`` override.

Precedence: :func:`tce.configure` (or :func:`override` in tests) > the
environment > the default. Read with :func:`get`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator


@dataclass(frozen=True)
class Knob:
    name: str
    env: str
    default: Any
    parse: Callable[[str], Any]
    doc: str


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        value = value.strip().lower()
        if value not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}, got {value!r}")
        return value

    return parse


def _positive_float(value: str) -> float:
    f = float(value)
    if f <= 0:
        raise ValueError(f"must be > 0, got {value!r}")
    return f


def _positive_int(value: str) -> int:
    i = int(value)
    if i <= 0:
        raise ValueError(f"must be an integer > 0, got {value!r}")
    return i


def _bool(value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"must be true or false, got {value!r}")


KNOBS = {
    k.name: k
    for k in (
        Knob("socket", "TCE_SOCKET", "/run/tce/tce.sock", str,
             "The cache server's gRPC socket; the fd socket is `<socket>.fd`."),
        Knob("job", "TCE_JOB", "default", str,
             "Job name: cache entries are keyed by (job, path)."),
        Knob("on_unavailable", "TCE_ON_UNAVAILABLE", "fallback",
             _choice("fallback", "raise"),
             "When the server is unreachable or full: `fallback` writes with plain "
             "torch.save (one warning) and loads from disk; `raise` raises."),
        Knob("rpc_timeout", "TCE_RPC_TIMEOUT", 60.0, _positive_float,
             "Seconds before a control call to the server gives up."),
        Knob("dcp_read_threads", "TCE_DCP_READ_THREADS", min(4, os.cpu_count() or 1),
             _positive_int,
             "tce.dcp.StorageReader: threads that copy planned regions straight "
             "into their tensors (and ranged reads through the ring in flight, at "
             "least one per slot of the session's range buffer)."),
        Knob("async", "TCE_ASYNC", False, _bool,
             "DeepSpeed engine: save asynchronously (copies overlap the next "
             "iteration; the tag is committed, and `latest` written, at the next "
             "step, after the copies finish)."),
        Knob("consolidate_weights", "TCE_CONSOLIDATE_WEIGHTS", False, _bool,
             "DeepSpeed engine, ZeRO-3: save_checkpoint also gathers the model's "
             "parameters and saves them whole, rank 0, as `<tag>/pytorch_model.bin` "
             "of the tag, so each published version holds weights tce.weights reads."),
    )
}

_lock = threading.Lock()
_overrides: dict[str, Any] = {}


def get(name: str) -> Any:
    """The effective value of a setting."""
    knob = KNOBS[name]
    with _lock:
        if name in _overrides:
            return _overrides[name]
    raw = os.environ.get(knob.env)
    if raw is None or raw == "":
        return knob.default
    try:
        return knob.parse(raw)
    except ValueError as e:
        raise ValueError(f"{knob.env}={raw!r}: {e}") from None


def _check(settings: dict[str, Any]) -> dict[str, Any]:
    for name, value in settings.items():
        if name not in KNOBS:
            raise TypeError(f"unknown TCE setting {name!r}; known: {', '.join(KNOBS)}")
        if isinstance(value, str):
            settings[name] = KNOBS[name].parse(value)
        elif KNOBS[name].parse is _positive_int:
            settings[name] = _positive_int(str(value))
        elif KNOBS[name].default is not None and isinstance(KNOBS[name].default, bool) \
                and not isinstance(value, bool):
            raise ValueError(f"TCE setting {name!r} must be true or false, got {value!r}")
    return settings


def configure(**settings: Any) -> None:
    """Set client settings for this process (overrides the environment)."""
    settings = _check(dict(settings))
    with _lock:
        _overrides.update(settings)


@contextlib.contextmanager
def override(**settings: Any) -> Iterator[None]:
    """Temporarily set client settings (for tests)."""
    settings = _check(dict(settings))
    with _lock:
        saved = dict(_overrides)
        _overrides.update(settings)
    try:
        yield
    finally:
        with _lock:
            _overrides.clear()
            _overrides.update(saved)
