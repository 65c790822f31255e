"""The engine side of ``tce bench --weights --engine vllm``, run in the vLLM
environment (TCE installed there): an offline ``vllm.LLM`` on TCE's backend
that the bench drives, and :class:`BenchWorker`, the ``worker_extension_cls``
that gives each of its workers the other ways to load a version.

    python -m tce.tools._vllmworker MODEL JOB REPLY_FD

reads one JSON command a line on stdin and answers each, one JSON line, on
the inherited file descriptor REPLY_FD (vLLM logs to stdout): ``{"ready":
true}`` once the engine is up and connected to JOB (TCE_SOCKET), then for

* ``update``: ``Engine.update(version)``, TCE's whole update sequence;
* ``storage``: vLLM's own ``reload_weights`` from ``path`` (a directory of
  safetensors files);
* ``http``: the worker GETs the safetensors bytes at ``url`` and loads them;
* ``stage`` / ``floor`` / ``unstage``: the version's tensors read from
  ``path`` into the worker's memory, then only the load from them (the
  update's floor);
* ``poison`` / ``probe``: spoil, then read back, a row of the embedding, so
  the bench sees that each way loaded the version's bytes;

answering ``{"done": <time.monotonic()>, ...}`` (the clock every process
of the node shares) or ``{"error": ...}``.

Nothing here imports vLLM at module level: the package's import check runs
every module without it.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from typing import Any, Iterable

import torch

WORKER_EXTENSION = "tce.tools._vllmworker.BenchWorker"
PROBE = "model.embed_tokens.weight"   # the row that poison spoils and probe reads
PROBE_ROW = 2                         # (not the pad token's: zeros)
ENGINE_ARGS = dict(dtype="float32", max_model_len=512, block_size=32, seed=0, enforce_eager=True)
_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32}


def safetensors_views(buf: bytearray) -> list[tuple[str, torch.Tensor]]:
    """The tensors of a safetensors file held in ``buf``, as views of it
    (no copy: what the fastest receiver of the bytes would hand to vLLM)."""
    n = int.from_bytes(buf[:8], "little")
    if not 2 <= n <= len(buf) - 8:
        raise ValueError(f"not a safetensors file: header of {n} bytes in {len(buf)}")
    header = json.loads(bytes(buf[8:8 + n]))
    base = 8 + n
    out = []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(meta.get("dtype"))
        if dtype is None:
            raise ValueError(f"{name}: dtype {meta.get('dtype')!r} is not one the bench reads")
        start, end = meta["data_offsets"]
        if not 0 <= start <= end <= len(buf) - base:
            raise ValueError(f"{name}: data offsets {start}..{end} outside the file")
        item = torch.empty((), dtype=dtype).element_size()
        t = torch.frombuffer(buf, dtype=dtype, count=(end - start) // item, offset=base + start)
        out.append((name, t.view(meta["shape"])))
    return out


class BenchWorker:
    """Mixed into each vLLM worker (``worker_extension_cls``): the ways to
    load a version other than TCE's backend, each through vLLM's layerwise
    reload as vLLM's ``reload_weights`` runs it. Each returns the seconds
    it took inside the worker."""

    def _tce_bench_load(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        model = self.model_runner.get_model()
        initialize_layerwise_reload(model)
        model.load_weights(tensors)
        finalize_layerwise_reload(model, self.model_runner.model_config)

    def tce_bench_stage(self, path: str) -> int:
        """Read the safetensors file ``path`` into this worker's own memory
        (tensors of its own, faulted in): the floor's input. Returns their
        bytes."""
        from safetensors.torch import load_file

        self._tce_bench_staged = list(load_file(path).items())
        return sum(t.numel() * t.element_size() for _, t in self._tce_bench_staged)

    def tce_bench_floor(self) -> float:
        t0 = time.perf_counter()
        self._tce_bench_load(iter(self._tce_bench_staged))
        return time.perf_counter() - t0

    def tce_bench_unstage(self) -> None:
        self._tce_bench_staged = None

    def tce_bench_http(self, url: str) -> float:
        """GET the version's safetensors bytes and load them."""
        t0 = time.perf_counter()
        with urllib.request.urlopen(url, timeout=600) as r:
            size = int(r.headers["Content-Length"])
            buf = bytearray(size)
            view, got = memoryview(buf), 0
            while got < size:
                n = r.readinto(view[got:])
                if not n:
                    raise ConnectionError(f"{url}: the body ended after {got} of {size} bytes")
                got += n
        self._tce_bench_load(safetensors_views(buf))
        return time.perf_counter() - t0

    def tce_bench_poison(self) -> None:
        with torch.no_grad():
            self.model_runner.get_model().get_parameter(PROBE)[PROBE_ROW].fill_(-7.0)

    def tce_bench_probe(self) -> list[float]:
        return self.model_runner.get_model().get_parameter(PROBE)[PROBE_ROW, :8].tolist()


def _serve(model: str, job: str, reply: Any) -> None:
    from vllm import LLM

    from tce import vllm as tce_vllm

    llm = LLM(model=model, weight_transfer_config={"backend": "tce"},
              worker_extension_cls=WORKER_EXTENSION, **ENGINE_ARGS)
    [engine] = tce_vllm.connect([llm], job)

    def say(**kw: Any) -> None:
        reply.write(json.dumps(kw) + "\n")
        reply.flush()

    def rpc(method: str, *args: Any) -> Any:
        [out] = llm.collective_rpc(method, args=args)
        return out

    say(ready=True, pid=os.getpid())
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "update":
                t0 = time.monotonic()
                engine.update(cmd["version"])
                done = time.monotonic()
                say(done=done, update_s=done - t0, version=engine.version())
            elif op == "storage":
                llm.collective_rpc("reload_weights", kwargs={"weights_path": cmd["path"]})
                llm.reset_prefix_cache()
                say(done=time.monotonic())
            elif op == "http":
                worker_s = rpc("tce_bench_http", cmd["url"])
                llm.reset_prefix_cache()
                say(done=time.monotonic(), worker_s=worker_s)
            elif op == "stage":
                say(done=time.monotonic(), nbytes=rpc("tce_bench_stage", cmd["path"]))
            elif op == "floor":
                worker_s = rpc("tce_bench_floor")
                llm.reset_prefix_cache()
                say(done=time.monotonic(), worker_s=worker_s)
            elif op in ("unstage", "poison"):
                rpc(f"tce_bench_{op}")
                say(done=time.monotonic())
            elif op == "probe":
                say(done=time.monotonic(), probe=rpc("tce_bench_probe"), version=engine.version())
            elif op == "quit":
                say(done=time.monotonic())
                break
            else:
                say(error=f"unknown command {op!r}")
        except Exception as e:
            say(error=f"{op}: {type(e).__name__}: {e}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(f"usage: python -m {__spec__.name if __spec__ else 'tce.tools._vllmworker'} MODEL JOB REPLY_FD")
    with os.fdopen(int(sys.argv[3]), "w") as reply_file:
        _serve(sys.argv[1], sys.argv[2], reply_file)
