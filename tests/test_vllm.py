"""vLLM takes its weights from TCE: the ``tce`` weight-transfer backend with
a real vLLM engine (the CPU build, in its own environment: build/vllm-venv,
made by ``make test`` or tce.tools._vllm_env), a real server and a trainer
that fine-tunes a small Qwen2 model and publishes each version.

What an engine serves after each update is compared, bit for bit (greedy
tokens and their float32 logprobs), with a fresh engine started on that
version's files; the long prompt, run before each update, proves the prefix
cache was reset (its blocks would otherwise be reused with the old weights).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tce
from tce import weights
from tce.core import _knobs
from tce.vllm import Engine
from tce.tools import _vllm_env
from tce.tools._server import LocalServer
from tce.tools._vllm_model import build, train_step
from test_security_local import users  # noqa: F401  (the fixture)
from helpers import until

HERE = Path(__file__).parent
pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The vLLM environment's python, with this checkout's TCE in it."""
    return _vllm_env.ensure(say=lambda s: print(s))


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A server that persists under its storage root (the fresh engines read
    each version's files from there)."""
    root = tmp_path_factory.mktemp("storage")
    server = LocalServer(memory_budget="1GiB", storage_roots=[str(root)],
                         extra_args=["--memory-backing", "4k"]).start()
    server.root = root
    yield server
    code = server.stop()
    server.cleanup()
    assert code == 0, f"tce-server exited with {code}:\n{server.log()}"


@pytest.fixture
def server(stored, request):
    """``stored``, with this process's client pointed at it and a job of the test's own."""
    job = re.sub(r"[^\w.-]", "-", f"vllm-{os.getpid()}-{request.node.name}")[:200]  # no glob characters:
    # vLLM globs its model directory's files, which are under the job's name here
    with _knobs.override(socket=stored.socket, job=job, on_unavailable="raise"):
        yield stored
        tce.api.close()


def test_the_backend_is_registered_by_the_entry_point_tce_installs(vllm_python, tmp_path):
    """In a fresh vLLM interpreter: loading vLLM's plugins (what each of its
    processes does) registers "tce", and the engine's module imports first."""
    code = ("from vllm.plugins import load_general_plugins\n"
            "from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory as F\n"
            "assert 'tce' not in F._registry\n"
            "load_general_plugins(); load_general_plugins()\n"
            "import tce._vllm_engine as m\n"
            "assert F._registry['tce']() is m.TCEWeightTransferEngine\n"
            "print('registered')\n")
    r = subprocess.run([str(vllm_python), "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path, env=_vllm_env.engine_env("/nonexistent"))
    assert r.returncode == 0 and r.stdout.strip().endswith("registered"), r.stderr[-4000:]


def _env(socket: str, job: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TCE_JOB")}
    return dict(env, TCE_SOCKET=socket, TCE_JOB=job, VLLM_CPU_KVCACHE_SPACE="1",
                VLLM_SERVER_DEV_MODE="1", OMP_NUM_THREADS="2", TOKENIZERS_PARALLELISM="false",
                HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")


class Trainer:
    """This process: trains the base model a step at a time, saves each
    step with save_pretrained through the cache (tce.patch_torch) into a
    directory of its own, and publishes it."""

    def __init__(self, base: Path, ckpt: Path) -> None:
        from transformers import Qwen2ForCausalLM

        self.base, self.ckpt = base, ckpt
        self.model = Qwen2ForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.dirs: dict[int, Path] = {}

    def step(self, n: int) -> weights.VersionInfo:
        train_step(self.model, self.opt, n)
        d = self.ckpt / f"step{n}"
        tce.patch_torch([self.ckpt])
        try:
            self.model.save_pretrained(d)
        finally:
            tce.unpatch_torch()
        for f in self.base.glob("tokenizer*"):  # a fresh engine on d needs them too
            shutil.copy(f, d)
        info = weights.publish(f"step{n}", [d])
        self.dirs[info.version] = d
        return info

    def persisted(self) -> None:
        """Every version on storage (the fresh engines read the files)."""
        tce.wait([d / "model.safetensors" for d in self.dirs.values()], timeout=120)


def _reference(python: Path, env: dict, out: Path, dirs: list[Path]) -> dict[str, dict]:
    out.mkdir(exist_ok=True)
    r = subprocess.run([str(python), str(HERE / "vllm_driver.py"), "reference", str(out)]
                       + [str(d) for d in dirs], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    return {d.name: json.loads((out / f"{d.name}.json").read_text()) for d in dirs}


@pytest.mark.parametrize("tp, last", [(1, 3), (2, 2)], ids=["tp1", "tp2"])
def test_an_offline_llm_serves_each_version_as_a_fresh_engine_would(server, tmp_path, vllm_python, tp, last):
    """An offline engine follows the trainer; with tensor parallelism (2
    workers), each worker maps the version and its loaders take its shard."""
    job = _knobs.get("job")
    base = server.root / job / "base"
    build(base)
    env = _env(server.socket, job)
    if tp > 1:
        cores = "|".join(str(i % os.cpu_count()) for i in range(tp))  # a core per worker
        env.update(TEST_TP=str(tp), VLLM_CPU_OMP_THREADS_BIND=cores)
    out = tmp_path / "served"
    out.mkdir()
    log = open(tmp_path / "engine.log", "w")
    engine = subprocess.Popen([str(vllm_python), str(HERE / "vllm_driver.py"), "follow", str(base),
                               str(out), str(last)], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        def alive_or(path: Path):
            return lambda: path.exists() or engine.poll() is not None

        def text() -> str:
            return (tmp_path / "engine.log").read_text()[-6000:]

        until(alive_or(out / "ready"), timeout=600, what="the engine to start")
        assert (out / "ready").exists(), text()
        trainer = Trainer(base, server.root / job / "ckpt")
        for n in range(1, last + 1):
            info = trainer.step(n)
            assert info.version == n
            until(alive_or(out / f"v{n}.json"), timeout=300, what=f"the engine to serve version {n}")
            assert (out / f"v{n}.json").exists(), text()
        assert engine.wait(120) == 0, text()
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait()
        log.close()
    trainer.persisted()
    versions = range(1, last + 1)
    fresh = _reference(vllm_python, env, tmp_path / "fresh", [base] + [trainer.dirs[v] for v in versions])
    served = {v: json.loads((out / f"v{v}.json").read_text()) for v in versions}
    assert json.loads((out / "ready").read_text()) == fresh["base"]
    for v in versions:
        assert served[v] == fresh[f"step{v}"], f"version {v} differs from a fresh engine on its files"
    answers = [fresh["base"]] + [served[v] for v in versions]
    assert all(a["long"]["logprobs"] != b["long"]["logprobs"] for a, b in zip(answers, answers[1:]))


class Servers:
    """vLLM OpenAI servers on the base model, each on TCE's backend."""

    def __init__(self, python: Path, env: dict, tmp: Path) -> None:
        self.python, self.env, self.tmp = python, env, tmp
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    def start(self, model: Path, n: int) -> list[str]:
        from tce.tools._ports import free_port
        from vllm_driver import SERVER_ARGS

        urls = []
        for _ in range(n):
            port = free_port()
            log = self.tmp / f"vllm-{port}.log"
            with open(log, "w") as f:  # cwd: not the checkout, whose tce/ would shadow the installed one
                self.procs.append(subprocess.Popen(
                    _vllm_env.server_command(self.python, model, port, args=SERVER_ARGS),
                    env=self.env, stdout=f, stderr=subprocess.STDOUT, cwd=self.tmp))
            self.logs.append(log)
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc, log in zip(urls, self.procs[-n:], self.logs[-n:]):
            try:
                _vllm_env.wait_ready(url, proc, timeout=600)
            except Exception as e:
                raise AssertionError(f"{e}:\n{log.read_text()[-6000:]}") from None
        return urls

    def stop(self) -> None:
        _vllm_env.stop(*self.procs)


def _cache_use() -> tuple[int, int, int]:
    s = tce.status()
    return int(s["buffers"]), int(s["used_bytes"]), int(s["buffers_created"])


def test_servers_update_from_the_trainer_and_a_refused_update_leaves_them_serving(
        server, tmp_path, vllm_python):
    """Two vLLM servers on one node follow the trainer's versions through
    tce.vllm.publish: each serves what a fresh engine on the
    version's files serves, and the second adds no copy of the weights to
    the node's memory. A version that is gone, or is another model, is
    refused before the model is touched: both keep serving the version
    they served."""
    from tce import vllm as tce_vllm
    from vllm_driver import ask_http

    job = _knobs.get("job")
    base = server.root / job / "base"
    build(base)
    env = _vllm_env.engine_env(server.socket, OMP_NUM_THREADS="1")
    servers = Servers(vllm_python, env, tmp_path)
    try:
        urls = servers.start(base, 2)
        engines = tce_vllm.connect(urls, job)
        assert [e.version() for e in engines] == [None, None]  # the weights they started with
        trainer = Trainer(base, server.root / job / "ckpt")
        answers = {}
        for n in (1, 2, 3):
            trainer.step(n)  # saved and published
            before = _cache_use()
            info = weights.latest()
            done = tce_vllm.update(engines, info.version)
            assert [d.version for d in done] == [n, n]
            assert _cache_use() == before  # the engines read the cached bytes: no buffer, no byte more
            assert [e.version() for e in engines] == [n, n]  # /weight_info
            answers[n] = [ask_http(u, str(base)) for u in urls]
            assert answers[n][0] == answers[n][1]

        # Gone: version 3's file saved over (never published again).
        tce.patch_torch([trainer.ckpt])
        try:
            trainer.model.save_pretrained(trainer.dirs[3])
        finally:
            tce.unpatch_torch()
        with pytest.raises(tce_vllm.UpdateFailedError, match="version 3 of job .* is gone"):
            tce_vllm.update(engines, 3)
        # Another model: a wider Qwen2 published into the same job.
        other = server.root / job / "other"
        wide = build(other, hidden=96)
        tce.patch_torch([other])
        try:
            wide.save_pretrained(other / "step4")
        finally:
            tce.unpatch_torch()
        info = weights.publish("step4", [other / "step4"])
        with pytest.raises(tce_vllm.UpdateFailedError, match=f"version {info.version} .* is not this "
                           r"engine's model: .*weight has shape \[\d+, 96\], the model's is \[\d+, 64\]"):
            tce_vllm.update(engines, info.version)
        # Both serve version 3 as they did, and say so.
        assert [e.version() for e in engines] == [3, 3]
        assert [ask_http(u, str(base)) for u in urls] == answers[3]
    finally:
        servers.stop()
        for log in servers.logs:
            print(log.read_text()[-3000:])

    trainer.persisted()
    fresh = _reference(vllm_python, env, tmp_path / "fresh", [trainer.dirs[v] for v in (1, 2, 3)])
    for v in (1, 2, 3):
        assert answers[v][0] == fresh[f"step{v}"], f"version {v} differs from a fresh engine on its files"


KILLED_TRAINER = '''
import os, sys
from tce.integrations import safetensors as st
os.makedirs(os.path.dirname(sys.argv[2]), exist_ok=True)
sd = {n: t for n, t in st.load_file(sys.argv[1]).items()}
st.save_file({n: t + 1 for n, t in sd.items()}, sys.argv[2], tag="killed")  # saved, never published
print("saved", flush=True)
sys.stdin.read()
'''


@pytest.mark.multinode
def test_an_engine_on_another_node_follows_through_the_chain_driven_by_tce_vllm_follow(
        tmp_path, nodes2, vllm_python):
    """The trainer's node (namespace 0) publishes; a vLLM server on an
    inference node (namespace 1, its own tce-server following the job) is
    kept on the newest version by ``tce vllm follow``, started before the
    first version, its bytes coming over the ring's link from the trainer's
    node. A trainer killed after
    its save, before the version was published, moves nothing: the engine
    serves the version it served until the next one is published."""
    from test_ring import _node_server, _status, _stop
    from vllm_driver import SERVER_ARGS, ask_http

    job = "rl-vllm"
    root = tmp_path / "storage"
    root.mkdir()
    trainer_node = _node_server(tmp_path, "tcp", nodes2, 0, "trainer", storage=root)
    infer_node = _node_server(tmp_path, "tcp", nodes2, 1, "infer")
    procs: list[subprocess.Popen] = []
    try:
        src = _status(trainer_node)["peer_endpoint"]
        infer_endpoint = _status(infer_node)["peer_endpoint"]
        base = root / "base"
        build(base)
        with _knobs.override(socket=trainer_node.socket, job=job, on_unavailable="raise"):
            weights.grant(nodes=[infer_endpoint])
            trainer = Trainer(base, root / "ckpt")
        nodes2.host_address()  # this namespace reaches the nodes' addresses
        url = f"http://{nodes2.addresses[1]}:8000"
        log = open(tmp_path / "vllm.log", "w")
        procs.append(subprocess.Popen(
            nodes2.exec_prefix(1) + _vllm_env.server_command(vllm_python, base, 8000,
                                                             host=nodes2.addresses[1], args=SERVER_ARGS),
            env=_vllm_env.engine_env(infer_node.socket, OMP_NUM_THREADS="1"), stdout=log,
            stderr=subprocess.STDOUT, cwd=tmp_path))
        _vllm_env.wait_ready(url, procs[-1], timeout=600)
        follower = subprocess.Popen(
            nodes2.exec_prefix(1) + [sys.executable, "-m", "tce.tools.cli", "--socket", infer_node.socket,
                                     "vllm", "follow", "--job", job, "--server", url, "--sources", src,
                                     "--until-version", "3"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
        procs.append(follower)
        # Started before the trainer published anything: it follows all the same.
        assert follower.stdout.readline().startswith(f"following job '{job}'")
        with _knobs.override(socket=trainer_node.socket, job=job, on_unavailable="raise"):
            trainer.step(1)
        line = follower.stdout.readline()
        assert line.startswith(f"version 1 (step1): {url} serves 1 ("), line
        answers = {1: ask_http(url, str(base))}

        with _knobs.override(socket=trainer_node.socket, job=job, on_unavailable="raise"):
            trainer.step(2)
        line = follower.stdout.readline()
        assert line.startswith(f"version 2 (step2): {url} serves 2 ("), line
        answers[2] = ask_http(url, str(base))
        # A trainer process killed between its save and the publication.
        killed = subprocess.Popen(
            [sys.executable, "-c", KILLED_TRAINER, str(trainer.dirs[2] / "model.safetensors"),
             str(root / "ckpt" / "killed" / "model.safetensors")], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True,
            env=dict(os.environ, TCE_SOCKET=trainer_node.socket, TCE_JOB=job, TCE_ON_UNAVAILABLE="raise"))
        assert killed.stdout.readline().strip() == "saved"
        killed.kill()
        killed.wait()
        with _knobs.override(socket=trainer_node.socket, job=job, on_unavailable="raise"):
            assert weights.latest().version == 2  # nothing published
        assert Engine(url).version() == 2 and ask_http(url, str(base)) == answers[2]
        with _knobs.override(socket=trainer_node.socket, job=job, on_unavailable="raise"):
            trainer.step(3)
            trainer.persisted()
            tce.api.close()
        line = follower.stdout.readline()
        assert line.startswith(f"version 3 (step3): {url} serves 3 ("), line
        answers[3] = ask_http(url, str(base))
        assert follower.wait(60) == 0
        # The inference node's bytes came from the trainer's node over the ring.
        assert int(_status(trainer_node)["version_ranges_served"]) >= 3
        assert int(_status(infer_node)["replica_files"]) >= 1
    finally:
        _vllm_env.stop(*procs)
        print((tmp_path / "vllm.log").read_text()[-4000:])
        _stop(infer_node, trainer_node)
    fresh = _reference(vllm_python, _vllm_env.engine_env("/nonexistent"), tmp_path / "fresh",
                       [trainer.dirs[v] for v in (1, 2, 3)])
    for v in (1, 2, 3):
        assert answers[v] == fresh[f"step{v}"], f"version {v} differs from a fresh engine on its files"


class Driven:
    """An offline LLM on TCE's backend (tests/vllm_driver.py serve), driven a command at a time."""

    def __init__(self, python: Path, model: Path, job: str, env: dict, cwd: Path) -> None:
        self.proc = subprocess.Popen([str(python), str(HERE / "vllm_driver.py"), "serve", str(model), job],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
        self.lines: list[str] = []
        assert self._reply() == {"ready": True}, "".join(self.lines[-60:])

    def _reply(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith("@@ "):
                return json.loads(line[3:])
            self.lines.append(line)
        raise AssertionError("the engine exited:\n" + "".join(self.lines[-80:]))

    def __call__(self, command: str) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.mark.security
def test_a_revoked_grant_is_refused_and_the_engine_keeps_serving(tmp_path, vllm_python, users):
    """The trainer is another local user; the engine (root, which the server
    treats as any user: root_is_admin false) reads the job's versions by its
    grant. Once the owner revokes it, the update is refused, saying so, and
    the engine serves the version it had; granted again, it moves on."""
    from test_security_local import Node

    node = Node(users, budget="512MiB", extra_args=["--root-is-admin", "false", "--memory-backing", "4k"])
    engine = None
    try:
        base = Path(node.base) / "base"
        build(base)
        job = "rl-other-user"

        def owner(*args: str) -> dict:
            r = subprocess.run([sys.executable, str(HERE / "vllm_owner.py"), "tce-test-a", node.socket, job,
                                *args], capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stdout + r.stderr
            return json.loads(r.stdout.strip().splitlines()[-1])

        assert owner("publish", str(base), node.path("a", "step1"), "step1", "1") == {"version": 1}
        assert owner("grant", "0")["uids"] == [0]
        engine = Driven(vllm_python, base, job, _vllm_env.engine_env(node.socket), tmp_path)
        assert engine("update 1") == {"ok": True}
        served = engine("ask")
        assert owner("publish", str(base), node.path("a", "step2"), "step2", "2") == {"version": 2}
        assert owner("revoke", "0")["uids"] == []
        refused = engine("update 2")
        assert "the owner revoked the read grant of uid 0" in refused["error"], refused
        assert engine("version") == {"version": 1}
        assert engine("ask") == served
        assert owner("grant", "0")["uids"] == [0]
        assert engine("update 2") == {"ok": True}
        assert engine("version") == {"version": 2}
        assert engine("ask") != served
    finally:
        if engine is not None:
            engine.close()
        node.close()


def test_a_load_that_fails_half_way_is_rolled_back_to_the_version_served(server, tmp_path, vllm_python):
    """A load that dies after part of the new version went into the model
    (a fault injected at the model's load_weights, after every check passed):
    the worker loads the version it served again, from its lease, and the
    engine serves it exactly as before."""
    job = _knobs.get("job")
    base = server.root / job / "base"
    build(base)
    trainer = Trainer(base, server.root / job / "ckpt")
    trainer.step(1)
    trainer.step(2)
    engine = Driven(vllm_python, base, job, _vllm_env.engine_env(server.socket), tmp_path)
    try:
        assert engine("update 1") == {"ok": True}
        served = engine("ask")
        assert engine("fail-next-load") == {"ok": True}
        failed = engine("update 2")
        assert "injected: the load died half-way" in failed["error"], failed
        assert engine("version") == {"version": 1}
        assert engine("ask") == served
        assert engine("update 2") == {"ok": True}  # the next try loads it
        assert engine("ask") != served
    finally:
        engine.close()
