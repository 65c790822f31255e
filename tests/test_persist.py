"""Asynchronous persistence through a real server onto real filesystems."""

from __future__ import annotations

import os
import subprocess
import uuid
import zipfile

import pytest
import torch

import tce
from tce import _service, api
from tce.core import _knobs
from tce.tools._server import LocalServer
from tce.v1 import tce_pb2 as pb
from conftest import run_python
from helpers import assert_same, every_dtype, sample_tensor, wait_metadata_written


@pytest.fixture
def storage(tmp_path):
    root = tmp_path / "storage"
    root.mkdir()
    return root


@pytest.fixture
def persisting(storage):
    s = LocalServer(memory_budget="512MiB", storage_roots=[str(storage)],
                    extra_args=["--persist-backoff-ms", "10", "--persist-retries", "2"]).start()
    with _knobs.override(socket=s.socket, job=f"persist-{uuid.uuid4().hex[:8]}",
                         on_unavailable="raise"):
        yield s
        api.close()
    assert s.stop() == 0, s.log()
    s.cleanup()


def test_persisted_file_is_a_plain_torch_file(persisting, storage):
    obj = {"model": {f"w{i}": torch.randn(64, 64) for i in range(3)},
           "dtypes": {str(d): sample_tensor(d) for d in every_dtype()},
           "step": 7, "empty": torch.empty(0)}
    path = storage / "ckpt" / "global_step7" / "mp_rank_00_model_states.pt"
    path.parent.mkdir(parents=True)
    tce.save(obj, path, tag="global_step7")
    tce.wait()
    assert path.exists()
    assert zipfile.ZipFile(path).testzip() is None  # every CRC-32 filled by the server
    info = _service.client().lookup(_knobs.get("job"), str(path))
    assert info.state == pb.FILE_STATE_PERSISTED and info.persisted_unix_ns >= info.committed_unix_ns
    z = zipfile.ZipFile(path)
    assert [r.crc32 for r in info.records] == [i.CRC for i in z.infolist()]
    ref = path.parent / "ref.pt"
    torch.save(obj, ref)
    out = run_python(
        "import sys, torch\n"
        f"a = torch.load({str(path)!r}, weights_only=True)\n"
        f"m = torch.load({str(path)!r}, weights_only=True, mmap=True)\n"
        f"b = torch.load({str(ref)!r}, weights_only=True)\n"
        "assert 'tce' not in sys.modules\n"
        "eq = lambda x, y: all(torch.equal(x[k].view(torch.uint8) if x[k].dtype.itemsize == 1 else x[k], "
        "y[k].view(torch.uint8) if y[k].dtype.itemsize == 1 else y[k]) for k in x)\n"
        "assert eq(a['model'], b['model']) and eq(m['model'], b['model']) and a['step'] == 7\n"
        "assert all(torch.equal(a['dtypes'][k].view(torch.uint8), b['dtypes'][k].view(torch.uint8)) "
        "for k in b['dtypes'] if b['dtypes'][k].numel())\n"
        "print('ok')\n"
    )
    assert out.strip() == "ok"
    # the cache holds the same bytes the disk does (CRCs included)
    _, mm = _service.client().open(_knobs.get("job"), str(path))
    assert mm[: info.size] == path.read_bytes()


def test_wait_for_named_paths_and_status(persisting, storage):
    paths = [storage / f"r{i}.pt" for i in range(3)]
    for i, p in enumerate(paths):
        tce.save({"x": torch.full((1000,), float(i))}, p)
    tce.wait([paths[0], str(paths[2])], timeout=30)
    assert paths[0].exists() and paths[2].exists()
    tce.wait(timeout=30)
    st = tce.status()
    assert int(st["persisted_files"]) == 3 and int(st["persist_queue"]) == 0
    assert st["storage_roots"] == [os.path.realpath(storage)]
    assert int(st["failed_files"]) == 0


def test_paths_outside_the_roots_are_refused(persisting, storage, tmp_path):
    with pytest.raises(tce.PermissionDeniedError, match="is not under a storage root"):
        tce.save({"x": 1}, tmp_path / "elsewhere.pt")
    os.symlink("/etc", storage / "escape")
    with pytest.raises(tce.PermissionDeniedError, match="resolves to /etc/x.pt"):
        tce.save({"x": 1}, storage / "escape" / "x.pt")
    assert not os.path.exists("/etc/x.pt")


def test_wait_on_a_memory_only_server(server, tmp_path):
    tce.save({"x": 1}, tmp_path / "m.pt")
    with pytest.raises(tce.FailedPreconditionError, match="persistence is off"):
        tce.wait([tmp_path / "m.pt"])


@pytest.fixture
def tiny_fs(tmp_path):
    """A real 1 MiB tmpfs (needs root, which CI has)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_filesystem_fails_loudly_and_keeps_the_file_in_memory(tiny_fs):
    s = LocalServer(memory_budget="64MiB", storage_roots=[str(tiny_fs)],
                    extra_args=["--persist-backoff-ms", "5", "--persist-retries", "2"]).start()
    try:
        with _knobs.override(socket=s.socket, on_unavailable="raise"):
            small, big = tiny_fs / "small.pt", tiny_fs / "big.pt"
            tce.save({"x": torch.ones(10)}, small)
            obj = {"x": torch.randn(1 << 20)}  # 4 MiB > 1 MiB of disk
            tce.save(obj, big)
            with pytest.raises(tce.PersistFailedError, match="No space left on device") as ei:
                tce.wait(timeout=60)
            assert list(ei.value.failures) == [str(big)]
            assert small.exists() and not big.exists()
            assert [f.name for f in tiny_fs.iterdir()] == ["small.pt"]  # no temp files left
            assert torch.equal(tce.load(big, weights_only=True)["x"], obj["x"])  # still cached
            assert int(tce.status()["failed_files"]) == 1
            ls = subprocess.run(["python3", "-m", "tce.cli", "--socket", s.socket, "ls"],
                                capture_output=True, text=True)
            assert any("FAILED" in line and line.endswith(str(big)) for line in ls.stdout.splitlines())
            show = subprocess.run(["python3", "-m", "tce.cli", "--socket", s.socket, "show", str(big)],
                                  capture_output=True, text=True)
            assert show.returncode == 0, show.stderr
            assert "state     FAILED" in show.stdout and "No space left on device" in show.stdout
            show = subprocess.run(["python3", "-m", "tce.cli", "--socket", s.socket, "show", str(small)],
                                  capture_output=True, text=True)
            crcs = [l.split()[-1] for l in show.stdout.splitlines() if "record" in l]
            assert "state     PERSISTED" in show.stdout
            assert crcs == [f"{i.CRC:08x}" for i in zipfile.ZipFile(small).infolist()]
            api.close()
    finally:
        s.stop()
        s.cleanup()


def test_checkpoints_beyond_the_budget_evict_persisted_ones(storage):
    s = LocalServer(memory_budget="40MiB", storage_roots=[str(storage)]).start()
    try:
        with _knobs.override(socket=s.socket, on_unavailable="raise"):
            paths = [storage / f"step{i}" / "state.pt" for i in range(8)]
            for i, p in enumerate(paths):  # 8 x 12 MiB into a 40 MiB cache
                p.parent.mkdir()
                tce.save({"w": torch.full((3 << 20,), float(i))}, p, tag=f"step{i}")
            tce.wait()
            states = {f.path: pb.FileState.Name(f.state)
                      for f in _service.client().list(_knobs.get("job"))}
            assert states[str(paths[-1])] == "FILE_STATE_PERSISTED"
            assert states[str(paths[0])] == "FILE_STATE_EVICTED"
            assert int(tce.status()["evicted_files"]) >= 5
            assert not tce.cached(paths[0]) and tce.cached(paths[-1])
            for i, p in enumerate(paths):  # every step loads, from cache or storage
                assert tce.load(p, weights_only=True)["w"][0].item() == float(i)
            api.close()
    finally:
        s.stop()
        s.cleanup()


def test_keep_last_tags_per_job(storage):
    s = LocalServer(memory_budget="256MiB", storage_roots=[str(storage)],
                    extra_args=["--keep-last", "1"]).start()
    try:
        with _knobs.override(socket=s.socket, on_unavailable="raise"):
            for step in range(1, 4):
                (storage / f"step{step}").mkdir()
                for rank in range(2):
                    tce.save({"w": torch.full((1000,), float(step))},
                             storage / f"step{step}" / f"rank{rank}.pt", tag=f"step{step}", rank=rank)
                tce.wait()
            states = {(f.tag, f.rank): pb.FileState.Name(f.state)
                      for f in _service.client().list(_knobs.get("job"))}
            assert states[("step3", 0)] == states[("step3", 1)] == "FILE_STATE_PERSISTED"
            assert states[("step1", 1)] == states[("step2", 0)] == "FILE_STATE_EVICTED"
            assert tce.load(storage / "step1" / "rank0.pt")["w"][0].item() == 1.0  # from storage
            api.close()
    finally:
        s.stop()
        s.cleanup()


def test_server_killed_mid_persist_restarts_clean(storage):
    s = LocalServer(memory_budget="2GiB", storage_roots=[str(storage)]).start()
    try:
        with _knobs.override(socket=s.socket, on_unavailable="raise"):
            done = [storage / "done0.pt", storage / "done1.pt"]
            for i, p in enumerate(done):
                tce.save({"w": torch.full((1000,), float(i))}, p, tag="early")
            tce.wait()
            big = storage / "big.pt"
            tce.save({"w": torch.randn(128 << 20)}, big, tag="late")  # 512 MiB
            # The metadata writer is asynchronous: let it record the commit,
            # so that the restarted server knows the file it lost.
            wait_metadata_written()
            s.kill()  # SIGKILL while it is being persisted
            api.close()
            s.start()  # same state dir: re-indexes from metadata
            states = {f.path: (pb.FileState.Name(f.state), f.reason)
                      for f in _service.client().list(_knobs.get("job"))}
            assert states[str(done[0])][0] == states[str(done[1])][0] == "FILE_STATE_EVICTED"
            big_state, reason = states[str(big)]
            assert [p.name for p in storage.iterdir() if ".tce-tmp-" in p.name] == []
            if big_state == "FILE_STATE_FAILED":
                assert "lost: the server restarted" in reason
                assert not big.exists()  # never a torn file at the final path
            else:  # it made it before the kill
                assert big_state == "FILE_STATE_EVICTED"
                assert zipfile.ZipFile(big).testzip() is None
            assert tce.load(done[1], weights_only=True)["w"][0].item() == 1.0  # from storage
            st = tce.status()
            assert st["metadata_url"].startswith("sqlite://") and st["metadata_healthy"]
            api.close()
    finally:
        s.stop()
        s.cleanup()


def test_ls_reads_metadata_without_a_server(storage):
    s = LocalServer(memory_budget="64MiB", storage_roots=[str(storage)]).start()
    try:
        with _knobs.override(socket=s.socket, on_unavailable="raise", job="meta-job"):
            tce.save({"w": torch.ones(10)}, storage / "a.pt", tag="step5", rank=2)
            tce.wait()
            api.close()
    finally:
        s.stop()  # the server is gone; its metadata stays
    url = f"sqlite://{s.state_dir}/tce.db"
    p = subprocess.run(["python3", "-m", "tce.cli", "ls", "--metadata", url, "--json"],
                       capture_output=True, text=True)
    s.cleanup()
    assert p.returncode == 0, p.stderr
    import json

    assert json.loads(p.stdout) == [{"job": "meta-job", "tag": "step5", "rank": "2",
                                     "state": "PERSISTED", "size": json.loads(p.stdout)[0]["size"],
                                     "path": str(storage / "a.pt")}]


@pytest.mark.parametrize("metadata", ["sqlite", "none"])
def test_a_save_the_server_lost_in_a_restart_is_not_acknowledged(storage, tmp_path, metadata):
    """A save the server is killed on before it recorded it, while the path's
    previous save is on storage: tce.wait must not settle the path on the
    older file's word. The state dir (SQLite) and the storage directory are
    made immutable (chattr +i) so that neither the record nor the file can
    be written before the kill."""
    state = tmp_path / "state"
    extra = [] if metadata == "sqlite" else ["--metadata-url", "none"]
    s = LocalServer(memory_budget="64MiB", storage_roots=[str(storage)], state_dir=str(state),
                    extra_args=extra).start()
    frozen: list[str] = []
    try:
        path = storage / "model.pt"
        with _knobs.override(socket=s.socket, on_unavailable="raise", job="lost"):
            tce.save({"w": torch.full((8,), 1.0)}, path)
            tce.wait([path])
            wait_metadata_written()
            frozen = [str(storage)] + [str(p) for p in (state.iterdir() if state.exists() else ()) if p.name.startswith("tce.db")]
            subprocess.run(["chattr", "+i", *frozen], check=True)
            tce.save({"w": torch.full((8,), 2.0)}, path)  # in memory only: nothing can record it
            s.kill()
            subprocess.run(["chattr", "-i", *frozen], check=True)
            frozen = []
            api.close()
            s.start()
            with pytest.raises(tce.PersistFailedError) as e:
                tce.wait([path])
            assert e.value.failures == {str(path): _service.LOST}
            assert torch.equal(torch.load(path)["w"], torch.full((8,), 1.0))  # the older save, as said
            with pytest.raises(tce.PersistFailedError):  # again: until the path is saved again
                tce.wait()
            tce.save({"w": torch.full((8,), 3.0)}, path)
            tce.wait()
            assert torch.equal(torch.load(path)["w"], torch.full((8,), 3.0))
            api.close()
    finally:
        if frozen:
            subprocess.run(["chattr", "-i", *frozen], check=False)
        s.stop()
        s.cleanup()
