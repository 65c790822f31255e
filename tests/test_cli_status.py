"""`tce status` (human output) describes each storage root, directory and
object storage alike, and the persistence and object storage counters,
against real servers and moto's S3 server."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid

import pytest
import torch

import tce
from tce import _service, api, client, weights
from tce.core import _knobs
from tce.tools._moto import credentials_env
from tce.tools._ports import free_port
from tce.tools._server import LocalServer
from helpers import until
from hostile_peer import HoldingPeer
from s3_helpers import FaultProxy
from test_ring import TOKEN, _ring_server, _status as _ring_status, _stop

OFF = "persist   off (no storage_roots): files live in memory only"


def _status(socket: str) -> tuple[str, dict]:
    """`tce status` and `tce status --json` of the server on `socket`."""
    cmd = [sys.executable, "-m", "tce.cli", "--socket", socket, "status"]
    human = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert human.returncode == 0, human.stderr
    st = subprocess.run(cmd + ["--json"], capture_output=True, text=True, timeout=60)
    assert st.returncode == 0, st.stderr
    return human.stdout, json.loads(st.stdout)


class _Server:
    """A tce-server with these storage roots (an object root's S3 requests
    go through `proxy`), and this process's client pointed at it."""

    def __init__(self, roots: list[str], proxy: FaultProxy | None = None, extra: list[str] | None = None) -> None:
        extra = ["--memory-backing", "4k", "--persist-backoff-ms", "10", *(extra or [])]
        if proxy is not None:
            extra += ["--s3-endpoint", proxy.endpoint, "--s3-path-style", "true", "--s3-backoff-ms", "10"]
        self.server = LocalServer(memory_budget="256MiB", storage_roots=roots, extra_args=extra,
                                  env={**os.environ, **credentials_env()})

    def __enter__(self) -> LocalServer:
        self.server.start()
        self._knobs = _knobs.override(socket=self.server.socket, job=f"status-{uuid.uuid4().hex[:8]}",
                                      on_unavailable="raise")
        self._knobs.__enter__()
        return self.server

    def __exit__(self, *exc) -> None:
        api.close()
        self._knobs.__exit__(*exc)
        code = self.server.stop()
        log = self.server.log()
        self.server.cleanup()
        assert code == 0, log


def _save(path: str) -> int:
    """Saves a small state dict at `path` and waits until it is durable; its size."""
    tce.save({"w": torch.arange(1000)}, path)
    tce.wait([path])
    return client.lookup(path).size


def test_a_server_without_roots_says_persistence_is_off(server):
    human, _ = _status(server.socket)
    assert OFF + "\n" in human


@pytest.mark.s3
def test_a_server_with_an_object_root_only_persists_and_says_so(tmp_path, s3_bucket, fault_proxy, moto):
    root = str(tmp_path / "ckpt")  # an object root has no directory
    with _Server([f"{root}=s3://{s3_bucket}/run1"], fault_proxy) as server:
        fault_proxy.throttle(1)  # the first request is answered 503 SlowDown: retried
        size = _save(f"{root}/a.pt")
        buf = io.BytesIO()  # another writer's object: a load fetches it into the cache
        torch.save({"w": torch.ones(64)}, buf)
        moto.boto3().put_object(Bucket=s3_bucket, Key="run1/other.pt", Body=buf.getvalue())
        assert torch.equal(tce.load(f"{root}/other.pt", weights_only=True)["w"], torch.ones(64))
        human, st = _status(server.socket)
    assert "persist   off" not in human, human
    assert int(st["persisted_bytes"]) == size and int(st["object_retries"]) == 1
    fetched = len(buf.getvalue())
    assert int(st["object_bytes_fetched"]) == fetched
    assert (f"persist   object root {root}=s3://{s3_bucket}/run1: queue 0 (0 B), 1 written ({_kib(size)}), "
            "0 FAILED, 1 request(s) retried, 0 tag marker(s) held\n"
            f"          all roots: queue 0, 1 written ({_kib(size)}), 0 FAILED, 0 evicted\n"
            f"          all object roots: 1 object(s) fetched ({_kib(fetched)}), 0 ranged read(s), "
            "0 load(s) shared a fetch, 1 request(s) retried, 0 tag marker(s) held, "
            "0 round(s) asking the ring\n") in human, human


def test_a_server_with_a_directory_root_only_shows_no_object_storage(tmp_path):
    root = tmp_path / "ckpt"
    root.mkdir()
    with _Server([str(root)]) as server:
        size = _save(str(root / "a.pt"))
        human, _ = _status(server.socket)
    assert (f"persist   directory root {root}: queue 0 (0 B), 1 written ({_kib(size)}), 0 FAILED\n"
            f"          all roots: queue 0, 1 written ({_kib(size)}), 0 FAILED, 0 evicted\n"
            "ring      ") in human, human


@pytest.mark.s3
def test_a_server_with_both_kinds_of_root_shows_each(tmp_path, s3_bucket, fault_proxy):
    """Each root's own figures: a file held on its way to the bucket is in
    the object root's queue, not the directory root's."""
    disk, bucket_root = tmp_path / "disk", str(tmp_path / "ckpt")
    disk.mkdir()
    with _Server([f"{bucket_root}=s3://{s3_bucket}/run1", str(disk)], fault_proxy) as server:
        a, b = _save(str(disk / "a.pt")), _save(f"{bucket_root}/b.pt")
        fault_proxy.hold(lambda q: q.kind == "PutObject")
        tce.save({"w": torch.arange(1000)}, f"{bucket_root}/c.pt")
        fault_proxy.wait_held()
        c = client.lookup(f"{bucket_root}/c.pt").size
        human, st = _status(server.socket)
        fault_proxy.release()
        tce.wait([f"{bucket_root}/c.pt"])
    assert [(r["root"], r["url"], int(r["queued_files"]), int(r["written_files"])) for r in st["roots"]] == [
        (str(disk), "", 0, 1), (bucket_root, f"s3://{s3_bucket}/run1", 1, 1)]
    assert (f"persist   directory root {disk}: queue 0 (0 B), 1 written ({_kib(a)}), 0 FAILED\n"
            f"          object root {bucket_root}=s3://{s3_bucket}/run1: queue 1 ({_kib(c)}), "
            f"1 written ({_kib(b)}), 0 FAILED, 0 request(s) retried, 0 tag marker(s) held\n"
            f"          all roots: queue 1, 2 written ({_kib(a + b)}), 0 FAILED, 0 evicted\n"
            "          all object roots: 0 object(s) fetched (0 B), 0 ranged read(s), "
            "0 load(s) shared a fetch, 0 request(s) retried, 0 tag marker(s) held, "
            "0 round(s) asking the ring\n") in human, human


def _kib(n: int) -> str:
    """`n` bytes as `tce status` prints a size of 1 KiB to 1 MiB."""
    assert 1024 <= n < 1 << 20, n
    return f"{n / 1024:.1f} KiB"



@pytest.mark.s3
def test_a_running_prefetch_is_shown_with_its_progress_until_it_ends(tmp_path, s3_bucket, fault_proxy, moto):
    """A prefetch of a tag of four 64 KiB objects on a node of a ring of
    two: this node's share is two of them. The second one's GET is held at
    the S3 endpoint: status shows the prefetch at 1/2 files, 64 KiB of 128,
    in the human and the JSON output; released, the prefetch ends and its
    line goes."""
    root = str(tmp_path / "ckpt")
    for i in range(4):  # equal sizes: the plan gives shard0 and shard2 to node 0
        moto.boto3().put_object(Bucket=s3_bucket, Key=f"run1/step200/shard{i}.pt", Body=bytes([i]) * 65536)
    peer = ["--peer-listen", f"127.0.0.1:{free_port()}", "--peer-token", "t"]
    with _Server([f"{root}=s3://{s3_bucket}/run1"], fault_proxy, extra=peer) as server:
        job = _knobs.get("job")
        endpoint = api.status()["peer_endpoint"]
        _service.client().set_ring(job, 0, [endpoint, f"127.0.0.1:{free_port()}"])  # node 1: never asked
        fault_proxy.hold(lambda q: q.kind == "GetObject" and q.path.endswith("/shard2.pt"))
        assert client.prefetch(f"{root}/step200") is True
        fault_proxy.wait_held()
        until(lambda: [int(o.get("files_done", 0)) for o in _status(server.socket)[1].get("operations", [])] == [1],
              what="the prefetch at its second file")
        human, st = _status(server.socket)
        [op] = st["operations"]
        assert (op["kind"], op["job"], op["tag"], int(op["files_total"]), int(op["bytes_done"]),
                int(op["bytes_total"])) == ("prefetch", job, "step200", 2, 65536, 131072), op
        assert f"running   prefetch job={job} tag=step200: 1/2 files, 64.0 KiB/128.0 KiB, " in human, human
        fault_proxy.release()
        until(lambda: not _status(server.socket)[1].get("operations"), what="the prefetch to end")
        human, _ = _status(server.socket)
        assert "running   " not in human, human
        assert client.lookup(f"{root}/step200/shard2.pt").size == 65536  # it was read, into the cache


def test_readers_behind_the_newest_version_are_shown_with_their_lag(tmp_path):
    """A reader holds version 1 of a job while version 2 is published:
    status shows the job's readers one version behind; once the reader
    closes, the line goes."""
    root = tmp_path / "ckpt"
    root.mkdir()
    with _Server([str(root)]) as server:
        job = _knobs.get("job")
        tce.save({"w": torch.ones(8)}, str(root / "v1.pt"), tag="step1")
        assert weights.publish("step1").version == 1
        reader = weights.open()
        tce.save({"w": torch.ones(8)}, str(root / "v2.pt"), tag="step2")
        assert weights.publish("step2").version == 2
        human, st = _status(server.socket)
        assert [(r["job"], int(r["newest_version"]), int(r["oldest_leased"]), int(r["leases"]))
                for r in st["version_readers"]] == [(job, 2, 1, 1)]
        assert f"readers   job {job}: 1 lease(s), oldest on version 1, newest 2 (1 behind)\n" in human, human
        reader.close()
        human, st = _status(server.socket)
        assert st["version_readers"] == [] and "readers   " not in human, human


def test_a_running_ring_restore_is_shown_with_its_progress_until_it_ends(tmp_path):
    """A fresh node of a ring recovers its files from its successor, a peer
    (test code) that lists two and holds its answer for the second: status
    shows the restore from that peer at 1/2 files until it answers, then
    nothing."""
    roots = tmp_path / "roots"
    roots.mkdir()
    paths = [str(roots / "a.pt"), str(roots / "b.pt")]
    peer = HoldingPeer(TOKEN, "ring-job", paths, held=paths[1], data=b"x" * 4096)
    server = _ring_server(tmp_path, "tcp", "a", storage=roots,
                          extra=["--ring-streams", "1", "--peer-timeout-ms", "300000"])
    try:
        endpoint = _ring_status(server)["peer_endpoint"]
        with _knobs.override(socket=server.socket):  # a fresh node 0: it recovers from node 1
            _service.client().set_ring("ring-job", 0, [endpoint, peer.endpoint])
            api.close()
        until(lambda: [int(o.get("files_done", 0)) for o in _ring_status(server).get("operations", [])] == [1],
              what="the restore at its second file")
        [op] = _ring_status(server)["operations"]
        assert (op["kind"], op["job"], op["from"], int(op["files_total"]), int(op["bytes_total"])) == \
            ("ring restore", "ring-job", peer.endpoint, 2, 8192), op
        peer.release.set()
        until(lambda: not _ring_status(server).get("operations"), what="the restore to end")
    finally:
        peer.release.set()
        peer.close()
        _stop(server)
