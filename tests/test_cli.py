"""The `tce` command against a real server."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import torch

import tce
from tce.tools import _server


def _tce(*args: str, socket: str | None = None, timeout: float = 300,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tce.cli"]
    if socket:
        cmd += ["--socket", socket]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_status_and_ls(server, tmp_path):
    job = f"cli-{os.getpid()}"
    tce.save({"w": torch.ones(1000)}, tmp_path / "a.pt", tag="step1", job=job)
    tce.save({"w": torch.ones(10)}, tmp_path / "b.pt", tag="step2", job=job)
    p = _tce("ls", "--job", job, socket=server.socket)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split() == ["JOB", "TAG", "RANK", "STATE", "SIZE", "PATH"]
    assert any(l.split()[:4] == [job, "step1", "0", "CACHED"] and l.endswith(str(tmp_path / "a.pt"))
               for l in lines[1:])
    assert lines[-1] == "2 file(s)"
    p = _tce("ls", "--job", job, "--tag", "step2", "--json", socket=server.socket)
    rows = json.loads(p.stdout)
    assert [(r["tag"], r["path"]) for r in rows] == [("step2", str(tmp_path / "b.pt"))]
    p = _tce("status", "--json", socket=server.socket)
    st = json.loads(p.stdout)
    assert int(st["files"]) >= 2 and int(st["budget_bytes"]) == 3 << 30
    p = _tce("status", socket=server.socket)
    assert p.returncode == 0 and "budget" in p.stdout


def test_ls_shows_the_tag_a_file_saved_without_one_was_published_as(server, tmp_path):
    """The patched torch.save gives its files no tag; weights.publish(tag,
    paths) names them. `tce ls` shows that tag, and `--tag` finds them, until
    the path is saved again."""
    from tce import weights
    job = f"cli-pub-{os.getpid()}"
    (tmp_path / "step1").mkdir()
    a, b = tmp_path / "step1" / "model.pt", tmp_path / "other.pt"
    tce.save({"w": torch.ones(100)}, a, job=job)
    tce.save({"w": torch.ones(10)}, b, job=job)
    weights.publish("step1", [tmp_path / "step1"], job=job)
    rows = json.loads(_tce("ls", "--job", job, "--json", socket=server.socket).stdout)
    assert sorted((r["tag"], r["path"]) for r in rows) == [("-", str(b)), ("step1", str(a))]
    rows = json.loads(_tce("ls", "--job", job, "--tag", "step1", "--json", socket=server.socket).stdout)
    assert [(r["tag"], r["path"]) for r in rows] == [("step1", str(a))]
    p = _tce("show", str(a), "--job", job, socket=server.socket)
    assert "tag       step1" in p.stdout, p.stdout
    tce.save({"w": torch.zeros(100)}, a, job=job)  # saved again: no longer what step1 published
    rows = json.loads(_tce("ls", "--job", job, "--json", socket=server.socket).stdout)
    assert sorted((r["tag"], r["path"]) for r in rows) == [("-", str(b)), ("-", str(a))]


def test_status_without_server(tmp_path):
    p = _tce("status", socket=str(tmp_path / "none.sock"))
    assert p.returncode == 1
    assert "UNAVAILABLE: cannot reach the TCE server" in p.stderr


def test_server_passthrough_print_config(tmp_path):
    sock = str(tmp_path / "s.sock")
    p = _tce("server", "--memory-budget", "2GiB", "--print-config", socket=sock)
    assert p.returncode == 0, p.stderr
    config = dict(l.split(" = ", 1) for l in p.stdout.splitlines() if " = " in l)
    assert config["socket"] == f'"{sock}"'
    assert config["memory_budget"].strip('"') in ("2GiB", str(2 << 30))


def test_bench_json(tmp_path):
    chart = tmp_path.parent / f"{tmp_path.name}-chart.png"
    p = _tce("bench", "--size", "32MiB", "--repeats", "2", "--persist-repeats", "1",
             "--dir", str(tmp_path), "--json", "--plot", str(chart))
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    for key in ("memcpy_s", "tce_save_first_s", "tce_save_s", "tce_load_s", "tce_restore_s",
                "tce_async_blocking_s", "tce_async_modifiable_s",
                "torch_save_s", "torch_save_fsync_s", "torch_load_s", "torch_restore_s",
                "tce_persist_s", "tce_save_while_persisting_s", "dd_fsync_s", "persist_vs_dd",
                "dcp_save_s", "dcp_async_blocking_s", "dcp_async_durable_s", "dcp_load_s"):
        assert res[key] > 0, key
    if shutil.which("fio"):  # the disk's O_DIRECT figure, paired with each persist
        assert res["fio_direct_s"] > 0 and res["persist_vs_fio"] > 0
    else:
        assert "fio" in res["fio_missing"]
    assert res["device"] == "cpu" and res["dtype"] == "float32"
    assert 30 << 20 <= res["bytes"] <= 40 << 20
    # A new process's first save and restore, from a filled pool, against
    # torch.load in a new process; with huge pages where the run is root.
    backings = ["4k", "hugetlb"] if os.geteuid() == 0 else ["4k"]
    for b in backings:
        for key in ("first_save_s", "steady_save_s", "restore_s", "restore_speedup_vs_torch"):
            assert res[f"cold_{b}_{key}"] > 0, (b, key)
        assert res[f"cold_{b}_pool_taken"] >= 1  # the new buffers came from the pool
    assert res["cold_4k_huge_page_buffers"] == 0
    if os.geteuid() == 0:
        assert res["cold_hugetlb_huge_page_buffers"] >= 1
        assert res["cold_torch_restore_dropped_s"] > 0
    else:
        assert "needs root" in res["cold_hugetlb_skipped"]
    assert res["cold_torch_restore_s"] > 0
    assert os.listdir(tmp_path) == []  # the bench cleans up after itself
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 10000
    p = _tce("bench", "--device", "cuda:0", "--size", "1MiB")
    if not torch.cuda.is_available():
        assert p.returncode != 0 and "this torch sees no CUDA device" in p.stderr


@pytest.mark.s3
def test_bench_s3_times_both_clients_in_rounds(tmp_path):
    """`tce bench --s3`: boto3 (defaults, and with CRC-32 checked) and TCE
    against moto, the bench's own, every download and load checked against
    the source; `--skip tce` leaves TCE's half out."""
    from tce.tools import _moto
    try:
        _moto.require("tce bench --s3")
    except _moto.MissingDependency as e:
        pytest.skip(str(e))
    p = _tce("bench", "--s3", "--size", "16MiB", "--repeats", "2", "--dir", str(tmp_path), "--json")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["bytes"] == 16 << 20 and res["repeats"] == 2
    for key in ("boto3_upload", "boto3_crc32_upload", "boto3_download", "tce_save", "tce_persist",
                "tce_durable", "tce_cold_load"):
        assert 0 < res[f"{key}_min_s"] <= res[f"{key}_s"] <= res[f"{key}_max_s"], key
        assert res[f"{key}_GBps"] > 0, key
    for ratio in ("tce_upload_vs_boto3", "tce_upload_vs_boto3_crc32", "tce_download_vs_boto3"):
        assert res[ratio] > 0, ratio
    assert res["tce_file_bytes"] >= 16 << 20 and "error" not in res
    assert os.listdir(tmp_path) == []  # the bench cleans up after itself
    p = _tce("bench", "--s3", "--size", "16MiB", "--repeats", "1", "--skip", "tce",
             "--dir", str(tmp_path), "--json")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert "boto3_upload_s" in res and not any(k.startswith("tce_") for k in res) and "error" not in res
    p = _tce("bench", "--s3", "--skip", "torch")
    assert p.returncode != 0 and "--skip takes boto3, tce, not torch" in p.stderr


def test_bench_layers_sets_the_tensor_count(tmp_path):
    p = _tce("bench", "--size", "64MiB", "--layers", "168", "--repeats", "1",
             "--skip", "persist,torch,dcp,cold", "--dir", str(tmp_path), "--json")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["tensors"] == 2020 and res["bytes"] <= 64 << 20  # the 16 GiB model's count
    assert res["tce_async_blocking_s"] > 0 and "torch_save_s" not in res


@pytest.mark.skipif(os.geteuid() != 0, reason="reserving huge pages needs root")
def test_bench_cache_rows_on_huge_pages(tmp_path):
    """`--memory-backing hugetlb`: the cache rows' server has its buffers on
    huge pages, which the run reserves and then gives back."""
    pages = "/proc/sys/vm/nr_hugepages"
    before = open(pages).read()
    p = _tce("bench", "--size", "32MiB", "--repeats", "1", "--skip", "persist,torch,dcp,cold",
             "--memory-backing", "hugetlb", "--dir", str(tmp_path), "--json")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["memory_backing"] == "hugetlb"
    assert res["tce_save_first_s"] > 0 and res["tce_save_s"] > 0
    assert open(pages).read() == before


@pytest.mark.slow
def test_bench_dcp(tmp_path):
    """`tce bench --dcp`: every figure, from 2 ranks (the ranks check that the
    reader's loads came from the cache, then from storage)."""
    p = _tce("bench", "--dcp", "--size", "32MiB", "--repeats", "1", "--dir", str(tmp_path),
             "--json")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    for key in ("fs_save_s", "dcp_async_blocking_s", "dcp_async_durable_s", "tce_save_s",
                "tce_save_durable_s", "tce_async_blocking_s", "tce_async_modifiable_s",
                "tce_async_durable_s", "tce_load_cache_s", "tce_load_storage_s", "fs_load_s"):
        assert res[key] > 0, key
    assert res["tce_async_modifiable_s"] >= res["tce_async_blocking_s"]
    assert os.listdir(tmp_path) == []  # the bench cleans up after itself


@pytest.mark.deepspeed
@pytest.mark.timeout(1800)  # a hang bound: three DeepSpeed processes on a loaded machine
def test_demo_resumes_bitwise(tmp_path):
    # torch's JIT extensions land here: the demo must build none (DeepSpeed's
    # shared-memory allreduce would take ~45 s before the first step)
    extensions = tmp_path / "torch_extensions"
    p = _tce("demo", "--steps", "16", "--every", "2", "--crash-at", "9", "--dim", "64",
             "--layers", "2", "--vocab", "256", "--memory-budget", "256MiB", timeout=1500,
             env=dict(os.environ, TORCH_EXTENSIONS_DIR=str(extensions)))
    assert p.returncode == 0, p.stdout + p.stderr
    assert not extensions.exists() or list(extensions.iterdir()) == [], list(extensions.rglob("*"))
    # each phase with the time since the demo started
    phases = re.findall(r"^\[\s*\d+\.\d s\] (\S+)", p.stdout, re.M)
    assert phases == ["1.", "2.", "3.", "done"], p.stdout
    assert "simulated crash" in p.stdout
    assert "(identical)" in p.stdout
    assert "[TCE] checkpoint engine active: TCECheckpointEngine" in p.stdout
    assert "resumed at step 8 from" in p.stdout
    assert "file(s) read from the cache, 0 from storage" in p.stdout
    for row in ("save_checkpoint, steady state", "load_checkpoint"):
        assert row in p.stdout


@pytest.mark.deepspeed
@pytest.mark.multinode
@pytest.mark.slow
@pytest.mark.timeout(1800)  # a hang bound: nine DeepSpeed processes on a loaded machine
def test_demo_loses_a_node_and_resumes_from_the_ring(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("the multinode tests need root (network namespaces); CI runs as root")
    p = _tce("demo", "--nodes", "3", "--steps", "8", "--every", "2", "--crash-at", "3", "--dim", "64",
             "--layers", "2", "--vocab", "256", "--memory-budget", "256MiB", timeout=1500)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "(identical)" in out
    assert "node 1's new server: recovered 2 of 2 file(s) of job=tce-demo" in out, out
    for row in ("no node lost, TCE (each node's cache)", "node 1 lost, TCE (recovered from the ring)",
                "DeepSpeed's default engine (from storage)"):
        line = next(ln for ln in out.splitlines() if ln.startswith(row))
        restart, load = (float(x) for x in line[len(row):].split()[:2])
        assert 0 <= load < restart, line
        if "TCE" in row:
            assert line.endswith("storage 0"), line


def test_demo_shows_how_a_training_process_failed(tmp_path, capsys):
    import argparse

    from tce.tools import _demo

    parser = argparse.ArgumentParser()
    _demo.add_arguments(parser)
    args = parser.parse_args([])
    ok = _demo._child(args, str(tmp_path / "no.sock"), str(tmp_path / "ckpt"),
                      str(tmp_path / "report.jsonl"), "--engine", "jax")
    out = capsys.readouterr().out
    assert not ok
    assert "the training process exited with code 2:" in out
    assert "  | " in out and "invalid choice: 'jax'" in out


@pytest.mark.multinode
@pytest.mark.slow
@pytest.mark.timeout(1800)  # a hang bound
def test_demo_weights_serves_each_version_on_two_other_nodes_bitwise(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("the multinode tests need root (network namespaces); CI runs as root")
    p = _tce("demo", "--weights", "--versions", "3", "--every", "1", "--dim", "64", "--layers", "2",
             "--vocab", "256", timeout=1500)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    rows = [ln.split() for ln in out.splitlines() if ln.split() and ln.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == [2, 3, 4], out  # every version served on both nodes
    assert next(ln for ln in out.splitlines() if ln.lstrip().startswith("storage")), out
    assert "every reader's logits equal the trainer's at every version, bit for bit: yes" in out, out


def test_vllm_follow_reports_an_engine_it_cannot_reach_as_lagging(server, tmp_path):
    """tce vllm follow with an engine that is not up: it says so, then for
    each version reports the engine as lagging with the reason, and keeps
    following (the engine is initialised once it answers)."""
    from tce import weights
    from tce.tools._ports import free_port

    job = f"cli-vllm-{os.getpid()}"
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    p = subprocess.Popen([sys.executable, "-m", "tce.cli", "--socket", server.socket, "vllm", "follow",
                          "--job", job, "--server", url, "--timeout", "5"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert p.stdout.readline().startswith(f"{url} not initialised yet: {url}: ")
        assert p.stdout.readline() == f"following job '{job}' for 1 engine(s)\n"
        for v in (1, 2):
            tce.save({"w": torch.full((10,), float(v))}, tmp_path / f"v{v}.pt", tag=f"step{v}", job=job)
            weights.publish(f"step{v}", job=job)
            line = p.stdout.readline()
            assert line.startswith(f"version {v} (step{v}): {url} serves 0, lag {v}: {url}: "), line
            assert "refused" in line, line
    finally:
        p.kill()
        p.wait()


@pytest.mark.vllm
@pytest.mark.multinode
@pytest.mark.slow
@pytest.mark.timeout(2400)  # a hang bound: makes the vLLM environment if missing (minutes)
def test_demo_weights_with_vllm_serves_every_version_as_a_fresh_engine_would(tmp_path):
    """A vLLM server on node 1 serves each version the trainer on node 0
    publishes (tce vllm follow), with a timeline, and answers as a fresh
    engine on the newest version's files does, bit for bit."""
    if os.geteuid() != 0:
        pytest.fail("the multinode tests need root (network namespaces); CI runs as root")
    p = _tce("demo", "--weights", "--engine", "vllm", "--versions", "3", "--every", "2", "--dim", "64",
             "--layers", "2", timeout=2100)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    rows = [r for r in (ln.split(maxsplit=7) for ln in out.splitlines()) if r[:2] and r[0].isdigit()]
    assert [(int(r[0]), int(r[1])) for r in rows] == [(1, 0), (2, 2), (3, 4)], out  # version, step
    for version, step, loss, saved, published, known, served, generation in rows[1:]:
        # node 1 learns the version, and the engine serves it, after it was saved
        assert 0 < float(saved) < float(known) and float(saved) < float(served), out
        assert generation[0] in "'\"", out  # the engine's text, as a Python literal
    assert "the engine's answer on version 3 equals the fresh engine's, bit for bit " \
           "(tokens and logprobs): yes" in out, out
