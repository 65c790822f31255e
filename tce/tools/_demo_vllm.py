"""``tce demo --weights --engine vllm``: a trainer fine-tunes a small model
and a vLLM server on another node serves each version it publishes.

Two "nodes" (network namespaces on a bridge; needs root), a ``tce-server``
on each. On node 0 a trainer fine-tunes a small Qwen2 model (built here,
float32, with its own tokenizer) on one fixed sentence, a few AdamW steps
per version; it saves each version with ``save_pretrained`` under
``tce.patch_torch`` (a memory copy into node 0's cache, persisted behind)
and publishes it. Node 1 follows the job over the ring's peer port, and a
vLLM server there (the CPU build, in the vLLM environment this demo makes
on first use) is kept on the newest version by ``tce vllm follow``, which
drives vLLM's weight update with TCE's backend: its workers read the
version from node 1's cache, which brings the bytes from node 0.

For each version the demo prints a timeline from the start of the save
(saved, published, known on node 1, served by the engine) and the engine's
greedy continuation of a fixed prompt, which drifts toward the sentence as
training goes on. Last, the newest version's answer (tokens and
logprobs) is compared, bit for bit, with a fresh vLLM engine's started on
its files (tests/test_vllm.py compares every version).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

from tce.tools import _vllm_env
from tce.tools._netns import Nodes
from tce.tools._server import LocalServer

JOB = "rl-vllm-demo"
_TOKEN = "tce-demo-vllm"
_PORT = 8000
TEXT = "Rollouts read each version from the cache of their node."
PROMPT = "Rollouts read"
MAX_TOKENS = 12
LR = 3e-3
# The engine's settings, the same for the served engine and the fresh ones
# (float32 throughout; one seed).
SERVER_ARGS = ("--dtype", "float32", "--max-model-len", "512", "--block-size", "32", "--seed", "0",
               "--enforce-eager")
ENGINE_ARGS = {"dtype": "float32", "max_model_len": 512, "block_size": 32, "seed": 0, "enforce_eager": True}

# Node 1: says when the node learns each version of the job (it follows it).
_WATCHER = r"""
import json, sys, time
from tce import weights
job, sources, last = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
weights.follow(job, sources=sources)
print(json.dumps({"ready": True}), flush=True)
version = 0
while version < last:
    info = weights.wait_newer(job, after=version, timeout=600)
    print(json.dumps({"version": info.version, "t": time.monotonic()}), flush=True)
    version = info.version
"""

# In the vLLM environment: a fresh engine on each directory's files, its
# greedy answer to the prompt (one JSON line each, after the marker).
_FRESH = r"""
import json, sys
from vllm import LLM, SamplingParams
a = json.loads(sys.argv[1])
params = SamplingParams(temperature=0.0, max_tokens=a["max_tokens"], logprobs=0)
for d in a["dirs"]:
    llm = LLM(model=d, **a["engine"])
    o = llm.generate([a["prompt"]], params, use_tqdm=False)[0].outputs[0]
    answer = {"dir": d, "tokens": list(o.token_ids),
              "logprobs": [lp[t].logprob for t, lp in zip(o.token_ids, o.logprobs)]}
    print("FRESH " + json.dumps(answer), flush=True)
    del llm
"""


def _ask(url: str, model: str) -> dict[str, Any]:
    """The engine's greedy continuation of PROMPT: its text, tokens and logprobs."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "logprobs": 0, "return_tokens_as_token_ids": True}
    req = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        choice = json.loads(r.read())["choices"][0]
    lp = choice["logprobs"]
    return {"text": choice["text"], "tokens": [int(t.split(":", 1)[1]) for t in lp["tokens"]],
            "logprobs": lp["token_logprobs"]}


class _Lines:
    """A child's stdout, read by a thread: each line with the moment it came."""

    def __init__(self, stream: IO[str], keep: list[str] | None = None) -> None:
        self._cond = threading.Condition()
        self._lines: list[tuple[float, str]] = []
        self._done = False
        self._keep = keep
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with self._cond:
                self._lines.append((time.monotonic(), line.rstrip("\n")))
                self._cond.notify_all()
        with self._cond:
            self._done = True
            self._cond.notify_all()

    def next(self, what: str, timeout: float = 600.0) -> tuple[float, str]:
        """The next line (raises if the child ends or stays silent first)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._lines or self._done, timeout):
                raise TimeoutError(f"no word from {what} in {timeout:.0f} s")
            if not self._lines:
                raise RuntimeError(f"{what} ended")
            t, line = self._lines.pop(0)
        if self._keep is not None:
            self._keep.append(line)
        return t, line

    def rest(self, timeout: float = 120.0) -> list[str]:
        """The lines left once the child closed its output."""
        with self._cond:
            self._cond.wait_for(lambda: self._done, timeout)
            out = [line for _, line in self._lines]
            self._lines.clear()
        return out


def _server(work: Path, nodes: Nodes, i: int, storage: Path | None) -> LocalServer:
    d = work / f"node{i}"
    d.mkdir()
    return LocalServer(memory_budget="1GiB", socket_path=str(d / "tce.sock"), netns=nodes.names[i],
                       storage_roots=[str(storage)] if storage else [],
                       extra_args=["--peer-listen", f"{nodes.addresses[i]}:7070", "--peer-token", _TOKEN,
                                   "--metadata-url", "none", "--log-level", "warning"]).start()


class _Trainer:
    """Node 0's trainer: AdamW on TEXT; saves each version through the cache
    into a directory of its own and publishes it."""

    def __init__(self, base: Path, ckpt: Path) -> None:
        import torch
        from transformers import AutoTokenizer, Qwen2ForCausalLM

        self.base, self.ckpt = base, ckpt
        self.model = Qwen2ForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR)
        self.ids = torch.tensor([AutoTokenizer.from_pretrained(base)(TEXT)["input_ids"]])
        self.step = 0
        self.loss = float("nan")
        self.dirs: dict[int, Path] = {}

    def train(self, steps: int) -> None:
        self.model.train()
        for _ in range(steps):
            loss = self.model(input_ids=self.ids, labels=self.ids).loss
            loss.backward()
            self.opt.step()
            self.opt.zero_grad()
            self.step += 1
            self.loss = loss.item()

    def save_and_publish(self) -> tuple[Any, float, float, float]:
        """(version, save start, saved, published): monotonic seconds."""
        import tce
        from tce import weights

        d = self.ckpt / f"step{self.step}"
        t0 = time.monotonic()
        tce.patch_torch([self.ckpt])
        try:
            self.model.save_pretrained(d)
        finally:
            tce.unpatch_torch()
        saved = time.monotonic()
        info = weights.publish(f"step{self.step}", [d])
        self.dirs[info.version] = d
        return info, t0, saved, time.monotonic()


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(f"  | {ln}" for ln in path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def _fresh(python: Path, work: Path, dirs: list[Path]) -> dict[str, dict]:
    """A fresh engine's answer on each directory's files (in the vLLM environment)."""
    log = work / "fresh.log"
    arg = json.dumps({"dirs": [str(d) for d in dirs], "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                      "engine": ENGINE_ARGS})
    with open(log, "w") as err:
        r = subprocess.run([str(python), "-c", _FRESH, arg], stdout=subprocess.PIPE, stderr=err, text=True,
                           # as the served engine runs (its own engine process: the
                           # in-process one's float sums can differ in the last bit)
                           env=_vllm_env.engine_env("/nonexistent", OMP_NUM_THREADS="1"),
                           cwd=work,
                           timeout=1800)
    out = {}
    for line in r.stdout.splitlines():
        if line.startswith("FRESH "):
            a = json.loads(line[len("FRESH "):])
            out[a.pop("dir")] = a
    if r.returncode != 0 or len(out) != len(dirs):
        raise RuntimeError(f"the fresh engines failed (exit {r.returncode}):\n{_tail(log)}")
    return out


def _ms(t: float | None, t0: float) -> str:
    return f"{(t - t0) * 1e3:9.1f}" if t is not None else f"{'-':>9}"


def main(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        raise SystemExit("tce demo --weights needs root (network namespaces)")
    if args.versions < 1 or args.every < 1:
        raise SystemExit("tce demo --weights --engine vllm: --versions and --every must be at least 1")
    python = _vllm_env.ensure(say=lambda s: print(s, flush=True))  # on first use: says it is making it

    import transformers

    import tce
    from tce import client, weights
    from tce.tools._vllm_model import build

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    work = Path(tempfile.mkdtemp(prefix="tce-demo-vllm-"))
    storage = work / "storage"
    storage.mkdir()
    nodes = Nodes(2)
    servers: list[LocalServer] = []
    procs: list[subprocess.Popen] = []
    vllm_log = work / "vllm.log"
    try:
        servers = [_server(work, nodes, 0, storage), _server(work, nodes, 1, None)]
        endpoints = [f"{a}:7070" for a in nodes.addresses]
        base = work / "base"  # the model both sides start from (the engine: its files)
        build(base, hidden=args.dim, layers=args.layers)
        nodes.host_address()  # this namespace reaches the engine's port on node 1
        url = f"http://{nodes.addresses[1]}:{_PORT}"
        started = time.monotonic()
        with open(vllm_log, "w") as f:
            procs.append(subprocess.Popen(
                nodes.exec_prefix(1) + _vllm_env.server_command(python, base, _PORT, host=nodes.addresses[1],
                                                                args=SERVER_ARGS),
                env=_vllm_env.engine_env(servers[1].socket, OMP_NUM_THREADS="1"), stdout=f,
                stderr=subprocess.STDOUT, cwd=work))  # not a checkout: its tce/ would shadow the installed one
        engine = procs[-1]
        trainer = _Trainer(base, storage / "ckpt")
        mib = sum(p.numel() * p.element_size() for p in trainer.model.parameters()) / (1 << 20)
        print(f"tce demo --weights --engine vllm: a {mib:.0f} MiB Qwen2 (float32) fine-tuned on node 0 "
              f"toward {TEXT!r},\nserved by a vLLM server on node 1 that follows the job through TCE\n",
              flush=True)
        with client.override(socket=servers[0].socket, job=JOB, on_unavailable="raise"):
            weights.grant(nodes=[endpoints[1]])  # node 1 may follow the job
        try:
            _vllm_env.wait_ready(url, engine, timeout=900)
        except Exception as e:
            print(f"the vLLM server on node 1 did not start: {e}\n{_tail(vllm_log)}")
            return 1
        print(f"vLLM server ready on node 1 ({url}) in {time.monotonic() - started:.0f} s", flush=True)

        last = args.versions  # version 1 is the base model, before any step
        with client.override(socket=servers[0].socket, job=JOB, on_unavailable="raise"):
            first = trainer.save_and_publish()  # node 1 follows a job that has a version
            tce.api.close()
        watcher = subprocess.Popen(
            nodes.exec_prefix(1) + [sys.executable, "-c", _WATCHER, JOB, endpoints[0], str(last)],
            stdout=subprocess.PIPE, text=True, cwd=work, env=dict(os.environ, TCE_SOCKET=servers[1].socket))
        procs.append(watcher)
        known = _Lines(watcher.stdout)
        known.next("node 1's watcher")
        controller_out: list[str] = []
        follower = subprocess.Popen(
            nodes.exec_prefix(1) + [sys.executable, "-m", "tce.tools.cli", "--socket", servers[1].socket,
                                    "vllm", "follow", "--job", JOB, "--server", url, "--sources", endpoints[0],
                                    "--until-version", str(last)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=work)
        procs.append(follower)
        served = _Lines(follower.stdout, keep=controller_out)
        served.next("tce vllm follow")  # following job ...

        print(f"\nper version, ms from the start of its save: saved (save_pretrained into node 0's cache), "
              f"published,\non node 1 (its server learned of it from node 0), served (the engine updated by "
              f"tce vllm follow,\nits workers reading the bytes through node 1's cache); then the engine's greedy\ncontinuation of {PROMPT!r} (version 1: the model before training, "
              f"published before node 1 followed)\n")
        print(f"{'version':>7} {'step':>4} {'loss':>6} {'saved':>9} {'published':>9} {'on node 1':>9} "
              f"{'served':>9}  generation")
        answers: dict[int, dict] = {}
        ok = True
        with client.override(socket=servers[0].socket, job=JOB, on_unavailable="raise"):
            for v in range(1, last + 1):
                if v > 1:
                    trainer.train(args.every)
                    info, t0, saved, published = trainer.save_and_publish()
                else:
                    info, t0, saved, published = first
                t_known, line = known.next("node 1's watcher")
                seen = json.loads(line)
                t_served, line = served.next("tce vllm follow")
                if not line.startswith(f"version {info.version} ") or f"serves {info.version}" not in line:
                    print(f"the engine did not take version {info.version}: {line}")
                    ok = False
                    t_served = None
                if seen["version"] != info.version or v == 1:
                    t_known = None
                if v == 1:
                    t_served = None
                answers[info.version] = a = _ask(url, str(base))
                loss = f"{trainer.loss:6.3f}" if trainer.step else f"{'-':>6}"
                print(f"{info.version:>7} {trainer.step:>4} {loss} {_ms(saved, t0)} {_ms(published, t0)} "
                      f"{_ms(t_known, t0)} {_ms(t_served, t0)}  {a['text']!r}", flush=True)
            tce.api.close()
        if ok and follower.wait(120) != 0:  # it exits once the engine serves the last version
            print(f"tce vllm follow exited with {follower.returncode}")
            ok = False
        if not ok:
            _vllm_env.stop(follower)
            for ln in controller_out + served.rest():
                print(f"  tce vllm follow | {ln}")
        _vllm_env.stop(engine)  # its answers are in; the fresh engines get the machine

        # A fresh engine on the newest version's files (node 0's storage
        # root, where the server persisted them) answers the same, bit for
        # bit (tests/test_vllm.py checks every version).
        newest = trainer.dirs[last]
        with client.override(socket=servers[0].socket, job=JOB, on_unavailable="raise"):
            tce.wait([newest / "model.safetensors"], timeout=300)
            tce.api.close()
        for f in base.iterdir():
            if f.name.startswith(("tokenizer", "special_tokens")):
                shutil.copy(f, newest)
        t0 = time.monotonic()
        fresh = _fresh(python, work, [newest])
        same = ok and len(answers) == last and \
            {k: answers[last][k] for k in ("tokens", "logprobs")} == fresh[str(newest)]
        print(f"\na fresh vLLM engine started on version {last}'s files in {time.monotonic() - t0:.0f} s")
        print(f"the engine's answer on version {last} equals the fresh engine's, bit for bit "
              f"(tokens and logprobs): {'yes' if same else 'no'}")
        return 0 if same else 1
    except BaseException:
        print(f"the vLLM server's log ends:\n{_tail(vllm_log)}")
        raise
    finally:
        for p in reversed(procs):
            _vllm_env.stop(p)
        for s in servers:
            s.stop()
            s.cleanup()
        nodes.close()
        shutil.rmtree(work, ignore_errors=True)
