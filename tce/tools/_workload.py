"""What the benchmarks save and how they time it: sizes as people write
them, GPT-shaped state dicts, a tiny one, and the median of timed runs.

Shared by ``tce bench`` (:mod:`tce.tools._bench`, :mod:`tce.tools._persistbench`)
and ``tce bench --ring`` (:mod:`tce.tools._ringbench`).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable

import torch

_UNITS = {"b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gib": 1 << 30, "kb": 10**3, "mb": 10**6, "gb": 10**9}


def parse_size(text: str) -> int:
    """'1GiB', '512MiB', '1e9', '4096' -> bytes."""
    s = text.strip().lower().replace(" ", "")
    for unit in sorted(_UNITS, key=len, reverse=True):
        if s.endswith(unit) and s[: -len(unit)]:
            return int(float(s[: -len(unit)]) * _UNITS[unit])
    return int(float(s))


def _gpt_layer(hidden: int) -> list[tuple[str, tuple[int, ...]]]:
    return [
        ("ln_1.weight", (hidden,)), ("ln_1.bias", (hidden,)),
        ("attn.c_attn.weight", (3 * hidden, hidden)), ("attn.c_attn.bias", (3 * hidden,)),
        ("attn.c_proj.weight", (hidden, hidden)), ("attn.c_proj.bias", (hidden,)),
        ("ln_2.weight", (hidden,)), ("ln_2.bias", (hidden,)),
        ("mlp.c_fc.weight", (4 * hidden, hidden)), ("mlp.c_fc.bias", (4 * hidden,)),
        ("mlp.c_proj.weight", (hidden, 4 * hidden)), ("mlp.c_proj.bias", (hidden,)),
    ]


def gpt_state_dict(nbytes: int, *, dtype: torch.dtype = torch.float32,
                   device: str = "cpu", layers: int | None = None) -> dict[str, torch.Tensor]:
    """A GPT-2-shaped state dict of about ``nbytes`` (whole layers, random values).

    The width is the largest of 64..2048 whose token embedding (50304 x width)
    takes at most a quarter of the bytes, so small sizes still have layers.
    With ``layers``, the model has that many (12 tensors each, 4 more around
    them) and the widest width that fits: a small state dict with the tensor
    count of a large one, for timing what costs per tensor.
    """
    el = torch.tensor([], dtype=dtype).element_size()

    def dims(hidden: int) -> tuple[int, int, int]:  # vocab, bytes per layer, embedding bytes
        vocab = min(50304, max(256, nbytes // 4 // (hidden * el)))
        per_layer = sum(math.prod(s) for _, s in _gpt_layer(hidden)) * el
        return vocab, per_layer, (vocab * hidden + 1024 * hidden + 2 * hidden) * el

    widths = (2048, 1536, 1024, 768, 512, 256, 128, 64)
    if layers is None:
        hidden = next((h for h in widths if 50304 * h * el <= nbytes // 4), 64)
    else:
        hidden = next((h for h in widths if dims(h)[2] + layers * dims(h)[1] <= nbytes), 64)
    vocab, per_layer, embed = dims(hidden)
    n_layers = layers if layers is not None else max(1, round((nbytes - embed) / per_layer))
    layer = _gpt_layer(hidden)
    g = torch.Generator(device="cpu").manual_seed(0)

    def t(*shape: int) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype).uniform_(-0.1, 0.1, generator=g).to(device)

    sd = {"wte.weight": t(vocab, hidden), "wpe.weight": t(1024, hidden)}
    for i in range(n_layers):
        for name, shape in layer:
            sd[f"h.{i}.{name}"] = t(*shape)
    sd["ln_f.weight"], sd["ln_f.bias"] = t(hidden), t(hidden)
    return sd


# A 1 KiB state dict: its load time is the per-file cost, not the bytes'.
TINY = {"w": torch.zeros(256)}


def time_s(fn: Callable[[], Any]) -> float:
    """Seconds one call of `fn` takes."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median_s(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
    """The median of `repeats` timed calls, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    return statistics.median(time_s(fn) for _ in range(repeats))
