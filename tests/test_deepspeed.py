"""Real DeepSpeed training on CPU (gloo) with "checkpoint_engine": "tce".

Every run is a set of real processes, one per rank (what torchrun starts),
killed with SIGKILL where the test says so.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tce.tools._server import LocalServer
from helpers import loop_mount, wait_metadata_written
from tce.tools._ports import free_port

pytestmark = [pytest.mark.deepspeed]

HERE = Path(__file__).parent
SCRIPT = HERE / "ds_train.py"


class Run:
    """One multi-process DeepSpeed run of tests/ds_train.py: one process per
    rank with the variables torchrun sets, or torchrun itself. With
    ``nodes`` (tce.tools._netns.Nodes), rank i runs alone on node i, in its
    namespace, with that node's server (``sockets[i]``) and the node rank
    torchrun gives it, and gloo talks over the namespace addresses."""

    def __init__(self, world: int, args: list[str], *, socket_path: str = "", out: Path,
                 job: str = "ds-test", ready: bool = False, torchrun: bool = False,
                 nodes=None, sockets: list[str] | None = None) -> None:
        port = free_port()
        self.world, self.out = world, out
        self.ready = str(out) + ".ready" if ready else ""
        self.procs, self.log_paths = [], []
        base = dict(os.environ, TCE_SOCKET=socket_path, TCE_JOB=job, TCE_ON_UNAVAILABLE="raise",
                    OMP_NUM_THREADS="1")
        script = [str(SCRIPT), *args, "--out", str(out)] + (["--ready", self.ready] if self.ready else [])
        if torchrun:
            launches = [([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world),
                          "--master_addr", "127.0.0.1", "--master_port", str(port), *script], base)]
        else:
            launches = [([sys.executable, *script],
                         dict(base, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                              LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                              MASTER_PORT=str(port)))
                        for rank in range(world)]
        if nodes is not None:  # one rank per node, as torchrun starts them with --nnodes
            launches = [([*nodes.exec_prefix(rank), *cmd],
                         dict(env, TCE_SOCKET=sockets[rank], LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                              NODE_RANK=str(rank), GROUP_RANK=str(rank), MASTER_ADDR=nodes.addresses[0],
                              GLOO_SOCKET_IFNAME="eth0"))
                        for rank, (cmd, env) in enumerate(launches)]
        for i, (cmd, env) in enumerate(launches):
            self.log_paths.append(Path(f"{out}-{i}.log"))
            log = open(self.log_paths[-1], "w")
            self.procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))

    def logs(self) -> str:
        return "\n".join(p.read_text()[-4000:] for p in self.log_paths)

    def wait(self, timeout: float = 240, fails: bool = False) -> list[dict]:
        """Until every rank exited 0 (or, with ready, is ready and SIGKILLed;
        with fails, exited non-zero: then returns nothing)."""
        deadline = time.monotonic() + timeout
        if self.ready:
            while not all(os.path.exists(f"{self.ready}-{r}") for r in range(self.world)):
                dead = [p.returncode for p in self.procs if p.poll() is not None]
                assert not dead and time.monotonic() < deadline, f"exit codes {dead}\n{self.logs()}"
                time.sleep(0.1)
            assert len(self.procs) == self.world, "SIGKILL runs start one process per rank"
            for p in self.procs:
                p.send_signal(signal.SIGKILL)
        for p in self.procs:
            try:
                p.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in self.procs:
                    q.kill()
                raise AssertionError(f"training timed out\n{self.logs()}")
        codes = [p.returncode for p in self.procs]
        if fails:
            assert all(c not in (0, None) for c in codes), f"exit codes {codes}\n{self.logs()}"
            return []
        expected = -signal.SIGKILL if self.ready else 0
        assert codes == [expected] * len(self.procs), f"exit codes {codes}\n{self.logs()}"
        return [torch.load(f"{self.out}-{r}.pt", weights_only=False) for r in range(self.world)]


def _same(a, b, what: str) -> None:
    assert a.keys() == b.keys(), f"{what}: keys differ"
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), f"{what}{k} differs"
        else:
            assert x == y, f"{what}{k}: {x!r} != {y!r}"


def _same_state(a: dict, b: dict, what: str) -> None:
    _same(a["params"], b["params"], f"{what} param ")
    _same(a["optim"], b["optim"], f"{what} optimizer state ")
    assert torch.equal(a["seen"], b["seen"]) and a["global_steps"] == b["global_steps"], what


def _server(tmp_path, persist: bool = True) -> LocalServer:
    storage = tmp_path / "storage"
    storage.mkdir(exist_ok=True)
    s = LocalServer(memory_budget="1GiB", storage_roots=[str(storage)] if persist else [],
                    state_dir=str(tmp_path / "state"))
    s.storage = storage
    return s


@pytest.fixture
def ds_server(tmp_path):
    storage = tmp_path / "storage"
    storage.mkdir()
    s = LocalServer(memory_budget="1GiB", storage_roots=[str(storage)],
                    state_dir=str(tmp_path / "state")).start()
    s.storage = storage
    yield s
    code = s.stop()
    s.cleanup()
    assert code == 0, s.log()


@pytest.fixture
def ds_disk_server(tmp_path):
    """A server persisting onto a real ext4 filesystem (a loop device) that
    the test can unmount: storage lost, as a failed disk or mount loses it."""
    with loop_mount(tmp_path / "disk", size_mb=256) as disk:
        s = LocalServer(memory_budget="1GiB", storage_roots=[str(disk.path)],
                        state_dir=str(tmp_path / "state")).start()
        s.storage, s.disk = disk.path, disk
        yield s
        code = s.stop()
        s.cleanup()
        assert code == 0, s.log()


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_sigkill_and_resume_from_cache_is_bitwise(ds_disk_server, tmp_path, stage, world):
    """The job is killed after a persisted checkpoint, then its storage is lost
    (the disk unmounted): the resumed run loads every file from the cache."""
    ckpt = ds_disk_server.storage / "ckpt"
    common = ["--stage", str(stage), "--ckpt", str(ckpt), "--steps", "5"]
    first = Run(world, [*common, "--save-at", "3", "--wait-persisted"],
                socket_path=ds_disk_server.socket, out=tmp_path / "first", ready=True).wait()
    assert (ckpt / "latest").read_text() == "global_step3"
    persisted = sorted(ckpt.rglob("*.pt"))
    # ZeRO-3 writes zero_pp_rank_<r>_mp_rank_00_model_states.pt per rank
    model_files = [f for f in persisted if f.name.endswith("model_states.pt")]
    assert len(model_files) == (world if stage == 3 else 1), persisted
    if stage:
        assert sum("optim_states" in f.name for f in persisted) == world
    ds_disk_server.disk.unmount()
    assert not ckpt.exists()  # 'latest' went with it
    run = Run(world, [*common, "--load"], socket_path=ds_disk_server.socket, out=tmp_path / "resumed")
    resumed = run.wait()
    log = run.logs()
    assert "[TCE] checkpoint engine active: TCECheckpointEngine" in log  # said clearly
    # DeepSpeed reads 'latest' from disk; gone with the disk, TCE picks the
    # newest tag whose files its cache still holds
    assert f"no 'latest' in {ckpt}; loading 'global_step3', the newest recoverable tag" in log, log
    for rank in range(world):
        a, b = first[rank], resumed[rank]
        _same_state(b["at_load"], a["saved"][3], f"rank {rank} after load:")
        assert b["losses"] == {k: v for k, v in a["losses"].items() if k > 3}, f"rank {rank} losses"
        _same_state(b["final"], a["final"], f"rank {rank} at the end:")
        # every read came from the cache, the model file's second read included
        assert b["loads"]["storage"] == 0 and b["loads"]["cache"] >= 2, b["loads"]


def test_async_saves_commit_at_the_next_step_and_hold_the_values_as_saved(ds_server, tmp_path):
    """"tce": {"async": true}: save_checkpoint returns with the copies in
    flight; DeepSpeed (the engine is decoupled) commits the tag and writes
    `latest` at the next step, whose optimizer update waits for the copies.
    Resuming gives the state as of the save, bit for bit."""
    ckpt = ds_server.storage / "ckpt"
    common = ["--stage", "1", "--ckpt", str(ckpt), "--steps", "5"]
    first = Run(2, [*common, "--save-at", "2,3", "--async", "--wait-persisted"],
                socket_path=ds_server.socket, out=tmp_path / "first").wait()
    # `latest` lags one step: written by the commit at the step after each save
    assert first[0]["latest_after_save"] == {2: None, 3: "global_step2"}
    assert (ckpt / "latest").read_text() == "global_step3"
    resumed = Run(2, [*common, "--load"], socket_path=ds_server.socket, out=tmp_path / "resumed").wait()
    for rank in range(2):
        _same_state(resumed[rank]["at_load"], first[rank]["saved"][3], f"rank {rank} after load:")
        _same_state(resumed[rank]["final"], first[rank]["final"], f"rank {rank} at the end:")
        assert resumed[rank]["loads"]["storage"] == 0, resumed[rank]["loads"]


def test_resume_from_memory_only_cache(tmp_path):
    """No storage at all: the model files exist only in the cache, where
    DeepSpeed's glob for them cannot look; the engine finds them."""
    server = _server(tmp_path, persist=False).start()
    try:
        ckpt = tmp_path / "ckpt"
        common = ["--stage", "2", "--ckpt", str(ckpt), "--steps", "4"]
        first = Run(2, [*common, "--save-at", "2"], socket_path=server.socket,
                    out=tmp_path / "first", ready=True).wait()
        assert sorted(p.name for p in (ckpt / "global_step2").iterdir()) == []  # nothing on disk
        resumed = Run(2, [*common, "--load"], socket_path=server.socket,
                      out=tmp_path / "resumed").wait()
        for rank in range(2):
            _same_state(resumed[rank]["at_load"], first[rank]["saved"][2], f"rank {rank}:")
            _same_state(resumed[rank]["final"], first[rank]["final"], f"rank {rank} at the end:")
    finally:
        assert server.stop() == 0, server.log()
        server.cleanup()


def test_latest_naming_a_lost_tag_falls_back_to_the_newest_recoverable(tmp_path):
    """Every node restarted before global_step4 was persisted: 'latest' names
    it, but its files are gone. load_checkpoint warns and loads global_step2;
    with global_step2 gone too, it raises and names what it found."""
    ckpt = tmp_path / "storage" / "ckpt"
    common = ["--stage", "1", "--ckpt", str(ckpt)]
    server = _server(tmp_path).start()  # persists global_step2
    first = Run(1, [*common, "--save-at", "2", "--steps", "2", "--wait-persisted"],
                socket_path=server.socket, out=tmp_path / "first").wait()
    assert server.stop() == 0
    server = _server(tmp_path, persist=False).start()  # same metadata; global_step4 stays in memory
    try:
        Run(1, [*common, "--load", "--save-at", "4", "--steps", "4"], socket_path=server.socket,
            out=tmp_path / "second").wait()
        _wait_metadata_written(server)
        server.kill()  # the node restarts: global_step4 dies with the memory
        server.start()
        assert (ckpt / "latest").read_text() == "global_step4"
        assert not (ckpt / "global_step4" / "mp_rank_00_model_states.pt").exists()
        third = Run(1, [*common, "--load", "--steps", "2"], socket_path=server.socket,
                    out=tmp_path / "third")
        resumed = third.wait()[0]
        assert resumed["loaded_path"].endswith("global_step2/mp_rank_00_model_states.pt")
        _same_state(resumed["at_load"], first[0]["saved"][2], "after the fallback:")
        log = third.logs()
        assert "'latest' in" in log and "names 'global_step4', whose files are lost" in log, log
        assert "loading 'global_step2', the newest recoverable tag" in log, log

        for f in (ckpt / "global_step2").glob("*.pt"):
            f.unlink()  # storage lost global_step2 as well
        fourth = Run(1, [*common, "--load", "--steps", "2"], socket_path=server.socket,
                     out=tmp_path / "fourth")
        fourth.wait(fails=True)
        log = fourth.logs()
        assert f"no recoverable checkpoint in {ckpt}: 'latest' names 'global_step4', complete " \
               "tag(s) ['global_step2', 'global_step4'] have files that are neither cached nor on " \
               "storage" in log, log
    finally:
        server.stop()
        server.cleanup()


def test_a_tag_whose_files_were_deleted_on_disk_is_not_loaded(ds_server, tmp_path):
    """Rank 1's file of the newest tag is deleted on disk after it persisted:
    its cached copy no longer counts, and the resume falls back to the older
    complete tag instead of loading one the user deleted."""
    ckpt = ds_server.storage / "ckpt"
    common = ["--stage", "2", "--ckpt", str(ckpt)]
    first = Run(2, [*common, "--save-at", "2,4", "--steps", "4", "--wait-persisted"],
                socket_path=ds_server.socket, out=tmp_path / "first").wait()
    assert (ckpt / "latest").read_text() == "global_step4"
    deleted = ckpt / "global_step4" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    deleted.unlink()
    run = Run(2, [*common, "--load", "--steps", "4"], socket_path=ds_server.socket,
              out=tmp_path / "resumed")
    resumed = run.wait()
    log = run.logs()
    assert "names 'global_step4', whose files are lost" in log, log
    assert "loading 'global_step2', the newest recoverable tag" in log, log
    for rank in range(2):
        _same_state(resumed[rank]["at_load"], first[rank]["saved"][2], f"rank {rank}:")
    assert not deleted.exists()


def _wait_metadata_written(server: LocalServer) -> None:
    from tce import _service, api
    from tce.core import _knobs

    with _knobs.override(socket=server.socket):
        wait_metadata_written()
        api.close()


def test_zero_to_fp32_reads_a_tce_checkpoint_like_a_default_one(ds_server, tmp_path):
    """DeepSpeed's own zero_to_fp32.py, in a process that never imports TCE,
    gives the same fp32 weights from a persisted TCE checkpoint as from one
    written by DeepSpeed's default engine on the same run."""
    outs = {}
    for engine in ("attach", "torch"):
        ckpt = ds_server.storage / f"ckpt-{engine}"
        args = ["--engine", engine, "--stage", "2", "--ckpt", str(ckpt), "--steps", "3",
                "--save-at", "3"]
        if engine == "attach":  # tce.attach(engine) after deepspeed.initialize
            args.append("--wait-persisted")
        Run(2, args, socket_path=ds_server.socket, out=tmp_path / engine, torchrun=True).wait()
        out_dir = tmp_path / f"fp32-{engine}"
        code = ("import runpy, sys\n"
                f"sys.argv = ['zero_to_fp32.py', {str(ckpt)!r}, {str(out_dir)!r}]\n"
                f"runpy.run_path({str(ckpt / 'zero_to_fp32.py')!r}, run_name='__main__')\n"
                "assert 'tce' not in sys.modules, 'TCE was imported'\n")
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                           env={k: v for k, v in os.environ.items() if not k.startswith("TCE_")})
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        (weights,) = list(out_dir.iterdir())
        outs[engine] = torch.load(weights, weights_only=True)
    a, b = outs["attach"], outs["torch"]
    assert a.keys() == b.keys() and len(a) >= 6
    for k in a:
        assert a[k].dtype == torch.float32 and torch.equal(a[k], b[k]), k


# ---- the hook and the engine contract, in fresh interpreters ----

def _python(code: str, env: dict | None = None) -> str:
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                       env=dict(os.environ, **(env or {})))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


def test_hook_is_idempotent_and_works_in_either_import_order():
    out = _python(
        "import sys\n"
        "import deepspeed.runtime.engine as e\n"       # DeepSpeed first ...
        "before = e.create_checkpoint_engine\n"
        "import tce\n"                                   # ... then tce: applied at once
        "wrapped = e.create_checkpoint_engine\n"
        "assert wrapped is not before and wrapped.__tce_original__ is before\n"
        "tce.install_deepspeed(); tce.install_deepspeed()\n"
        "assert e.create_checkpoint_engine is wrapped  # never wrapped twice\n"
        "assert e.DeepSpeedEngine.load_checkpoint.__tce_original__ is not None\n"
        "import deepspeed.runtime.checkpoint_engine as ce\n"
        "assert ce.create_checkpoint_engine is before  # only the name engine.py looks up\n"
        "print('ok')\n")
    assert out.strip().endswith("ok")
    out = _python(
        "import tce, sys\n"                              # tce first: DeepSpeed not imported yet
        "assert 'deepspeed' not in sys.modules\n"
        "import deepspeed.runtime.engine as e\n"
        "assert e.create_checkpoint_engine.__tce_original__ is not None\n"
        "print('ok')\n")
    assert out.strip().endswith("ok")


def test_hook_is_harmless_without_deepspeed():
    out = _python(
        "import sys\n"
        "sys.modules['deepspeed'] = None  # as if DeepSpeed were not installed\n"
        "import tce, torch\n"
        "tce.install_deepspeed()\n"
        "try:\n"
        "    import deepspeed\n"
        "except ImportError:\n"
        "    print('no deepspeed')\n"
        "try:\n"
        "    tce.TCECheckpointEngine\n"
        "except ImportError:\n"
        "    print('engine needs deepspeed')\n")
    assert out.split() == ["no", "deepspeed", "engine", "needs", "deepspeed"]


def test_engine_contract_with_string_tags_and_config(ds_server, tmp_path):
    """The whole CheckpointEngine contract, called the way older DeepSpeed
    calls it (string tags), plus the config selection and a bad "tce" block."""
    ckpt = ds_server.storage / "c"
    out = _python(
        "import argparse, os, torch, tce\n"
        "import deepspeed.runtime.engine as e\n"
        "from deepspeed.runtime.checkpoint_engine import TorchCheckpointEngine\n"
        "from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine\n"
        "make = e.create_checkpoint_engine\n"
        "kw = dict(groups=None, zero_stage=0, has_moe_layers=False, optimize_dp_state=False)\n"
        "class Cfg:\n"
        "    def __init__(self, d): self._param_dict = d\n"
        "assert type(make(config_params=None, **kw)) is TorchCheckpointEngine\n"
        "eng = make(config_params=Cfg({'checkpoint_engine': 'tce', 'tce': {'job': 'contract'}}), **kw)\n"
        "assert isinstance(eng, CheckpointEngine) and eng.name == 'TCECheckpointEngine'\n"
        "try:\n"
        "    make(config_params=Cfg({'checkpoint_engine': 'tce', 'tce': {'jobb': 'x'}}), **kw)\n"
        "except TypeError as err:\n"
        "    print('refused:', err)\n"
        f"d = {str(ckpt)!r}\n"
        "eng.makedirs(os.path.join(d, 'step1'), exist_ok=True)\n"
        "eng.create('step1')  # the older API: a string, not CheckpointCommitInfo\n"
        "sd = {'w': torch.arange(6.0), 'ns': argparse.Namespace(lr=0.1)}\n"
        "eng.save(state_dict=sd, path=os.path.join(d, 'step1', 'model.pt'))\n"
        "assert eng.commit('step1') is True\n"
        "for ml in (None, 'cpu', torch.device('cpu'), {'cpu': 'cpu'}, lambda s, loc: s):\n"
        "    got = eng.load(os.path.join(d, 'step1', 'model.pt'), map_location=ml)\n"
        "    assert torch.equal(got['w'], sd['w']) and got['ns'].lr == 0.1\n"
        "assert eng.loads_from_cache == 5 and eng.loads_from_storage == 0\n"
        "assert eng.is_data_parallel_writer(0) and not eng.is_data_parallel_writer(1)\n"
        "assert not eng.is_decoupled() and eng.preserves_storage_sharing()\n"
        "eng.cleanup(); eng.wait(timeout=60)\n"
        "from tce import _service\n"
        "(t,) = _service.client().list_tags('contract')\n"
        "print('tag', t.tag, t.world_size, [(f.rank, os.path.basename(f.path)) for f in t.files])\n",
        env={"TCE_SOCKET": ds_server.socket, "TCE_ON_UNAVAILABLE": "raise"})
    assert "refused: unknown TCE setting 'jobb'" in out
    assert "tag step1 1 [(0, 'model.pt')]" in out
    assert torch.load(ckpt / "step1" / "model.pt", weights_only=False)["ns"].lr == 0.1  # persisted
