"""Metadata in a real MariaDB server that the tests start themselves."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time

import pytest
import torch

import tce
from tce import _service, api
from tce.core import _knobs
from tce.tools._server import LocalServer
from tce.v1 import tce_pb2 as pb
from helpers import Blocker, until, wait_metadata_written
from tce.tools._ports import free_port

pytestmark = pytest.mark.mysql


@pytest.fixture(scope="module")
def mariadb():
    if not shutil.which("mariadbd"):
        pytest.skip("mariadbd is not installed (make setup installs mariadb-server)")
    from mariadb_server import MariaDB

    db = MariaDB()
    yield db
    db.cleanup()


def _server(storage, mariadb):
    return LocalServer(memory_budget="256MiB", storage_roots=[str(storage)],
                       extra_args=["--metadata-url", mariadb.url]).start()


def _rows(mariadb):
    out = mariadb.sql("SELECT path, tag, `rank`, state FROM tce.files ORDER BY path")
    return [tuple(line.split("\t")) for line in out.splitlines()]


def test_rows_restart_and_ls(tmp_path, mariadb):
    storage = tmp_path / "s"
    storage.mkdir()
    s = _server(storage, mariadb)
    try:
        with _knobs.override(socket=s.socket, on_unavailable="raise", job="mysql-job"):
            for step in (1, 2):
                tce.save({"w": torch.full((100,), float(step))}, storage / f"step{step}.pt",
                         tag=f"step{step}", rank=1)
            tce.wait()
            st = tce.status()
            assert st["metadata_healthy"]
            assert st["metadata_url"] == mariadb.url.replace(mariadb.password, "***")  # never leaked
            # The writer is asynchronous: the rows may exist, still CACHED,
            # before the PERSISTED changes tce.wait() saw are written.
            wait_metadata_written()
            assert _rows(mariadb) == [(str(storage / "step1.pt"), "step1", "1", "PERSISTED"),
                                      (str(storage / "step2.pt"), "step2", "1", "PERSISTED")]
            assert mariadb.sql("SELECT COUNT(*) FROM tce.schema_version").strip() == "1"
            api.close()
            s.kill()  # the schema is applied again on an existing database, and re-indexed
            s.start()
            states = {f.path: pb.FileState.Name(f.state)
                      for f in _service.client().list("mysql-job")}
            assert set(states.values()) == {"FILE_STATE_EVICTED"} and len(states) == 2
            assert tce.load(storage / "step2.pt", weights_only=True)["w"][0].item() == 2.0
            assert mariadb.sql("SELECT COUNT(*) FROM tce.schema_version").strip() == "1"
            # tce ls reads the database while the server runs: the re-index
            # (EVICTED) and the load (step2 PERSISTED again) are written
            # asynchronously.
            wait_metadata_written()
            api.close()
        p = subprocess.run(["python3", "-m", "tce.cli", "ls", "--metadata", mariadb.url,
                            "--job", "mysql-job", "--json"], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        assert [(r["tag"], r["state"]) for r in json.loads(p.stdout)] == [
            ("step1", "EVICTED"), ("step2", "PERSISTED")]  # the load read step2 back into the cache
    finally:
        s.stop()
        s.cleanup()


def test_database_outage_in_the_middle_of_saves(tmp_path, mariadb):
    storage = tmp_path / "s"
    storage.mkdir()
    s = _server(storage, mariadb)
    try:
        with _knobs.override(socket=s.socket, on_unavailable="raise", job="outage-job"):
            tce.save({"w": torch.ones(10)}, storage / "before.pt", tag="a")
            tce.wait()
            mariadb.stop()  # the database goes away...
            for i in range(3):  # ...and no save fails
                tce.save({"w": torch.full((10,), float(i))}, storage / f"during{i}.pt", tag="b")
            tce.wait()
            assert tce.load(storage / "during2.pt", weights_only=True)["w"][0].item() == 2.0
            deadline = time.monotonic() + 30
            while tce.status()["metadata_healthy"] and time.monotonic() < deadline:
                time.sleep(0.2)
            st = tce.status()
            assert not st["metadata_healthy"] and int(st["metadata_queue"]) >= 3
            assert "mysql" in st["metadata_error"]
            mariadb.start()  # it comes back: the queued state lands
            deadline = time.monotonic() + 60
            while not tce.status()["metadata_healthy"] and time.monotonic() < deadline:
                time.sleep(0.2)
            assert tce.status()["metadata_healthy"]
            rows = {r[0]: r[3] for r in _rows(mariadb) if "/during" in r[0] or "/before" in r[0]}
            assert rows == {str(storage / "before.pt"): "PERSISTED",
                            **{str(storage / f"during{i}.pt"): "PERSISTED" for i in range(3)}}
            api.close()
    finally:
        s.stop()
        s.cleanup()


def test_a_newer_schema_is_refused(tmp_path, mariadb):
    mariadb.sql("CREATE DATABASE future; USE future; "
                "CREATE TABLE schema_version (version INT NOT NULL); "
                "INSERT INTO schema_version VALUES (99); "
                f"GRANT ALL ON future.* TO '{mariadb.user}'@'127.0.0.1';")
    url = mariadb.url.rsplit("/", 1)[0] + "/future"
    s = LocalServer(memory_budget="16MiB", extra_args=["--metadata-url", url])
    with pytest.raises(RuntimeError, match="schema version 99 is newer than this server's 6"):
        s.start()
    assert s.proc.returncode == 2
    s.cleanup()


def _tag(job, tag, files):
    return pb.TagInfo(job=job, tag=tag, world_size=2,
                      files=[pb.TagFile(rank=r, path=p, size=n) for r, p, n in files])


def test_complete_tags_survive_a_restart(tmp_path, mariadb):
    storage = tmp_path / "s"
    storage.mkdir()
    s = _server(storage, mariadb)
    try:
        with _knobs.override(socket=s.socket, on_unavailable="raise", job="tag-job"):
            c = _service.client()
            odd = str(storage / "we ird: 3 name 3:x.pt")  # the column format's separators
            for name in ("a", "b"):  # a tag names files its job holds (the odd one: another node's rank)
                tce.save({"w": torch.ones(1)}, storage / f"{name}.pt")
            c.commit_tag(_tag("tag-job", "global_step2", [(1, odd, 7), (0, str(storage / "a.pt"), 5)]))
            c.commit_tag(_tag("tag-job", "global_step4", [(0, str(storage / "b.pt"), 9)]))
            wait_metadata_written()
            assert mariadb.sql("SELECT tag, world_size, version FROM tce.tags WHERE job='tag-job' "
                               "ORDER BY complete_ns").split() == ["global_step2", "2", "1",
                                                                  "global_step4", "2", "2"]
            api.close()
            s.kill()
            s.start()
            tags = _service.client().list_tags("tag-job")
            assert [t.tag for t in tags] == ["global_step2", "global_step4"]
            assert [t.version for t in tags] == [1, 2]  # published versions keep their numbers
            assert [(f.rank, f.path, f.size) for f in tags[0].files] == [
                (0, str(storage / "a.pt"), 5), (1, odd, 7)]
            api.close()
    finally:
        s.stop()
        s.cleanup()


def test_a_version_1_schema_is_migrated(tmp_path, mariadb):
    mariadb.sql(
        "CREATE DATABASE v1db; USE v1db; "
        "CREATE TABLE schema_version (version INT NOT NULL); INSERT INTO schema_version VALUES (1); "
        "CREATE TABLE jobs (job VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PRIMARY KEY, "
        "first_seen_ns BIGINT NOT NULL); "
        "CREATE TABLE tags (job VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, "
        "tag VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, first_commit_ns BIGINT NOT NULL, "
        "PRIMARY KEY (job, tag)); INSERT INTO tags VALUES ('old-job', 'step1', 5); "
        f"GRANT ALL ON v1db.* TO '{mariadb.user}'@'127.0.0.1';")
    url = mariadb.url.rsplit("/", 1)[0] + "/v1db"
    for _ in range(2):  # migrating, then starting again on the migrated database
        s = LocalServer(memory_budget="16MiB", extra_args=["--metadata-url", url]).start()
        try:
            with _knobs.override(socket=s.socket, on_unavailable="raise", job="old-job"):
                tce.save({"w": torch.ones(1)}, "/x/a.pt")  # memory only: any path; a tag names a file held
                c = _service.client()
                c.commit_tag(_tag("old-job", "step1", [(0, "/x/a.pt", 1)]))
                wait_metadata_written()
                api.close()
        finally:
            s.stop()
            s.cleanup()
        assert mariadb.sql("SELECT version FROM v1db.schema_version").split() == ["6"]
        assert mariadb.sql("SHOW TABLES FROM v1db LIKE 'rings'").split() == ["rings"]  # v3
        # v4: rows carry their server; the row from before belongs to none and is kept.
        assert mariadb.sql("SELECT first_commit_ns, world_size FROM v1db.tags WHERE server = ''"
                           ).split() == ["5", "0"]
        assert mariadb.sql("SELECT DISTINCT world_size FROM v1db.tags WHERE server != ''").split() == ["2"]


def test_a_server_rejoins_its_ring_from_mysql(tmp_path, mariadb):
    """Node 0's server keeps its metadata in MariaDB. It dies (SIGKILL) and
    comes back on the same peer endpoint: the ring it finds in MariaDB brings
    its file back from node 1 bitwise (there is no storage)."""
    ports = [free_port(), free_port()]
    endpoints = [f"127.0.0.1:{p}" for p in ports]

    def start(i):
        meta = mariadb.url if i == 0 else "none"
        return LocalServer(memory_budget="256MiB", socket_path=str(tmp_path / f"n{i}.sock"),
                           extra_args=["--peer-listen", endpoints[i], "--peer-token", "t",
                                       "--peer-timeout-ms", "2000", "--metadata-url", meta]).start()

    servers = [start(0), start(1)]
    x = {"w": torch.randn(1 << 16)}
    try:
        for rank, s in enumerate(servers):
            with _knobs.override(socket=s.socket):
                _service.client().set_ring("mysql-ring", rank, endpoints)
                api.close()
        with _knobs.override(socket=servers[0].socket, job="mysql-ring", on_unavailable="raise"):
            tce.save(x, "/ckpt/m/rank0.pt", tag="t", rank=0)
            c = _service.client()
            deadline = time.monotonic() + 30
            while not c.list("mysql-ring")[0].backup_holder:
                assert time.monotonic() < deadline, "no backup"
                time.sleep(0.05)
            wait_metadata_written()
            api.close()
        rows = mariadb.sql("SELECT job, node_rank, endpoints FROM tce.rings WHERE job = 'mysql-ring'")
        assert rows.split("\t")[:2] == ["mysql-ring", "0"] and endpoints[1] in rows, rows
        servers[0].kill()
        servers[0] = start(0)
        with _knobs.override(socket=servers[0].socket, job="mysql-ring", on_unavailable="raise"):
            c = _service.client()
            deadline = time.monotonic() + 30
            while not [f for f in c.list("mysql-ring") if f.state == pb.FILE_STATE_BACKED_UP]:
                assert time.monotonic() < deadline, "not recovered"
                time.sleep(0.05)
            out = tce.load("/ckpt/m/rank0.pt", weights_only=True)
            assert torch.equal(out["w"], x["w"])
            assert int(tce.status()["recovered_files"]) == 1
            api.close()
        assert "rejoining the ring of job=mysql-ring recorded in metadata" in servers[0].log()
    finally:
        for s in servers:
            s.stop()
            s.cleanup()


def test_damaged_rows_are_skipped_not_fatal(tmp_path, mariadb):
    """MySQL hands every column back as text: a damaged value costs its row
    (logged with table and key), never the server's start."""
    storage = tmp_path / "s"
    storage.mkdir()
    s = _server(storage, mariadb)
    try:
        with _knobs.override(socket=s.socket, on_unavailable="raise", job="dmg-job"):
            for name in ("a", "b", "c"):
                tce.save({"w": torch.ones(3)}, storage / f"{name}.pt", tag="t")
            c = _service.client()
            c.commit_tag(_tag("dmg-job", "good", [(0, str(storage / "a.pt"), 1)]))
            c.commit_tag(_tag("dmg-job", "bad", [(0, str(storage / "b.pt"), 1)]))
            wait_metadata_written()
            api.close()
        assert s.stop() == 0
        mariadb.sql(f"UPDATE tce.files SET records = 'x:y' WHERE path = '{storage / 'b.pt'}'; "
                    f"UPDATE tce.files SET `rank` = -3 WHERE path = '{storage / 'c.pt'}'; "
                    "UPDATE tce.tags SET files = '0 1 99:/short\n' WHERE job = 'dmg-job' AND tag = 'bad'")
        s.start()
        with _knobs.override(socket=s.socket, job="dmg-job"):
            c = _service.client()
            assert [f.path for f in c.list(job="dmg-job")] == [str(storage / "a.pt")]
            assert [t.tag for t in c.list_tags("dmg-job")] == ["good"]
            api.close()
        log = s.log()
        assert f"skipping a damaged row of table files (job=dmg-job path={storage / 'b.pt'}): records:" in log
        assert f"skipping a damaged row of table files (job=dmg-job path={storage / 'c.pt'}): rank:" in log
        assert "skipping a damaged row of table tags (job=dmg-job tag=bad): files:" in log
    finally:
        s.stop()
        s.cleanup()


def test_servers_sharing_mysql_touch_only_their_own_rows(tmp_path, mariadb):
    """Two servers record into one database. Restarting B must leave A's
    in-flight file alone: not FAILED, not listed by B, its row A's."""
    sa, sb = tmp_path / "a", tmp_path / "b"
    for d in (sa, sb):
        d.mkdir()
    blocker = Blocker(sa / "blocked" / "x.pt")  # A's file stays CACHED (in flight)
    mariadb.sql(f"CREATE DATABASE shareddb; GRANT ALL ON shareddb.* TO '{mariadb.user}'@'127.0.0.1';")
    url = mariadb.url.rsplit("/", 1)[0] + "/shareddb"

    def server(storage, name):
        return LocalServer(memory_budget="64MiB", storage_roots=[str(storage)],
                           socket_path=str(tmp_path / f"{name}.sock"),
                           extra_args=["--metadata-url", url, "--persist-retries", "100",
                                       "--persist-backoff-ms", "50"]).start()

    a, b = server(sa, "a"), server(sb, "b")
    inflight = sa / "blocked" / "x.pt"
    try:
        with _knobs.override(socket=a.socket, on_unavailable="raise", job="shared"):
            tce.save({"w": torch.ones(4)}, inflight, tag="t")
            _service.client().commit_tag(_tag("shared", "t", [(0, str(inflight), 1)]))
            wait_metadata_written()
            api.close()
        with _knobs.override(socket=b.socket, on_unavailable="raise", job="shared"):
            tce.save({"w": torch.zeros(4)}, sb / "y.pt", tag="t")
            tce.wait()
            wait_metadata_written()
            api.close()
        assert b.stop() == 0
        b.start()
        with _knobs.override(socket=b.socket, job="shared"):
            c = _service.client()
            assert [(f.path, f.state) for f in c.list("shared")] == [
                (str(sb / "y.pt"), pb.FILE_STATE_EVICTED)]
            assert [t.tag for t in c.list_tags("shared")] == []  # A's tag is A's
            api.close()
        with _knobs.override(socket=a.socket, job="shared"):
            c = _service.client()
            assert [(f.path, f.state) for f in c.list("shared")] == [(str(inflight), pb.FILE_STATE_CACHED)]
            api.close()
        # B's restart re-indexed y.pt as EVICTED; its metadata writer records
        # that asynchronously.
        expected = [[f"{socket.gethostname()}:{a.socket}", "CACHED"],
                    [f"{socket.gethostname()}:{b.socket}", "EVICTED"]]
        until(lambda: [r.split("\t") for r in mariadb.sql(
            "SELECT server, state FROM shareddb.files ORDER BY path").splitlines()] == expected,
            what="each server's own rows as it left them")
        assert "lost: the server restarted" not in a.log() + b.log()
    finally:
        for s in (a, b):
            s.stop()
            s.cleanup()
        blocker.release()
