"""The metadata database against hostile input, damage and deletion: a bad
request or a damaged row costs that request or row, never the node."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
from pathlib import Path

import pytest
import torch

import tce
from tce import api
from tce.core import _knobs
from tce.core._client import Client
from tce.tools._server import LocalServer
from tce.errors import TCEError
from tce.v1 import tce_pb2 as pb
from helpers import assert_same, until, wait_metadata_written


@pytest.fixture
def node(tmp_path):
    """A server with storage and its SQLite metadata; restartable."""
    storage = tmp_path / "s"
    storage.mkdir()
    s = LocalServer(memory_budget="64MiB", storage_roots=[str(storage)],
                    state_dir=str(tmp_path / "state"), extra_args=["--metrics-listen", "127.0.0.1:0"])
    s.start()
    yield s, storage
    api.close()
    s.stop()
    s.cleanup()


def _restart(s: LocalServer) -> None:
    api.close()
    assert s.stop() == 0, s.log()
    s.start()


def _save(s: LocalServer, path: Path, value: int, tag: str = "t1") -> None:
    with _knobs.override(socket=s.socket, on_unavailable="raise", job="meta"):
        tce.save({"x": torch.full((4,), value)}, path, tag=tag)
        wait_metadata_written()


def _paths(s: LocalServer) -> list[str]:
    c = Client(s.socket, rpc_timeout=10)
    try:
        return sorted(f.path for f in c.list(job="meta"))
    finally:
        c.close()


def test_nul_in_a_tag_path_is_refused_and_the_node_restarts(node):
    s, storage = node
    good = storage / "good.pt"
    _save(s, good, 1)
    c = Client(s.socket, rpc_timeout=10)
    bad = pb.TagInfo(job="meta", tag="t1", world_size=1,
                     files=[pb.TagFile(rank=0, path=str(storage / "a\x00b.pt"), size=1)])
    with pytest.raises(TCEError) as ei:
        c.commit_tag(bad)
    assert ei.value.code == "INVALID_ARGUMENT"
    assert ei.value.message == "tag.files[0].path: contains NUL"
    c.commit_tag(pb.TagInfo(job="meta", tag="t1", world_size=1,
                            files=[pb.TagFile(rank=0, path=str(good), size=c.list(job="meta")[0].size)]))
    c.close()
    with _knobs.override(socket=s.socket):
        wait_metadata_written()
    for _ in range(2):  # every later start works, not only the first
        _restart(s)
        c = Client(s.socket, rpc_timeout=10)
        assert [t.tag for t in c.list_tags("meta")] == ["t1"]
        assert [f.path for f in c.list_tags("meta")[0].files] == [str(good)]
        c.close()
        assert _paths(s) == [str(good)]


def test_a_damaged_records_value_costs_its_row_only(node):
    s, storage = node
    for name in ("a", "b", "c"):
        _save(s, storage / f"{name}.pt", ord(name))
    api.close()
    assert s.stop() == 0
    db = sqlite3.connect(Path(s.state_dir) / "tce.db")
    with db:
        n = db.execute("UPDATE files SET records = 'not-a-number:xyz' WHERE path = ?",
                       (str(storage / "b.pt"),)).rowcount
        db.execute("UPDATE files SET version = 'seventeen' WHERE path = ?", (str(storage / "c.pt"),))
    db.close()
    assert n == 1
    s.start()
    assert _paths(s) == [str(storage / "a.pt")]
    log = s.log()
    assert (f"ERROR meta: skipping a damaged row of table files (job=meta path={storage / 'b.pt'}): "
            "records: record 0: bad name length") in log, log
    assert f"skipping a damaged row of table files (job=meta path={storage / 'c.pt'}): version" in log
    # The node works: saves and loads, and a damaged file is still on storage.
    _save(s, storage / "d.pt", 4)
    with _knobs.override(socket=s.socket, job="meta"):
        assert torch.equal(tce.load(storage / "b.pt")["x"], torch.full((4,), ord("b")))
        assert torch.equal(tce.load(storage / "d.pt")["x"], torch.full((4,), 4))


def _save_tagged(s: LocalServer, storage: Path) -> list[str]:
    paths = [storage / "r0.pt", storage / "r1.pt"]
    for i, p in enumerate(paths):
        _save(s, p, i, tag="step9")
    c = Client(s.socket, rpc_timeout=10)
    c.commit_tag(pb.TagInfo(job="meta", tag="step9", world_size=1, files=[
        pb.TagFile(rank=0, path=f.path, size=f.size) for f in c.list(job="meta", tag="step9")]))
    c.close()
    with _knobs.override(socket=s.socket):
        wait_metadata_written()
    return [str(p) for p in paths]


def _status(s: LocalServer) -> dict:
    with _knobs.override(socket=s.socket):
        return tce.status()


def _until_log(s: LocalServer, text: str, timeout: float = 20.0) -> str:
    from helpers import until

    return until(lambda: text in s.log() and s.log(), timeout, repr(text))


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_lost_database_is_noticed_and_rewritten(node, how):
    s, storage = node
    paths = _save_tagged(s, storage)
    state = Path(s.state_dir)
    if how == "deleted":
        for p in state.glob("tce.db*"):
            p.unlink()
    else:  # an operator copies some other database over it
        other = state / "other.db"
        sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
        os.replace(other, state / "tce.db")
    log = _until_log(s, "metadata store healthy again (the full state is written into the fresh database)")
    assert f"metadata database lost: {state / 'tce.db'} was {how}; writing the full state into a fresh one" in log
    st = _status(s)
    assert st["metadata_healthy"] and f"metadata database lost ({state / 'tce.db'} was {how})" in st["metadata_error"]
    if how == "replaced":
        assert [p.name for p in state.glob("tce.db.replaced-*")], list(state.iterdir())
    _save(s, storage / "after.pt", 7)  # later changes land in the fresh database too
    _restart(s)
    assert _paths(s) == sorted(paths + [str(storage / "after.pt")])
    c = Client(s.socket, rpc_timeout=10)
    assert [t.tag for t in c.list_tags("meta")] == ["step9"]
    c.close()


def _overwrite(db: Path, how: str) -> bytes:
    """Writes over `db` in place, keeping its inode, and returns the bytes
    it then holds: garbage over its first page (`dd conv=notrunc`), or
    another SQLite database copied onto it (`cp other.db tce.db`)."""
    ino = db.stat().st_ino
    if how == "garbage":
        with open(db, "r+b") as f:
            f.write(b"not a database, " * 256)
    else:
        other = db.parent / "other.db"
        sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
        shutil.copyfile(other, db)  # truncates and writes the same inode, as cp does
        other.unlink()
    assert db.stat().st_ino == ino
    return db.read_bytes()


def _metric(s: LocalServer, name: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://{_status(s)['metrics_endpoint']}/metrics", timeout=10) as r:
        return next(line for line in r.read().decode().splitlines() if line.startswith(name + " "))


# How each overwrite reads while the server runs, and at the next start.
_OVERWRITTEN = {
    "garbage": ("was overwritten in place (its header is no longer SQLite's)",
                "is not a SQLite database (sqlite read: file is not a database)"),
    "sqlite": ("was overwritten in place (its header no longer carries TCE's application_id)",
               "is a SQLite database of something else (it has tables, none of them TCE's)"),
}


def _until_untrusted(s: LocalServer) -> dict:
    return until(lambda: (lambda st: not st["metadata_healthy"] and st)(_status(s)), 30,
                 "metadata to be unhealthy")


@pytest.mark.parametrize("how", sorted(_OVERWRITTEN))
def test_a_database_overwritten_in_place_is_left_alone_and_refused_at_start(node, how):
    """Someone writes over tce.db in place while the server runs: the
    server notices, writes nothing more into it, keeps saving, and says what
    to do; a restart refuses the file with the exact commands, and once they
    are followed it starts."""
    s, storage = node
    paths = _save_tagged(s, storage)
    _restart(s)  # the database as a restarted server leaves it: its pages in the file
    with _knobs.override(socket=s.socket):
        wait_metadata_written()
    db = Path(s.state_dir) / "tce.db"
    written = _overwrite(db, how)
    running, at_start = _OVERWRITTEN[how]
    st = _until_untrusted(s)
    assert st["metadata_error"] == (
        f"{db} {running}: nothing more is written to it and changes stay queued; move it aside "
        f"(mv {db} {db}.broken) and the server writes everything it knows into a fresh database")
    assert _metric(s, "tce_metadata_healthy") == "tce_metadata_healthy 0"
    assert re.search(rf"ERROR meta: metadata database untrusted, \d+ change\(s\) queued: {re.escape(f'{db} {running}')}",
                     s.log()), s.log()
    after = {"x": torch.arange(1000, dtype=torch.float64)}
    with _knobs.override(socket=s.socket, on_unavailable="raise", job="meta"):
        tce.save(after, storage / "after.pt", tag="t2")
        tce.wait()
        assert_same(tce.load(storage / "after.pt"), after)
        until(lambda: int(tce.status()["metadata_queue"]) >= 1, what="the change to stay queued")
    assert not _status(s)["metadata_healthy"]
    assert db.read_bytes() == written
    api.close()
    assert s.stop() == 0, s.log()
    assert db.read_bytes() == written  # not even a last checkpoint went into it

    with pytest.raises(RuntimeError):
        s.start()
    assert s.proc.returncode == 2
    assert s.log().rstrip("\n").endswith(
        f"tce-server: metadata_url: FAILED_PRECONDITION: {db} {at_start}; the server does not start on it. "
        f"Move it aside and start again: mv {db} {db}.broken (and mv {db}-wal {db}-wal.broken if it "
        "exists); the server then starts with empty metadata: files on storage still load from there, and "
        "a ring member gets its copies back from its successor once the job tells it the ring"), s.log()
    assert db.read_bytes() == written

    os.rename(db, f"{db}.broken")
    if Path(f"{db}-wal").exists():
        os.rename(f"{db}-wal", f"{db}-wal.broken")
    s.start()
    assert _status(s)["metadata_healthy"]
    assert _paths(s) == []
    with _knobs.override(socket=s.socket, job="meta"):
        for i, p in enumerate(paths):
            assert torch.equal(tce.load(p)["x"], torch.full((4,), i))  # from storage
        assert_same(tce.load(storage / "after.pt"), after)
    assert Path(f"{db}.broken").read_bytes() == written


def test_an_overwritten_database_moved_aside_while_running_is_rewritten(node):
    """Following the advice while the server runs: it writes everything it
    knows into a fresh database, and leaves the moved file as it was."""
    s, storage = node
    paths = _save_tagged(s, storage)
    _restart(s)
    with _knobs.override(socket=s.socket):
        wait_metadata_written()
    db = Path(s.state_dir) / "tce.db"
    written = _overwrite(db, "garbage")
    _until_untrusted(s)
    with _knobs.override(socket=s.socket, on_unavailable="raise", job="meta"):
        tce.save({"x": torch.full((4,), 5)}, storage / "during.pt", tag="t2")
        tce.wait()
    os.rename(db, f"{db}.broken")  # what the error says to do
    log = _until_log(s, "metadata store healthy again (the full state is written into the fresh database)")
    assert f"metadata database lost: {db} was deleted; writing the full state into a fresh one" in log
    assert Path(f"{db}.broken").read_bytes() == written
    _restart(s)
    assert _paths(s) == sorted(paths + [str(storage / "during.pt")])
    c = Client(s.socket, rpc_timeout=10)
    assert [t.tag for t in c.list_tags("meta")] == ["step9"]
    c.close()


def test_no_shm_file_so_no_sigbus(node):
    """SQLite in WAL mode maps tce.db-shm; when that file is truncated under
    it, the next access dies of SIGBUS. With exclusive locking the WAL index
    lives in heap memory and there is no -shm file at all."""
    s, storage = node
    shm = Path(s.state_dir) / "tce.db-shm"
    _save(s, storage / "a.pt", 1)
    if shm.exists():
        os.truncate(shm, 0)  # what killed the server when it had one
    for i in range(3):
        _save(s, storage / f"b{i}.pt", i)
    assert s.proc.poll() is None, s.log()
    assert not shm.exists()
    assert _status(s)["metadata_healthy"]
    _restart(s)
    assert len(_paths(s)) == 4


def test_ls_metadata_of_a_running_server_says_it_is_held(node):
    import subprocess
    import sys

    s, storage = node
    _save(s, storage / "a.pt", 1)
    p = subprocess.run([sys.executable, "-m", "tce.cli", "ls", "--metadata",
                        f"sqlite://{s.state_dir}/tce.db"], capture_output=True, text=True)
    assert p.returncode == 1
    assert p.stderr == (f"tce ls: FAILED_PRECONDITION: {s.state_dir}/tce.db is held by a running "
                        "tce-server; ask the server instead (tce ls without --metadata)\n")


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a loop device (root)")
def test_a_read_only_database_costs_metadata_not_saves(tmp_path):
    """The database files (on a real ext4 on a loop device) become
    immutable (`chattr +i`: not even root may write them) under a running
    server: saves and loads go on, the server says its metadata is
    unhealthy and why; once writable again, what happened meanwhile is
    written, and a restart lists it."""
    import subprocess

    image, state = tmp_path / "state.img", tmp_path / "state"
    state.mkdir()
    subprocess.run(["truncate", "-s", "16M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(state)], check=True)
    storage = tmp_path / "s"
    storage.mkdir()
    s = LocalServer(memory_budget="64MiB", storage_roots=[str(storage)], state_dir=str(state))
    try:
        s.start()
        _save(s, storage / "before.pt", 1)
        frozen = [str(p) for p in [state, *state.glob("tce.db*")]]
        subprocess.run(["chattr", "+i", *frozen], check=True)
        with _knobs.override(socket=s.socket, on_unavailable="raise", job="meta"):
            tce.save({"x": torch.full((4,), 2)}, storage / "during.pt", tag="t2")
            tce.wait()
            assert torch.equal(tce.load(storage / "during.pt")["x"], torch.full((4,), 2))
            from helpers import until

            st = until(lambda: (lambda st: not st["metadata_healthy"] and st)(api.status()),
                       what="metadata to be unhealthy")
            assert st["metadata_error"], st
            subprocess.run(["chattr", "-i", *frozen], check=True)
            until(lambda: api.status()["metadata_healthy"], timeout=30, what="metadata to recover")
            wait_metadata_written()
        _restart(s)
        assert _paths(s) == [str(storage / "before.pt"), str(storage / "during.pt")]
    finally:
        api.close()
        s.stop()
        s.cleanup()
        subprocess.run(["chattr", "-R", "-i", str(state)], check=False)
        subprocess.run(["umount", "-l", str(state)], check=False)
