"""Object storage (S3) as the durable tier, against moto's S3 server on
loopback, with a fault proxy between the tce-server and it (tests/s3_helpers).

Files under ``--storage-roots DIR=s3://BUCKET/PREFIX`` are persisted as
objects holding exactly the file's bytes, multipart above the part size;
loads that miss the cache are fetched from the bucket; coherence compares
ETags; a tag's marker goes last and is deleted first. Faults (throttling,
outages, hung endpoints, lost answers, SIGKILL mid-upload): test_s3_faults.
"""

from __future__ import annotations

import concurrent.futures
import io
import os
import re
import signal
import subprocess
import uuid

import pytest
import torch

import tce
from tce import api, buffers, client, objects
from tce.core import _knobs
from tce.tools._moto import credentials_env
from tce.tools._server import LocalServer
from tce.errors import InvalidArgumentError
from tce.v1 import tce_pb2 as pb
from helpers import until
from s3_helpers import FaultProxy  # noqa: F401 (the type the proxy fixture gives)

pytestmark = pytest.mark.s3

MiB = 1 << 20


@pytest.fixture
def bucket(s3_bucket):  # tests/conftest.py: moto on loopback, a new bucket per test
    return s3_bucket


@pytest.fixture
def proxy(fault_proxy):  # in front of moto: the server under test talks to it
    return fault_proxy


@pytest.fixture
def s3(moto):  # boto3, straight to moto (not through the proxy)
    return moto.boto3()


class Node:
    """A tce-server whose root `self.root` maps to s3://bucket/run1 through
    the proxy; restartable on the same state dir (its upload journal)."""

    def __init__(self, tmp_path, bucket: str, proxy: FaultProxy, *extra: str) -> None:
        self.root = str(tmp_path / "ckpt")  # never created: an object root has no directory
        self.state = str(tmp_path / "state")
        self.bucket, self.proxy, self.extra = bucket, proxy, list(extra)
        self.dirs: list[str] = []  # directory roots beside the object root
        self.server: LocalServer | None = None

    def start(self) -> "Node":
        self.server = LocalServer(
            memory_budget="512MiB", state_dir=self.state,
            storage_roots=[f"{self.root}=s3://{self.bucket}/run1", *self.dirs],
            extra_args=["--s3-endpoint", self.proxy.endpoint, "--s3-path-style", "true",
                        "--s3-backoff-ms", "10", "--persist-backoff-ms", "10",
                        "--memory-backing", "4k", *self.extra],
            env={**os.environ, **credentials_env()}).start()  # a new socket: asked afresh
        return self

    def stop(self) -> None:
        api.close()
        assert self.server.stop() == 0, self.server.log()

    def kill(self) -> None:
        api.close()
        self.server.proc.send_signal(signal.SIGKILL)
        self.server.proc.wait()

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def key(self, rel: str) -> str:
        return "run1/" + rel


@pytest.fixture
def node(tmp_path, bucket, proxy):
    n = Node(tmp_path, bucket, proxy).start()
    with _knobs.override(socket=n.server.socket, job=f"s3-{uuid.uuid4().hex[:8]}",
                         on_unavailable="raise"):
        yield n
        api.close()
    if n.server.proc.poll() is None:
        assert n.server.stop() == 0, n.server.log()
    n.server.cleanup()


def _restart(n: Node, *extra: str) -> None:
    """The same node's server again (empty cache), same settings and state."""
    if n.server.proc.poll() is None:
        n.stop()
    n.extra += list(extra)
    n.start()


def _object(s3, bucket: str, key: str) -> bytes:
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read()


def _exists(s3, bucket: str, key: str) -> bool:
    return any(o["Key"] == key for o in s3.list_objects_v2(Bucket=bucket, Prefix=key).get("Contents", []))


def _uploads(s3, bucket: str) -> list[dict]:
    return s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])


def _file(path: str) -> pb.FileInfo:
    return next(f for f in client.files() if f.path == path)


def _state(path: str) -> int:
    return _file(path).state


def test_a_saved_file_is_persisted_as_an_object_holding_its_bytes(node, s3, bucket):
    obj = {"w": torch.randn(256, 256), "step": 3}
    path = node.path("global_step3/model.pt")
    tce.save(obj, path, tag="global_step3")
    tce.wait([path])  # durable in S3
    assert _state(path) == pb.FILE_STATE_PERSISTED
    data = _object(s3, bucket, node.key("global_step3/model.pt"))
    mm = buffers.open_mapping(path)
    assert data == bytes(mm[:len(data)]) and len(data) == client.lookup(path).size
    out = torch.load(io.BytesIO(data), weights_only=True)  # an ordinary torch.save file
    assert torch.equal(out["w"], obj["w"]) and out["step"] == 3
    assert not os.path.exists(node.root)  # nothing on the local filesystem


def test_loads_of_one_object_that_miss_together_read_the_bucket_once(node, s3, bucket):
    """Two loads of a file no node holds, at once: the server fetches the
    object once, the second load waits for that fetch (counted in
    object_fetches_shared) and both get its bytes."""
    import threading
    t = torch.arange(64 * 1024, dtype=torch.int32)
    buf = io.BytesIO()
    torch.save({"t": t}, buf)
    s3.put_object(Bucket=bucket, Key=node.key("shared/w.pt"), Body=buf.getvalue())  # another writer's
    path = node.path("shared/w.pt")
    node.proxy.hold(lambda q: q.kind == "GetObject" and q.path.endswith("/shared/w.pt"))
    out: list = [None, None]

    def load(i: int) -> None:  # (client settings are the process's: the node fixture's)
        out[i] = tce.load(path, weights_only=True)

    first = threading.Thread(target=load, args=(0,))
    first.start()
    node.proxy.wait_held(1)  # the first load's fetch is reading the object
    second = threading.Thread(target=load, args=(1,))
    second.start()
    until(lambda: int(api.status()["object_fetches_shared"]) == 1, what="the second load to join the fetch")
    node.proxy.release()
    first.join(60)
    second.join(60)
    assert torch.equal(out[0]["t"], t) and torch.equal(out[1]["t"], t)
    gets = [q for q in node.proxy.requests() if q.kind == "GetObject" and q.path.endswith("/shared/w.pt")]
    assert len(gets) == 1 and int(api.status()["objects_fetched"]) == 1


def test_stored_files_lists_what_the_bucket_holds_under_a_directory(node, s3, bucket):
    """What a job restarted on empty nodes finds: the bucket's files under a
    directory, with their sizes, whatever this server's cache and metadata
    know; a directory outside the object roots is refused."""
    s3.put_object(Bucket=bucket, Key=node.key("step7/a.pt"), Body=b"a" * 10)
    s3.put_object(Bucket=bucket, Key=node.key("step7/sub/b.pt"), Body=b"b" * 3)
    s3.put_object(Bucket=bucket, Key=node.key("step70/c.pt"), Body=b"c")  # another directory
    assert objects.stored_files(node.path("step7")) == [(node.path("step7/a.pt"), 10),
                                                        (node.path("step7/sub/b.pt"), 3)]
    assert objects.stored_files(node.path("nothing-here")) == []
    with pytest.raises(InvalidArgumentError, match="is not under an object storage root"):
        objects.stored_files("/not/an/object/root")


def test_large_files_go_up_in_parallel_parts_and_come_back_by_ranges(tmp_path, bucket, proxy, s3):
    n = Node(tmp_path, bucket, proxy, "--s3-part-size", "5MiB", "--s3-range-size", "4MiB").start()
    try:
        with _knobs.override(socket=n.server.socket, job="big", on_unavailable="raise"):
            t = torch.arange(4 * MiB, dtype=torch.int32)  # 16 MiB: 4 parts
            path = n.path("big.pt")
            tce.save({"t": t}, path)
            tce.wait([path])
            counts = proxy.counts()
            assert counts.get("CreateMultipartUpload") == 1 and counts.get("CompleteMultipartUpload") == 1
            assert counts.get("UploadPart") == 4 and not counts.get("PutObject")
            parts = [r for r in proxy.requests() if r.kind == "UploadPart"]
            assert all(r.headers.get("x-amz-checksum-crc32") for r in parts)  # S3 checks each part
            assert not _uploads(s3, bucket)
            size = client.lookup(path).size
            n.stop()
            n.start()  # an empty cache: the load fetches the object
        with _knobs.override(socket=n.server.socket, job="big", on_unavailable="raise"):
            before = proxy.counts().get("GetObject", 0)
            out = tce.load(path, weights_only=True)
            assert torch.equal(out["t"], t)
            assert proxy.counts().get("GetObject", 0) - before == (size + 4 * MiB - 1) // (4 * MiB)
            st = api.status()
            assert int(st["objects_fetched"]) == 1 and int(st["object_bytes_fetched"]) == size
            assert _state(path) == pb.FILE_STATE_PERSISTED  # fetched: a cached, durable copy
            again = tce.load(path, weights_only=True)  # from the cache now
            assert torch.equal(again["t"], t) and int(api.status()["objects_fetched"]) == 1
            api.close()
    finally:
        n.stop()
        n.server.cleanup()


def test_an_object_replaced_or_deleted_on_s3_is_not_served_stale(node, s3, bucket):
    path = node.path("c.pt")
    tce.save({"v": torch.zeros(8)}, path)
    tce.wait([path])
    other = io.BytesIO()
    torch.save({"v": torch.ones(8)}, other)
    s3.put_object(Bucket=bucket, Key=node.key("c.pt"), Body=other.getvalue())
    assert torch.equal(tce.load(path, weights_only=True)["v"], torch.ones(8))  # the new object
    s3.delete_object(Bucket=bucket, Key=node.key("c.pt"))
    with pytest.raises(FileNotFoundError):
        tce.load(path, weights_only=True)


def test_a_save_over_an_object_replaced_since_is_discarded(node, s3, bucket, proxy):
    path = node.path("d.pt")
    tce.save({"v": torch.zeros(8)}, path)
    tce.wait([path])
    heads = {"n": 0}

    def last_look(r):  # the save's own look at the key passes; the persister's last one waits
        if r.kind != "HeadObject" or not r.path.endswith("/d.pt"):
            return False
        heads["n"] += 1
        return heads["n"] >= 2

    proxy.hold(last_look)
    tce.save({"v": torch.full((8,), 2.0)}, path)
    proxy.wait_held(1)
    s3.put_object(Bucket=bucket, Key=node.key("d.pt"), Body=b"someone else")  # behind the proxy
    proxy.release()
    until(lambda: _state(path) == pb.FILE_STATE_DISCARDED, what="the save discarded")
    assert "replaced on object storage" in _file(path).reason
    assert _object(s3, bucket, node.key("d.pt")) == b"someone else"


def _dcp_save(path: str, state: dict) -> None:
    import torch.distributed.checkpoint as dcp
    from tce.dcp import StorageWriter
    dcp.save(state, storage_writer=StorageWriter(path))


def test_a_dcp_checkpoint_metadata_is_written_after_its_data(node, s3, bucket, proxy):
    path = node.path("dcp/step1")
    proxy.hold(lambda r: r.kind == "PutObject" and not r.path.endswith("/.metadata"))
    saved = {"w": torch.randn(64, 64)}
    _dcp_save(path, saved)
    held = proxy.wait_held(1)
    assert held[0].path.endswith(".distcp")
    meta_key = node.key("dcp/step1/.metadata")
    # The data is not durable: the marker is not written, whatever the wait.
    assert not _exists(s3, bucket, meta_key)
    assert _state(os.path.join(path, ".metadata")) in (pb.FILE_STATE_CACHED, pb.FILE_STATE_BACKED_UP)
    proxy.release()
    tce.wait([os.path.join(path, ".metadata")])
    order = [r.path for r in proxy.requests() if r.kind == "PutObject" and r.status == 200]
    assert order[-1].endswith("/.metadata") and any(p.endswith(".distcp") for p in order[:-1])
    # And it loads from the bucket alone, on an empty cache.
    _restart(node)
    with _knobs.override(socket=node.server.socket):
        import torch.distributed.checkpoint as dcp
        from tce.dcp import StorageReader
        out = {"w": torch.zeros(64, 64)}
        reader = StorageReader(path)
        dcp.load(out, storage_reader=reader)
        assert torch.equal(out["w"], saved["w"])
        st = api.status()
        # .metadata fetched into the cache; the data read as the ranges the plan needs
        assert int(st["objects_fetched"]) == 1 and int(st["object_ranges_read"]) >= 1
        assert {r.source for r in reader.reads} == {"storage"}


def _dcp_load(path: str, like: dict, reader=None) -> dict:
    import torch.distributed.checkpoint as dcp
    from tce.dcp import StorageReader
    out = {k: torch.zeros_like(v) for k, v in like.items()}
    dcp.load(out, storage_reader=reader or StorageReader(path))
    return out


def test_a_dcp_load_pins_each_object_it_reads_by_ranges(node, s3, bucket, proxy):
    path = node.path("dcp/pinned")
    saved = {f"w{i}": torch.randn(64, 64) for i in range(6)}
    _dcp_save(path, saved)
    tce.wait([os.path.join(path, ".metadata")])
    _restart(node)  # an empty cache: the data comes from the bucket, by ranges
    with _knobs.override(socket=node.server.socket):
        before = len(proxy.requests())
        assert all(torch.equal(v, saved[k]) for k, v in _dcp_load(path, saved).items())
        seen = [r for r in proxy.requests()[before:] if r.path.endswith(".distcp")]
        ranges = int(api.status()["object_ranges_read"])
        # One look at the object, for the load's first range; every later
        # range is read on the ETag it found (If-Match), with no look.
        assert [r.kind for r in seen].count("HeadObject") == 1, [(r.kind, r.headers.get("range")) for r in seen]
        gets = [r for r in seen if r.kind == "GetObject"]
        assert len(gets) == ranges and ranges >= len(saved) + 1
        assert "if-match" in gets[0].headers  # the first too: on the ETag its look found
        assert len({r.headers["if-match"] for r in gets}) == 1


@pytest.mark.parametrize("change", ["replaced", "deleted"])
def test_a_dcp_load_fails_when_an_object_changes_between_its_ranges(node, s3, bucket, proxy, change):
    path, other = node.path("dcp/a"), node.path("dcp/b")
    old = {f"w{i}": torch.full((64, 64), float(i)) for i in range(4)}
    new = {k: v + 100 for k, v in old.items()}  # the same layout, other bytes
    _dcp_save(path, old)
    _dcp_save(other, new)
    tce.wait([os.path.join(path, ".metadata"), os.path.join(other, ".metadata")])
    data = next(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=node.key("dcp/a/"))["Contents"]
                if o["Key"].endswith(".distcp"))
    name = data[len(node.key("dcp/a/")):]
    _restart(node)
    from torch.distributed.checkpoint.api import CheckpointException
    from tce.dcp import StorageReader
    with _knobs.override(socket=node.server.socket), concurrent.futures.ThreadPoolExecutor(1) as pool:
        # Once two ranges of the data (the load's first, then an item's)
        # were read, its next request waits at the proxy while the object
        # changes: a look at it then would find the new one (or none).
        passed = []

        def after_two(r):
            if r.kind not in ("GetObject", "HeadObject") or not r.path.endswith("dcp/a/" + name):
                return False
            if len(passed) < 2:
                if r.kind == "GetObject":
                    passed.append(r)
                return False
            return True

        proxy.hold(after_two)
        reader = StorageReader(path)
        loading = pool.submit(_dcp_load, path, old, reader)
        held = proxy.wait_held(1)
        until(lambda: len(passed) == 2 and all(r.status == 206 for r in passed),
              what="ranges of the old object read")
        if change == "replaced":
            s3.copy_object(Bucket=bucket, Key=data,
                           CopySource={"Bucket": bucket, "Key": node.key("dcp/b/" + name)})
        else:
            s3.delete_object(Bucket=bucket, Key=data)
        proxy.release()
        assert all(r.kind == "GetObject" and "if-match" in r.headers for r in held)  # no look: the pinned ETag
        why = f"s3://{bucket}/{data} was {change} on object storage since this load began"
        with pytest.raises(CheckpointException, match=re.escape(why)):
            loading.result()
        # The next load pins the object afresh: the new one, whole (or none).
        if change == "replaced":
            out = _dcp_load(path, old, reader)
            assert all(torch.equal(v, new[k]) for k, v in out.items())
        else:
            with pytest.raises(CheckpointException, match=f"data file {name} is neither in this node's cache"):
                _dcp_load(path, old, reader)


def test_a_dcp_save_again_deletes_the_old_metadata_first(node, s3, bucket, proxy):
    path = node.path("dcp/again")
    _dcp_save(path, {"w": torch.zeros(4)})
    tce.wait([os.path.join(path, ".metadata")])
    proxy.hold(lambda r: r.kind == "PutObject" and not r.path.endswith("/.metadata"))
    _dcp_save(path, {"w": torch.ones(4)})
    proxy.wait_held(1)
    # Mid-save: the old .metadata is gone, so no complete-looking checkpoint
    # mixes old metadata with new data.
    assert not _exists(s3, bucket, node.key("dcp/again/.metadata"))
    proxy.release()
    tce.wait([os.path.join(path, ".metadata")])
    assert _exists(s3, bucket, node.key("dcp/again/.metadata"))


def _tag(node: Node, name: str, files: dict[str, torch.Tensor]) -> list[str]:
    paths = []
    for rel, t in files.items():
        p = node.path(f"{name}/{rel}")
        tce.save({"t": t}, p, tag=name)
        paths.append(p)
    tce.wait(paths)
    client.commit_tag(pb.TagInfo(job=_knobs.get("job"), tag=name, world_size=1,
                                 files=[pb.TagFile(rank=0, path=p, size=client.lookup(p).size)
                                        for p in paths]))
    return paths


def test_storage_keep_last_deletes_old_tags_marker_first(tmp_path, bucket, proxy, s3):
    n = Node(tmp_path, bucket, proxy, "--storage-keep-last", "1").start()
    try:
        with _knobs.override(socket=n.server.socket, job="keep", on_unavailable="raise"):
            _tag(n, "s1", {"a.distcp": torch.zeros(4), ".metadata": torch.zeros(1)})
            assert {t.tag for t in client.tags()} == {"s1"}
            _tag(n, "s2", {"a.distcp": torch.ones(4), ".metadata": torch.ones(1)})
            until(lambda: not _exists(s3, bucket, n.key("s1/a.distcp")), what="s1 deleted")
            assert not _exists(s3, bucket, n.key("s1/.metadata"))
            assert _exists(s3, bucket, n.key("s2/a.distcp")) and _exists(s3, bucket, n.key("s2/.metadata"))
            deletes = [r.path for r in proxy.requests() if r.kind == "DeleteObject"]
            assert deletes[0].endswith("s1/.metadata") and deletes[1].endswith("s1/a.distcp")
            until(lambda: {t.tag for t in client.tags()} == {"s2"}, what="s1 forgotten")
            api.close()
    finally:
        n.stop()
        n.server.cleanup()


def test_credentials_never_reach_the_log_or_the_printed_config(node, proxy):
    proxy.throttle(2)
    path = node.path("secret.pt")
    tce.save({"v": torch.zeros(2)}, path)
    tce.wait([path])
    env = credentials_env()
    log = node.server.log()
    assert env["AWS_SECRET_ACCESS_KEY"] not in log and env["AWS_ACCESS_KEY_ID"] not in log
    from tce.tools._server import server_binary
    printed = subprocess.run([server_binary(), "--print-config", "--storage-roots", f"/c=s3://{node.bucket}/x"],
                             capture_output=True, text=True, env={**os.environ, **env})
    assert printed.returncode == 0, printed.stderr
    assert env["AWS_SECRET_ACCESS_KEY"] not in printed.stdout + printed.stderr


@pytest.mark.parametrize("root, why", [
    ("/c=s3://Bad_Bucket/x", "is not a bucket name"),
    ("/c=gs://bucket/x", "unknown scheme 'gs'"),
    ("/c=s3://bucket/../x", "'..'"),
    ("relative=s3://bucket", "must be absolute"),
])
def test_bad_object_roots_are_refused_at_start(root, why):
    from tce.tools._server import server_binary
    r = subprocess.run([server_binary(), "--socket", "/tmp/never.sock", "--storage-roots", root,
                        "--print-config"], capture_output=True, text=True)
    assert r.returncode == 2 and why in r.stderr, r.stderr


@pytest.mark.deepspeed
@pytest.mark.parametrize("restart", ["same-node", "empty-node", "empty-node-older-tag"])
def test_deepspeed_saves_into_the_bucket_latest_last_and_resumes_from_it_alone(tmp_path, bucket, proxy, s3,
                                                                               restart):
    """Resumed with nothing but the bucket: the same node's server restarted
    (its metadata knows the tag), or a new one on an empty node (no
    metadata: the engine reads ``latest`` and lists the tag's files in the
    bucket), or one loading an older tag than ``latest`` by name (its files
    listed, not latest's)."""
    import shutil
    from test_deepspeed import Run, _same_state
    n = Node(tmp_path, bucket, proxy).start()
    try:
        common = ["--stage", "1", "--ckpt", n.root, "--steps", "3"]
        first = Run(1, [*common, "--save-at", "1,2", "--wait-persisted"], socket_path=n.server.socket,
                    out=tmp_path / "first").wait()
        until(lambda: _exists(s3, bucket, n.key("latest")), what="latest in the bucket")
        assert _object(s3, bucket, n.key("latest")) == b"global_step2"
        done = [r.path for r in proxy.requests()
                if r.kind in ("PutObject", "CompleteMultipartUpload") and r.status == 200]
        model = f"/{bucket}/{n.key('global_step2/mp_rank_00_model_states.pt')}"
        last_latest = max(i for i, p in enumerate(done) if p == f"/{bucket}/{n.key('latest')}")
        assert last_latest > done.index(model)  # the marker (naming global_step2) after its tag's files
        shutil.rmtree(n.root)  # DeepSpeed's own local latest and tag directory: gone
        n.stop()
        if restart.startswith("empty-node"):
            n.state = str(tmp_path / "empty-node-state")  # no metadata, no upload journal
        n.start()  # nothing cached: every file comes from the bucket
        step = 1 if restart == "empty-node-older-tag" else 2
        load = ["--load", *(["--load-tag", "global_step1"] if step == 1 else [])]
        resumed = Run(1, [*common, *load], socket_path=n.server.socket, out=tmp_path / "resumed").wait()
        _same_state(resumed[0]["at_load"], first[0]["saved"][step], "resumed from the bucket:")
        assert resumed[0]["loads"]["cache"] >= 1  # fetched into the cache, then mapped
    finally:
        if n.server.proc.poll() is None:
            n.stop()
        n.server.cleanup()


def _path_with_key_of(node: Node, n: int) -> str:
    """A path under the node's root whose object key is exactly n bytes."""
    rest = n - len(node.key(""))
    parts = []
    while rest > 255:
        parts.append("d" * 200)
        rest -= 201
    parts.append("f" * (rest - 3) + ".pt")
    path = node.path("/".join(parts))
    assert len(node.key(path[len(node.root) + 1:]).encode()) == n
    return path


@pytest.mark.parametrize("on_unavailable", ["raise", "fallback"])
def test_a_save_whose_key_s3_cannot_hold_is_refused_when_it_begins(node, s3, bucket, on_unavailable):
    """A key over S3's 1024 bytes could never be persisted: the save raises
    at once, naming the key's length and the limit, with nothing cached and
    nothing written anywhere (no fallback either: the caller still has the
    state); a key of exactly 1024 bytes is saved and persisted."""
    longest = _path_with_key_of(node, 1024)
    tce.save({"v": torch.arange(3)}, longest)
    tce.wait([longest])
    assert _state(longest) == pb.FILE_STATE_PERSISTED
    assert _exists(s3, bucket, node.key(longest[len(node.root) + 1:]))
    too_long = _path_with_key_of(node, 1025)
    with _knobs.override(on_unavailable=on_unavailable):
        with pytest.raises(InvalidArgumentError, match=re.escape(
                f"path: {too_long}: its object key would be 1025 bytes, longer than the 1024 S3 allows")):
            tce.save({"v": torch.arange(3)}, too_long)
    assert all(f.path != too_long for f in client.files())
    assert not os.path.exists(node.root)  # no direct write under the root either
