"""``tce bench --weights --engine vllm``: a real vLLM engine takes each
version the trainer publishes, through TCE's backend and through the other
ways a rollout engine gets new weights.

One node: a private server persisting under a storage root in a temp dir;
this process is the trainer; the engines are offline ``vllm.LLM``\\ s, each
in a child process of the vLLM environment (tce.tools._vllm_env, with
tce.tools._vllmworker's worker extension), serving a Qwen2 model of
``--hidden`` x ``--layers`` (float32). For each of ``--repeats`` versions
(plus one first, not counted), the trainer changes every weight, saves the
version with TCE's ``safetensors.save_file`` into its own directory, and
the engine loads it four ways, each from "the version is ready on the
trainer's side" to "the engine serves it" (its prefix cache reset):

* storage: vLLM's own ``reload_weights(weights_path=DIR)`` from the files
  the server persisted, their page cache dropped (fsync, then
  ``posix_fadvise(DONTNEED)``; the share of their pages still resident is
  reported), as a rollout node far from the trainer reads them;
* HTTP: the trainer serves the same safetensors bytes from its memory over
  HTTP (loopback); the worker GETs them into one buffer and loads views of
  it (no further copy);
* floor: the version's tensors already in the worker's own memory, and
  only ``initialize_layerwise_reload`` + ``load_weights`` +
  ``finalize_layerwise_reload`` (timed inside the worker);
* TCE: from just before ``weights.publish`` to the end of
  ``tce.vllm.Engine.update`` (start_weight_update, update_weights,
  finish_weight_update, reset_prefix_cache): every worker leases the
  version, maps the cached bytes and loads them.

The first version's loads (each way's first, with its one-time costs) are
not counted. Each way starts from a spoiled embedding row and must leave
the version's bytes there (the bench fails otherwise). Then a second
engine starts on the node and updates to the last version: the server's
buffers and used bytes before and after its update (no copy of the model
in the server). Medians; ratios within the run.

``--memory-backing hugetlb`` reserves the huge pages for the run (root),
as ``tce bench --weights`` does: on 4 KiB pages each worker faults in
every page of a version it maps, which the floor's own memory does not.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import http.server
import json
import mmap
import os
import select
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from tce import api, client, weights
from tce.tools import _vllm_env
from tce.tools._coldbench import huge_pages
from tce.tools._server import LocalServer
from tce.tools._vllmworker import PROBE, PROBE_ROW

JOB = "bench-vllm"
HIDDEN = 1024
LAYERS = 12
START_TIMEOUT_S = 900.0                # a vLLM engine's start on a busy CPU
CALL_TIMEOUT_S = 900.0


class EngineProcess:
    """One offline vLLM engine in a child process of the vLLM environment
    (tce.tools._vllmworker), driven one command at a time."""

    def __init__(self, python: Path, model: Path, job: str, *, env: dict[str, str], cwd: Path,
                 log: Path) -> None:
        self.log_path = log
        r, w = os.pipe()
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [str(python), "-m", "tce.tools._vllmworker", str(model), job, str(w)],
                stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, pass_fds=(w,),
                env=env, cwd=cwd, text=True, start_new_session=True)
        os.close(w)
        self._replies = os.fdopen(r)
        self._read(START_TIMEOUT_S, "start")

    def _tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def _read(self, timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        line, ended = "", False
        while not line and not ended and time.monotonic() < deadline:
            if select.select([self._replies], [], [], 1.0)[0]:
                line = self._replies.readline()
                ended = not line
            else:  # its engine core may outlive it, holding the pipe open
                ended = self.proc.poll() is not None
        if not line:
            state = f"exited ({self.proc.poll()})" if ended else "timed out"
            raise RuntimeError(f"bench: the vLLM engine {state} during {what}; its log "
                               f"({self.log_path}) ends:\n{self._tail()}")
        got = json.loads(line)
        if "error" in got:
            raise RuntimeError(f"bench: the vLLM engine failed: {got['error']}\n{self._tail()}")
        return got

    def call(self, op: str, **kw: Any) -> dict[str, Any]:
        self.proc.stdin.write(json.dumps(dict(kw, op=op)) + "\n")
        self.proc.stdin.flush()
        return self._read(CALL_TIMEOUT_S, op)

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.call("quit")
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
        except Exception:
            pass
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, 9)  # its engine core and worker too
                self.proc.wait()
            self._replies.close()


class BytesServer:
    """The trainer's side of the HTTP path: serves ``/v<N>`` from memory."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        store = self.data

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = store.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def drop_page_cache(path: Path) -> float:
    """fsync ``path`` and drop its pages from the page cache; returns the
    share of its pages still resident afterwards (mincore)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return resident_share(fd)
    finally:
        os.close(fd)


def resident_share(fd: int) -> float:
    """The share of the file's pages in the page cache (mincore of a
    mapping, which faults nothing in)."""
    size = os.fstat(fd).st_size
    if size == 0:
        return 0.0
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap")
    try:
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        if libc.mincore(addr, size, vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        return sum(b & 1 for b in vec) / pages
    finally:
        libc.munmap(addr, size)


def _median_s(xs: list[float]) -> float:
    return statistics.median(xs[1:] if len(xs) > 1 else xs)


def _status() -> dict[str, int]:
    s = api.status()
    return {k: int(s[k]) for k in ("buffers", "used_bytes")}


class Run:
    """One bench run: the server, the trainer's state, the engines."""

    def __init__(self, tmp: Path, python: Path, hidden: int, layers: int) -> None:
        from safetensors.torch import load_file

        from tce.tools._vllm_model import build

        self.tmp, self.python = tmp, python
        self.base = tmp / "base"
        build(self.base, hidden=hidden, layers=layers)
        self.sd = load_file(self.base / "model.safetensors")
        self.nbytes = sum(t.numel() * t.element_size() for t in self.sd.values())
        self.root = tmp / "storage"
        self.root.mkdir()
        # the version being saved, the one the engines load, the one they
        # leave (leased a moment longer), one to spare
        self.budget = max(1 << 30, 4 * self.nbytes + (256 << 20))
        self.server: LocalServer | None = None
        self.http: BytesServer | None = None
        self.engines: list[EngineProcess] = []
        self.version = 0

    def start(self, memory_backing: str) -> None:
        self.server = LocalServer(memory_budget=str(self.budget), storage_roots=[str(self.root)],
                                  extra_args=["--memory-backing", memory_backing]).start()
        self.http = BytesServer()
        self.env = _vllm_env.engine_env(self.server.socket)

    def engine(self) -> EngineProcess:
        n = len(self.engines)
        cwd = self.tmp / f"engine{n}"  # not the checkout: its tce/ would shadow the installed one
        cwd.mkdir()
        e = EngineProcess(self.python, self.base, JOB, env=self.env, cwd=cwd,
                          log=self.tmp / f"engine{n}.log")
        self.engines.append(e)
        return e

    def close(self) -> None:
        for e in self.engines:
            e.close()
        if self.http is not None:
            self.http.close()
        if self.server is not None:
            self.server.stop()
            self.server.cleanup()

    def save(self, n: int) -> Path:
        """The trainer's step: every weight changes; the version saved
        through the cache into a directory of its own, and its bytes put
        where the HTTP path serves them."""
        from safetensors.torch import save as to_bytes

        from tce.integrations import safetensors

        with torch.no_grad():
            for t in self.sd.values():
                t.add_(1e-3)
        d = self.root / JOB / f"v{n}"
        d.mkdir(parents=True)
        safetensors.save_file(self.sd, d / "model.safetensors", job=JOB, tag=f"v{n}")
        self.http.data.clear()
        self.http.data[f"/v{n}"] = to_bytes(self.sd)
        return d

    def check(self, engine: EngineProcess, way: str) -> None:
        """The engine holds this version's bytes (the row spoiled before)."""
        got = engine.call("probe")["probe"]
        want = self.sd[PROBE][PROBE_ROW, :8].tolist()
        if got != want:
            raise RuntimeError(f"bench: after the {way} load the engine holds {got[:3]}..., "
                               f"the version holds {want[:3]}...")

    def timed(self, engine: EngineProcess, way: str, op: str, **kw: Any) -> tuple[float, dict[str, Any]]:
        engine.call("poison")
        t0 = time.monotonic()
        got = engine.call(op, **kw)
        seconds = got["done"] - t0
        self.check(engine, way)
        return seconds, got

    def repeat(self, engine: EngineProcess, n: int, out: dict[str, list[float]]) -> None:
        d = self.save(n)
        api.wait([d / "model.safetensors"], timeout=600)
        out["storage_resident"].append(drop_page_cache(d / "model.safetensors"))
        s, _ = self.timed(engine, "storage", "storage", path=str(d))
        out["storage_s"].append(s)
        s, got = self.timed(engine, "http", "http", url=f"{self.http.url}/v{n}")
        out["http_s"].append(s)
        out["http_worker_s"].append(got["worker_s"])
        engine.call("stage", path=str(d / "model.safetensors"))
        s, got = self.timed(engine, "floor", "floor")
        engine.call("unstage")
        out["floor_call_s"].append(s)
        out["floor_s"].append(got["worker_s"])
        engine.call("poison")
        t0 = time.monotonic()
        self.version = weights.publish(f"v{n}", job=JOB).version
        got = engine.call("update", version=self.version)
        out["tce_s"].append(got["done"] - t0)
        out["tce_update_s"].append(got["update_s"])
        if got["version"] != self.version:
            raise RuntimeError(f"bench: the engine serves version {got['version']}, not {self.version}")
        self.check(engine, "TCE")


def run(hidden: int, layers: int, repeats: int, *, directory: str | None = None,
        memory_backing: str = "auto", say=print) -> dict[str, Any]:
    python = _vllm_env.ensure(say=say)
    with tempfile.TemporaryDirectory(prefix="tce-vbench-", dir=directory) as tmp:
        r = Run(Path(tmp), python, hidden, layers)
        # hugetlb: the budget's pages, and as many again for the engines'
        # private (copy-on-write) mappings, which reserve their pages when made
        pages = 2 * r.budget // (2 << 20) if memory_backing == "hugetlb" else 0
        with huge_pages(pages, "tce bench --weights --engine vllm --memory-backing hugetlb"):
            try:
                r.start(memory_backing)
                with client.override(socket=r.server.socket, job=JOB):
                    res = _measure(r, hidden, layers, repeats, say)
                    api.close()
            finally:
                r.close()
    return res


def _measure(r: Run, hidden: int, layers: int, repeats: int, say) -> dict[str, Any]:
    res: dict[str, Any] = {"engine": "vllm", "hidden": hidden, "layers": layers,
                           "size_bytes": r.nbytes, "tensors": len(r.sd), "repeats": repeats,
                           "http_path": "the trainer serves the bytes (HTTP GET over loopback)"}
    say(f"starting a vLLM engine on a {r.nbytes / 2**20:.0f} MiB model")
    first = r.engine()
    out: dict[str, list[float]] = {k: [] for k in ("storage_resident", "storage_s", "http_s",
                                                   "http_worker_s", "floor_call_s", "floor_s",
                                                   "tce_s", "tce_update_s")}
    for n in range(1, repeats + 2):
        r.repeat(first, n, out)
    for k in ("storage_s", "http_s", "http_worker_s", "floor_call_s", "floor_s", "tce_s",
              "tce_update_s"):
        res[k] = _median_s(out[k])
    res["storage_resident_max"] = max(out["storage_resident"])
    res["tce_vs_floor"] = res["tce_s"] / res["floor_s"]
    res["storage_vs_tce"] = res["storage_s"] / res["tce_s"]
    res["http_vs_tce"] = res["http_s"] / res["tce_s"]
    res["last_version"] = r.version
    say("starting a second vLLM engine")
    second = r.engine()
    before = _status()
    t0 = time.monotonic()
    got = second.call("update", version=r.version)
    res["second_engine_update_s"] = got["done"] - t0
    after = _status()
    r.check(second, "second engine's TCE")
    res["second_engine_new_buffers"] = after["buffers"] - before["buffers"]
    res["second_engine_new_bytes"] = after["used_bytes"] - before["used_bytes"]
    res["served_versions"] = [e.call("probe")["version"] for e in r.engines]
    status = api.status()
    res["memory_backing"] = status["memory_backing"]
    res["hugetlb_fallbacks"] = int(status["hugetlb_fallbacks"])
    return res


def render(res: dict[str, Any]) -> str:
    mib = res["size_bytes"] / 2**20
    gbps = lambda s: f"{res['size_bytes'] / s / 1e9:.2f} GB/s"  # noqa: E731
    rows = [
        ("model (Qwen2, float32)", f"hidden {res['hidden']}, {res['layers']} layers: "
                                   f"{mib:.0f} MiB, {res['tensors']} tensors"),
        ("the server's memory backing", res["memory_backing"] + (
            f" ({res['hugetlb_fallbacks']} buffers fell back to 4 KiB pages: no huge page left)"
            if res["hugetlb_fallbacks"] else "")),
        ("floor: load_weights from the worker's memory (layerwise reload)",
         f"{res['floor_s']:.3f} s ({gbps(res['floor_s'])}; the call: {res['floor_call_s']:.3f} s)"),
        ("TCE: publish -> engine serves it (Engine.update)",
         f"{res['tce_s']:.3f} s ({gbps(res['tce_s'])}; Engine.update: {res['tce_update_s']:.3f} s)"),
        ("TCE / floor", f"{res['tce_vs_floor']:.2f}x"),
        ("storage: vLLM reload_weights, page cache dropped",
         f"{res['storage_s']:.3f} s (pages resident before: {res['storage_resident_max']:.0%})"),
        ("storage / TCE", f"{res['storage_vs_tce']:.1f}x"),
        ("HTTP: the trainer serves the bytes, the worker GETs and loads",
         f"{res['http_s']:.3f} s (in the worker: {res['http_worker_s']:.3f} s)"),
        ("HTTP / TCE", f"{res['http_vs_tce']:.1f}x"),
        ("a second engine's update (its first: vLLM's first reload included)",
         f"{res['second_engine_update_s']:.3f} s"),
        ("a second engine: new server buffers, bytes",
         f"{res['second_engine_new_buffers']}, {res['second_engine_new_bytes']}"),
        ("versions the engines serve (the last published)",
         f"{', '.join(map(str, res['served_versions']))} ({res['last_version']})"),
    ]
    width = max(len(r[0]) for r in rows)
    head = f"{res['repeats']} versions timed (medians), one more first, not counted"
    return head + "\n" + "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def main(hidden: int, layers: int, repeats: int, as_json: bool, directory: str | None = None,
         memory_backing: str = "auto") -> int:
    import sys

    # What the libraries print meanwhile (DeepSpeed's notice, the tokenizer
    # trainer's progress, from Python or not) goes to stderr: stdout is the result.
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        res = run(hidden, layers, repeats, directory=directory, memory_backing=memory_backing,
                  say=lambda s: print(s, file=sys.stderr))
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    print(json.dumps(res, indent=2) if as_json else render(res))
    return 0
