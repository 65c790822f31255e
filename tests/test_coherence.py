"""A checkpoint path behaves like a file (docs/semantics.md).

Real files, real processes: a user's habits (os.remove, shutil.rmtree, a
rename, a replacement written by another process, an unmounted disk) against
a persisting server, through the patched torch.save / torch.load.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import shutil
import signal
import subprocess
import sys
import uuid
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

import tce
from tce import _service, api
from tce.core import _knobs
from tce.core._client import Client
from tce.tools._server import LocalServer
from tce.v1 import tce_pb2 as pb

from helpers import Hold, failing_mount, loop_mount, until


@pytest.fixture
def storage(tmp_path):
    d = tmp_path / "storage"
    d.mkdir()
    return d


@pytest.fixture
def server(tmp_path, storage):
    s = LocalServer(memory_budget="512MiB", storage_roots=[str(storage)],
                    state_dir=str(tmp_path / "state")).start()
    yield s
    tce.unpatch_torch()
    api.close()
    assert s.stop() == 0, s.log()
    s.cleanup()


@pytest.fixture
def job():
    return f"coh-{uuid.uuid4().hex[:8]}"


def _files(socket: str, job: str) -> dict[str, pb.FileInfo]:
    c = Client(socket, rpc_timeout=10)
    try:
        return {f.path: f for f in c.list(job)}
    finally:
        c.close()


def _status(socket: str) -> pb.StatusResponse:
    c = Client(socket, rpc_timeout=10)
    try:
        return c.status()
    finally:
        c.close()


@pytest.mark.parametrize("habit", ["os.remove", "shutil.rmtree", "rename the directory"])
def test_a_path_removed_right_after_a_save_stays_removed(server, storage, tmp_path, job, habit):
    step = storage / "checkpoint-100"
    step.mkdir()
    path = step / "model.pt"
    with _knobs.override(socket=server.socket, job=job, on_unavailable="raise"):
        tce.patch_torch([storage])
        if habit == "os.remove":  # a durable earlier version the user then deletes
            torch.save({"w": torch.zeros(4)}, path)
            tce.wait()
        hold = Hold(server.socket, job, storage)
        try:
            torch.save({"w": torch.ones(1 << 20)}, path)
            if habit == "os.remove":
                os.remove(path)
            elif habit == "shutil.rmtree":
                shutil.rmtree(step)
            else:
                os.rename(step, storage / "checkpoint-100.old")
        finally:
            hold.release()
        info = _service.client().wait(job, [str(path)], 30)[0]
        assert info.state == pb.FILE_STATE_DISCARDED, info
        assert info.buffer_id == 0  # its memory is free
        assert ("was deleted" if habit == "os.remove" else "was removed") in info.reason, info.reason
        assert not path.exists()
        if habit == "shutil.rmtree":
            assert not step.exists()  # not recreated
        if habit == "rename the directory":
            assert not step.exists()
            assert os.listdir(storage / "checkpoint-100.old") == []
        with pytest.raises(FileNotFoundError):
            torch.load(path)  # as plain torch would
        api.close()
    assert int(_status(server.socket).discarded_files) == 1
    # The metadata says so too: a restarted server knows why.
    assert server.stop() == 0
    server.start()
    f = _files(server.socket, job)[str(path)]
    assert f.state == pb.FILE_STATE_DISCARDED and f.reason == info.reason, f


def test_a_file_replaced_by_another_process_is_what_loads(server, storage, job):
    path = storage / "model.pt"
    with _knobs.override(socket=server.socket, job=job, on_unavailable="raise"):
        tce.patch_torch([storage])
        torch.save({"w": torch.zeros(8)}, path)
        tce.wait()
        assert torch.equal(torch.load(path)["w"], torch.zeros(8))  # from the cache
        # rsync-like: another process writes a new checkpoint and renames it in.
        subprocess.run([sys.executable, "-c", (
            "import os, torch, sys\n"
            "torch.save({'w': torch.full((8,), 7.0)}, sys.argv[1] + '.tmp')\n"
            "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"), str(path)], check=True, timeout=120)
        assert torch.equal(torch.load(path)["w"], torch.full((8,), 7.0))
        assert int(tce.status()["stale_drops"]) == 1
        # The load read the new file into the cache (one read for the node's ranks).
        assert tce.cached(path) and torch.equal(torch.load(path)["w"], torch.full((8,), 7.0))
        os.remove(path)
        with pytest.raises(FileNotFoundError):
            torch.load(path)


def test_a_file_deleted_after_it_persisted_is_not_served(server, storage, job):
    path = storage / "model.pt"
    with _knobs.override(socket=server.socket, job=job, on_unavailable="raise"):
        tce.patch_torch([storage])
        torch.save({"w": torch.ones(8)}, path)
        tce.wait()
        os.remove(path)
        with pytest.raises(FileNotFoundError):
            torch.load(path)
        info = _files(server.socket, job)[str(path)]
        assert info.state == pb.FILE_STATE_EVICTED and "was deleted" in info.reason, info


@contextlib.contextmanager
def _saved_on(root: Path, job: str):
    """A server persisting under `root` (a mount a test will break), and
    `root`/step1/model.pt saved through the patched torch.save and on
    storage. On the way out the server must have logged that storage could
    not be checked for that path."""
    s = LocalServer(memory_budget="256MiB", storage_roots=[str(root)]).start()
    try:
        path = root / "step1" / "model.pt"
        path.parent.mkdir()
        with _knobs.override(socket=s.socket, job=job, on_unavailable="raise"):
            tce.patch_torch([root])
            torch.save({"w": torch.arange(10.0)}, path)
            tce.wait()
            yield path
            tce.unpatch_torch()
            api.close()
        assert s.stop() == 0, s.log()
        assert "storage could not be checked for " + str(path) in s.log()
    finally:
        tce.unpatch_torch()
        s.stop()
        s.cleanup()


def test_unmounted_storage_serves_the_cache(tmp_path, job):
    with loop_mount(tmp_path / "disk", size_mb=64) as mnt, _saved_on(mnt.path, job) as path:
        mnt.unmount()  # the storage is gone, not the user's checkpoint
        assert not path.exists()
        assert torch.equal(torch.load(path)["w"], torch.arange(10.0))  # from the cache
        assert tce.cached(path)
        assert int(tce.status()["storage_fallbacks"]) >= 1


def test_storage_failing_with_eio_serves_the_cache(tmp_path, job):
    """A filesystem that answers every call with EIO (a FUSE passthrough
    that fails, still mounted): the load is served from the cache, counted
    and logged; once it heals, storage is checked again and agrees."""
    with failing_mount(tmp_path / "backing", tmp_path / "mnt") as fs, _saved_on(fs.path, job) as path:
        assert (tmp_path / "backing" / "step1" / "model.pt").exists()  # written through FUSE
        fs.fail()
        with pytest.raises(OSError) as e:
            os.stat(path)
        assert e.value.errno == errno.EIO
        assert torch.equal(torch.load(path)["w"], torch.arange(10.0))  # from the cache
        assert tce.cached(path)
        assert int(tce.status()["storage_fallbacks"]) >= 1
        fs.heal()
        assert torch.equal(torch.load(path)["w"], torch.arange(10.0))
        assert tce.cached(path)  # the same file: still served from memory


def test_a_save_into_a_missing_directory_fails_like_torch_save(server, storage, job):
    path = storage / "nope" / "model.pt"
    with _knobs.override(socket=server.socket, job=job, on_unavailable="raise"):
        with pytest.raises(FileNotFoundError):
            tce.save({"w": torch.ones(2)}, path)
    assert not (storage / "nope").exists()


def test_mode_and_identity_against_plain_torch_save(server, storage, job):
    """Same paths, same umask: TCE's files get the modes torch.save's get.
    The inode differs by design: every write is a rename of a new file."""
    sd = {"w": torch.ones(16)}
    results = {}
    for who in ("torch", "tce"):
        d = storage / who
        d.mkdir()
        existing = d / "existing.pt"
        existing.write_bytes(b"an older checkpoint")
        os.chmod(existing, 0o600)
        inode = existing.stat().st_ino
        old = os.umask(0o027)
        try:
            if who == "torch":
                torch.save(sd, existing)
                torch.save(sd, d / "new.pt")
            else:
                with _knobs.override(socket=server.socket, job=job, on_unavailable="raise"):
                    tce.save(sd, existing)
                    tce.save(sd, d / "new.pt")
                    tce.wait()
        finally:
            os.umask(old)
        results[who] = (existing.stat().st_mode & 0o7777, (d / "new.pt").stat().st_mode & 0o7777,
                        existing.stat().st_ino == inode)
    assert results["torch"] == (0o600, 0o640, True)
    assert results["tce"] == (0o600, 0o640, False)


def _zip_crcs(path) -> list[int]:
    """Every record's CRC-32 field, but the random serialization id's."""
    with zipfile.ZipFile(path) as z:
        return [i.CRC for i in z.infolist() if not i.filename.endswith("serialization_id")]


def test_crc32_options_are_honoured(server, storage, job):
    sd = {"w": torch.arange(64.0), "b": torch.ones(3)}
    try:
        for crc in (True, False):
            torch.serialization.set_crc32_options(crc)
            mine, theirs = storage / f"tce-{crc}.pt", storage / f"torch-{crc}.pt"
            torch.save(sd, theirs)
            with _knobs.override(socket=server.socket, job=job, on_unavailable="raise"):
                tce.save(sd, mine)
                tce.wait()
            assert _zip_crcs(mine) == _zip_crcs(theirs)
            assert any(_zip_crcs(mine)) == crc
            assert torch.equal(torch.load(mine)["w"], sd["w"])
    finally:
        torch.serialization.set_crc32_options(True)



def test_an_asynchronous_save_takes_the_crc_choice_of_its_call(server, storage, job):
    """torch.save reads set_crc32_options when it is called; so does an
    asynchronous tce.save, though its staging thread commits later."""
    import threading

    from tce.core import _staging

    gate = threading.Event()
    try:
        with _knobs.override(socket=server.socket, job=job, on_unavailable="raise"):
            blocker = _staging.submit("gate", 0, lambda: gate.wait(60))  # holds the staging thread
            torch.serialization.set_crc32_options(False)
            staged = tce.save({"w": torch.arange(64.0)}, storage / "async.pt", blocking=False)
            torch.serialization.set_crc32_options(True)  # before the save commits
            gate.set()
            blocker.wait(60)
            staged.wait(60)
            tce.wait()
        assert not any(_zip_crcs(storage / "async.pt"))
    finally:
        gate.set()
        torch.serialization.set_crc32_options(True)


def test_a_save_onto_a_directory_fails_like_torch_save(server, storage, job):
    d = storage / "a-directory"
    d.mkdir()
    with pytest.raises(RuntimeError):
        _service.torch_save({"w": torch.ones(2)}, d)  # what plain torch does
    for on_unavailable in ("raise", "fallback"):  # no fallback: the path is wrong, not the server
        with _knobs.override(socket=server.socket, job=job, on_unavailable=on_unavailable):
            with pytest.raises(tce.PathIsADirectoryError, match="Is a directory") as e:
                tce.save({"w": torch.ones(2)}, d)
        assert isinstance(e.value, IsADirectoryError) and isinstance(e.value, RuntimeError)
        assert e.value.filename == str(d)
    assert d.is_dir() and list(d.iterdir()) == []
    assert str(d) not in _files(server.socket, job)


def test_a_symlink_at_the_path_is_replaced_not_written_through(server, storage, job):
    """docs/semantics.md, "What still differs": the save replaces the link
    by the file and leaves the link's target as it was."""
    target = storage / "real.pt"
    _service.torch_save({"v": 1}, target)
    before = target.read_bytes()
    link = storage / "link.pt"
    link.symlink_to(target)
    with _knobs.override(socket=server.socket, job=job, on_unavailable="raise"):
        tce.save({"v": 2}, link)
        tce.wait([link])
    assert not link.is_symlink() and _service.torch_load(link) == {"v": 2}
    assert target.read_bytes() == before


def _records(path) -> dict[str, bytes]:
    """Every record of a torch zip by name, but the random serialization id."""
    with zipfile.ZipFile(path) as z:
        return {i.filename: z.read(i) for i in z.infolist()
                if not i.filename.endswith("serialization_id")}


def test_a_fallback_writes_plain_torch_saves_bytes(tmp_path, monkeypatch):
    """Server down: the fallback's file has torch.save's record names (the
    archive is named after the file) and bytes, and no temp is left."""
    monkeypatch.setattr(_service, "_warned_fallback", True)
    sd = {"w": torch.arange(100.0), "b": torch.ones(3, dtype=torch.int64)}
    (tmp_path / "mine").mkdir()
    (tmp_path / "theirs").mkdir()
    mine, theirs = tmp_path / "mine" / "step7.pt", tmp_path / "theirs" / "step7.pt"
    _service.torch_save(sd, theirs)
    with _knobs.override(socket=str(tmp_path / "no-server.sock"), on_unavailable="fallback"):
        tce.save(sd, mine)
    assert _records(mine) == _records(theirs)
    assert sorted(_records(mine))[0].startswith("step7/")
    assert os.listdir(tmp_path / "mine") == ["step7.pt"]


def test_durable_saves_and_waits_work_while_the_server_is_down(tmp_path, monkeypatch):
    """patch_torch(durable=True) with the server unreachable: the fallback
    wrote and fsynced the file, so torch.save returns without asking a
    server, and tce.wait settles those paths without one too."""
    monkeypatch.setattr(_service, "_warned_fallback", True)
    path = tmp_path / "model.pt"
    try:
        with _knobs.override(socket=str(tmp_path / "no-server.sock"), on_unavailable="fallback"):
            tce.patch_torch([tmp_path], durable=True)
            torch.save({"w": torch.ones(8)}, path)
            tce.wait([path])
            tce.wait()
            with pytest.raises(tce.ServerUnavailableError):  # never written here: only a server knows
                tce.wait([tmp_path / "other.pt"])
    finally:
        tce.unpatch_torch()
    assert torch.equal(_service.torch_load(path)["w"], torch.ones(8))


_KILLED_MID_WRITE = """
import os, sys, torch
import tce
from tce.core import _knobs
path = sys.argv[1]
with _knobs.override(socket=sys.argv[2], on_unavailable="fallback"):
    tce.save({"w": torch.ones(16 << 20)}, path)  # 64 MiB, written directly: the server is down
"""


def test_a_fallback_killed_mid_write_leaves_the_old_file_intact(tmp_path):
    """No server: tce.save writes with torch.save itself. A SIGKILL at any
    moment of that write leaves the durable previous version untouched."""
    path = tmp_path / "model.pt"
    torch.save({"w": torch.zeros(4)}, path)
    before = path.read_bytes()
    child = subprocess.Popen([sys.executable, "-c", _KILLED_MID_WRITE, str(path),
                              str(tmp_path / "no-server.sock")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def temp_growing():
            temps = [p / "model.pt" for p in tmp_path.iterdir() if p.name.startswith(".tce-save-")]
            return any(t.exists() and t.stat().st_size > (8 << 20) for t in temps)
        until(temp_growing, timeout=120, what="the fallback's temp file to grow")
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert path.read_bytes() == before
    assert torch.equal(torch.load(path)["w"], torch.zeros(4))
    assert not (tmp_path / ".model.pt").exists()


_FALLBACK_MODES = """
import os, sys, torch
import tce
from tce.core import _knobs
os.umask(0o027)
with _knobs.override(socket=sys.argv[3], on_unavailable="fallback"):
    tce.save({"w": torch.ones(4)}, sys.argv[1])
    tce.save({"w": torch.ones(4)}, sys.argv[2])
"""


def test_a_fallback_keeps_the_mode_and_honours_the_umask(tmp_path):
    existing, new = tmp_path / "existing.pt", tmp_path / "new.pt"
    existing.write_bytes(b"an older checkpoint")
    os.chmod(existing, 0o600)
    subprocess.run([sys.executable, "-c", _FALLBACK_MODES, str(existing), str(new),
                    str(tmp_path / "no-server.sock")], check=True, timeout=120)
    assert existing.stat().st_mode & 0o7777 == 0o600
    assert new.stat().st_mode & 0o7777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing.pt", "new.pt"]  # no temp left


def test_a_fallback_into_a_missing_directory_creates_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(_service, "_warned_fallback", False)  # the first fallback warns
    path = tmp_path / "nope" / "model.pt"
    with _knobs.override(socket=str(tmp_path / "no-server.sock"), on_unavailable="fallback"):
        with pytest.warns(RuntimeWarning):
            with pytest.raises(FileNotFoundError) as e:
                tce.save({"w": torch.ones(2)}, path)
    assert isinstance(e.value, RuntimeError)  # as torch.save's own error is
    assert not (tmp_path / "nope").exists()


_READ_ELSEWHERE = """
import os, sys, zipfile, torch
path = sys.argv[1]
with zipfile.ZipFile(path) as z:
    assert z.testzip() is None
print(os.path.getsize(path), float(torch.load(path)["w"].sum()))
"""


def test_a_durable_patched_save_is_on_storage_when_it_returns(server, storage, job):
    path = storage / "model.pt"
    with _knobs.override(socket=server.socket, job=job, on_unavailable="raise"):
        tce.patch_torch([storage], durable=True)
        for step in range(3):
            torch.save({"w": torch.full((1 << 18,), float(step))}, path)
            # Right away, another process with plain torch and zipfile sees this step's file.
            out = subprocess.run([sys.executable, "-c", _READ_ELSEWHERE, str(path)],
                                 capture_output=True, text=True, check=True, timeout=120).stdout
            size, total = out.split()
            assert int(size) == path.stat().st_size and float(total) == float(step) * (1 << 18)
        tce.patch_torch([storage])  # durable=False again: returns with the bytes in the cache
        hold = Hold(server.socket, job, storage)
        try:
            torch.save({"w": torch.full((1 << 18,), 9.0)}, path)
            assert float(torch.load(path)["w"][0]) == 9.0  # through the cache
            with zipfile.ZipFile(path) as z:  # storage still holds the previous step
                assert z.testzip() is None
            assert float(_service.torch_load(path)["w"][0]) == 2.0
        finally:
            hold.release()
        tce.wait(path)
        assert float(_service.torch_load(path)["w"][0]) == 9.0


def test_wait_for_paths_the_cache_does_not_hold(server, storage, job, tmp_path):
    direct = storage / "direct.pt"
    torch.save({"w": torch.ones(2)}, direct)  # written without TCE
    with _knobs.override(socket=server.socket, job=job, on_unavailable="raise"):
        tce.wait([direct])  # on storage: settled
        with pytest.raises(FileNotFoundError):
            tce.wait([storage / "never-saved.pt"])
        step = storage / "step"
        step.mkdir()
        hold = Hold(server.socket, job, storage)
        try:
            tce.save({"w": torch.ones(2)}, step / "x.pt")
            shutil.rmtree(step)
        finally:
            hold.release()
        tce.wait([step / "x.pt"])  # discarded: settled, not an error
        tce.wait()  # nor for everything this process saved
        api.close()
    cli = [sys.executable, "-m", "tce.cli", "--socket", server.socket, "wait"]
    p = subprocess.run([*cli, str(direct), str(step / "x.pt")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert f"durable   {direct} (not in the cache)" in p.stdout
    assert f"discarded {step / 'x.pt'}: " in p.stdout and "was removed" in p.stdout, p.stdout
    p = subprocess.run([*cli, str(storage / "never-saved.pt")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "neither in the cache nor on storage" in p.stderr, p.stderr


class NotAWeight:
    """A global weights_only refuses."""

    def __init__(self, v: int = 3) -> None:
        self.v = v


@pytest.mark.parametrize("env", [{}, {"TORCH_FORCE_WEIGHTS_ONLY_LOAD": "1"},
                                 {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"},
                                 {"TORCH_FORCE_WEIGHTS_ONLY_LOAD": "1", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "yes"}])
def test_weights_only_overrides_warn_and_fail_as_torch_does(server, storage, tmp_path, job, monkeypatch, env):
    """A patched torch.load of a cached file gives plain torch.load's
    warnings (category and text) and errors (type and text), for every
    override and argument combination."""
    obj = {"w": torch.arange(4.0), "x": NotAWeight()}
    cached, plain = storage / "cached.pt", tmp_path / "plain.pt"
    _service.torch_save(obj, plain)
    with _knobs.override(socket=server.socket, job=job, on_unavailable="raise"):
        tce.save(obj, cached)
        tce.patch_torch([storage])
        for k, v in env.items():
            monkeypatch.setenv(k, v)

        def outcome(path, **kw):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    got = torch.load(path, **kw)
                    result = ("ok", type(got["x"]).__name__, float(got["w"].sum()))
                except Exception as e:  # noqa: BLE001 (the outcome under test)
                    result = ("error", type(e).__name__, str(e))
            return result, [(w.category.__name__, str(w.message)) for w in caught]

        for kw in ({}, {"weights_only": True}, {"weights_only": False},
                   {"pickle_module": pickle}, {"weights_only": True, "pickle_module": pickle},
                   {"weights_only": False, "encoding": "latin1"}):
            assert tce.cached(cached)
            assert outcome(cached, **kw) == outcome(plain, **kw), kw


@pytest.mark.parametrize("how", ["argument", "config"])
@pytest.mark.parametrize("shared", [False, True])
def test_mmap_loads_share_writes_as_torch_does(server, storage, tmp_path, job, shared, how):
    """torch.load(mmap=True): with MAP_PRIVATE (torch's default) a write to a
    loaded tensor is seen neither by the next load nor in the file; with
    MAP_SHARED it is seen by both. A patched load of a cached file does the
    same as plain torch on a file of the same bytes, whether mmap is asked
    for by argument or by torch's config default."""
    import mmap as mm

    from torch.utils.serialization import config

    kw = {"mmap": True} if how == "argument" else {}

    obj = {"w": torch.zeros(1024)}
    cached, plain = storage / "cached.pt", tmp_path / "plain.pt"
    _service.torch_save(obj, plain)
    try:
        torch.serialization.set_default_mmap_options(mm.MAP_SHARED if shared else mm.MAP_PRIVATE)
        config.load.mmap = how == "config"
        with _knobs.override(socket=server.socket, job=job, on_unavailable="raise"):
            tce.save(obj, cached)
            tce.wait()  # both files on disk, so each can be read there too
            tce.patch_torch([storage])
            seen = {}
            for name, path in (("tce", cached), ("torch", plain)):
                t = torch.load(path, weights_only=True, **kw)["w"]
                t[0] = 42.0
                del t
                again = float(torch.load(path, weights_only=True, **kw)["w"][0])
                on_disk = float(_service.torch_load(path, weights_only=True)["w"][0])
                seen[name] = (again, on_disk)
        assert seen["tce"] == seen["torch"] == ((42.0, 42.0) if shared else (0.0, 0.0)), seen
    finally:
        config.load.mmap = False
        torch.serialization.set_default_mmap_options(mm.MAP_PRIVATE)


def test_a_shared_mapping_needs_storage(tmp_path, job):
    import mmap as mm

    s = LocalServer(memory_budget="64MiB").start()  # memory only
    try:
        torch.serialization.set_default_mmap_options(mm.MAP_SHARED)
        with _knobs.override(socket=s.socket, job=job, on_unavailable="raise"):
            tce.save({"w": torch.zeros(4)}, tmp_path / "x.pt")
            with pytest.raises(tce.FailedPreconditionError, match="MAP_SHARED needs the file on storage"):
                tce.load(tmp_path / "x.pt", mmap=True)
            api.close()
    finally:
        torch.serialization.set_default_mmap_options(mm.MAP_PRIVATE)
        s.stop()
        s.cleanup()
