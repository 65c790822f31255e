"""A tag's marker on object storage across nodes: two "nodes" (network
namespaces, tce.tools._netns) with a tce-server each in one job's ring, both
persisting to one bucket (moto, through a fault proxy the nodes reach on the
bridge's address). The tag's record names files of both nodes; the marker
(DeepSpeed's ``latest``) is saved on node 0, and must not reach the bucket
while node 1's file of the tag is not durable there: node 0's server asks
node 1's which files it has persisted (ring/tag_barrier.h) before uploading
it.
"""

from __future__ import annotations

import io
import os
import signal
import uuid

import pytest
import torch

import tce
from tce import _service, api, buffers, client, objects
from tce.tools._moto import credentials_env
from tce.tools._server import LocalServer
from tce.v1 import tce_pb2 as pb

from helpers import call_on, until
from s3_helpers import FaultProxy

pytestmark = [pytest.mark.s3, pytest.mark.multinode]

TOKEN = "s3-nodes-token"


class Ring:
    """A tce-server per node, each on its node's address, storage root
    `root` = s3://bucket/run1 through `proxy`, in the ring of job `job`."""

    def __init__(self, tmp_path, nodes, bucket: str, proxy: FaultProxy) -> None:
        self.root = str(tmp_path / "ckpt")  # an object root: never a directory
        self.bucket, self.job = bucket, f"s3n-{uuid.uuid4().hex[:8]}"
        self.tmp_path, self.nodes, self.proxy = tmp_path, nodes, proxy
        self.servers = [self._start(i) for i in range(len(nodes.names))]
        self.endpoints = [self.status(i)["peer_endpoint"] for i in range(len(self.servers))]
        for i in range(len(self.servers)):
            self.join(i)

    def _start(self, i: int) -> LocalServer:
        state = self.tmp_path / f"node{i}"
        state.mkdir(exist_ok=True)
        return LocalServer(
            memory_budget="256MiB", socket_path=str(state / "tce.sock"), netns=self.nodes.names[i],
            storage_roots=[f"{self.root}=s3://{self.bucket}/run1"],
            extra_args=["--peer-listen", f"{self.nodes.addresses[i]}:7070", "--peer-token", TOKEN,
                        "--peer-timeout-ms", "5000", "--metadata-url", "none",
                        "--s3-endpoint", self.proxy.endpoint, "--s3-path-style", "true",
                        "--s3-backoff-ms", "10", "--persist-backoff-ms", "10"],
            env={**os.environ, **credentials_env()}).start()

    def join(self, i: int) -> None:
        """Tells node i's server the job's ring (as tce.join_ring does)."""
        self.call(i, lambda: _service.client().set_ring(self.job, i, self.endpoints))

    def kill(self, i: int) -> None:
        self.servers[i].proc.send_signal(signal.SIGKILL)
        self.servers[i].proc.wait()

    def restart(self, i: int) -> None:
        """Node i's server again, empty, on the same endpoint, told the ring."""
        self.servers[i].cleanup()
        self.servers[i] = self._start(i)
        self.join(i)

    def call(self, i: int, fn):
        return call_on(self.servers[i].socket, self.job, fn)

    def status(self, i: int) -> dict:
        return self.call(i, api.status)

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def save(self, i: int, rel: str, rank: int, tag: str = "step1") -> int:
        """Saves a small state dict at `rel` on node i; its size."""
        self.call(i, lambda: tce.save({"w": torch.full((1024,), float(rank))}, self.path(rel), tag=tag))
        return self.call(i, lambda: client.lookup(self.path(rel)).size)

    def record_and_mark(self, files: list[tuple[int, str, int]], marker: str = "latest",
                        tag: str = "step1") -> None:
        """On node 0, as rank 0 does: DeepSpeed's engine records the complete
        tag (every rank's files), then writes ``latest``; DCP's writer
        writes ``.metadata`` (one of the tag's files), then records the tag."""
        mark = lambda: objects.save_bytes(self.path(marker), tag.encode(), job=self.job, tag=tag, rank=0)  # noqa: E731
        if marker.endswith(".metadata"):
            files = [*files, (0, marker, len(tag))]
            self.call(0, mark)
        record = pb.TagInfo(job=self.job, tag=tag, world_size=2,
                            files=[pb.TagFile(rank=r, path=self.path(p), size=s) for r, p, s in files])
        self.call(0, lambda: client.commit_tag(record))
        if marker == "latest":
            self.call(0, mark)

    def stop(self) -> None:
        for s in self.servers:
            if s.proc.poll() is None:
                assert s.stop() == 0, s.log()
            s.cleanup()


@pytest.fixture
def ring(tmp_path, nodes2, moto, s3_bucket):
    with FaultProxy(moto.endpoint, host=nodes2.host_address()) as proxy:
        r = Ring(tmp_path, nodes2, s3_bucket, proxy)
        r.s3 = moto.boto3()
        try:
            yield r
        finally:
            proxy.release()
            r.stop()


def _exists(r: Ring, rel: str) -> bool:  # in the bucket
    key = "run1/" + rel
    return any(o["Key"] == key for o in r.s3.list_objects_v2(Bucket=r.bucket, Prefix=key).get("Contents", []))


def _two_more_rounds(r: Ring, marker: str) -> None:
    """Waits until node 0 has begun two more rounds of asking the other
    node (the round under way when called has ended), or the marker is in
    the bucket (which the caller then finds too early)."""
    start = int(r.status(0)["marker_rounds"])
    until(lambda: int(r.status(0)["marker_rounds"]) >= start + 2 or _exists(r, marker),
          what="two rounds of the tag barrier")


@pytest.mark.parametrize("marker", ["latest", "step1/.metadata"])
def test_a_marker_waits_until_the_other_nodes_files_of_its_tag_are_durable(ring, marker):
    r = ring
    r.proxy.hold(lambda q: q.kind == "PutObject" and q.path.endswith("/step1/shard1.pt"))
    size1 = r.save(1, "step1/shard1.pt", rank=1)
    r.proxy.wait_held(1, timeout=60)  # node 1's file on its way, held
    size0 = r.save(0, "step1/shard0.pt", rank=0)
    r.call(0, lambda: tce.wait([r.path("step1/shard0.pt")]))  # node 0's own file is durable
    r.record_and_mark([(0, "step1/shard0.pt", size0), (1, "step1/shard1.pt", size1)], marker)
    _two_more_rounds(r, marker)  # node 0 asked node 1, which has not persisted its file
    assert not _exists(r, marker)
    assert int(r.status(0)["held_markers"]) == 1
    r.proxy.release()
    r.call(1, lambda: tce.wait([r.path("step1/shard1.pt")]))
    until(lambda: _exists(r, marker), what=f"{marker} in the bucket")
    done = [q.path for q in r.proxy.requests() if q.kind == "PutObject" and q.status == 200]
    assert done.index(f"/{r.bucket}/run1/{marker}") > done.index(f"/{r.bucket}/run1/step1/shard1.pt")
    assert int(r.status(0)["held_markers"]) == 0


def test_a_marker_whose_tag_lost_a_file_on_another_node_never_reaches_the_bucket(ring):
    r = ring
    r.proxy.hold(lambda q: q.kind == "PutObject" and q.path.endswith("/step1/shard1.pt"))
    size1 = r.save(1, "step1/shard1.pt", rank=1)
    r.proxy.wait_held(1, timeout=60)
    r.kill(1)  # node 1 dies with its file only in memory
    r.proxy.drop_held()
    size0 = r.save(0, "step1/shard0.pt", rank=0)
    r.call(0, lambda: tce.wait([r.path("step1/shard0.pt")]))
    r.record_and_mark([(0, "step1/shard0.pt", size0), (1, "step1/shard1.pt", size1)])
    _two_more_rounds(r, "latest")  # node 1 does not answer: the marker stays held
    assert not _exists(r, "step1/shard1.pt") and not _exists(r, "latest")
    assert int(r.status(0)["held_markers"]) == 1
    info = r.call(0, lambda: client.lookup(r.path("latest")))
    assert info.state in (pb.FILE_STATE_CACHED, pb.FILE_STATE_BACKED_UP)


def test_a_file_a_killed_node_never_uploaded_is_uploaded_once_the_ring_gives_it_back(ring):
    """Node 0 dies while its file is on its way to the bucket (the upload
    held, then cut): nothing of it is in the bucket. Restarted empty on the
    same endpoint, node 0 gets the file back from node 1's copy and uploads
    it: the object then holds exactly the bytes that were saved."""
    r = ring
    r.proxy.hold(lambda q: q.kind == "PutObject" and q.path.endswith("/step1/shard0.pt"))
    size = r.save(0, "step1/shard0.pt", rank=0)
    saved = r.call(0, lambda: bytes(buffers.open_mapping(r.path("step1/shard0.pt"))[:size]))
    until(lambda: int(r.status(1)["held_backups"]) == 1, what="node 1 to hold node 0's copy")
    r.proxy.wait_held(1, timeout=60)
    r.kill(0)
    r.proxy.drop_held()
    r.proxy.release()
    assert not _exists(r, "step1/shard0.pt")
    r.restart(0)
    listed = r.call(0, lambda: [f.path for f in client.files(r.job, wait_for_restore=True)])
    assert listed == [r.path("step1/shard0.pt")]  # back from node 1's copy
    r.call(0, lambda: tce.wait([r.path("step1/shard0.pt")], timeout=120))
    body = r.s3.get_object(Bucket=r.bucket, Key="run1/step1/shard0.pt")["Body"].read()
    assert body == saved
    assert int(r.status(0)["recovered_files"]) == 1


def test_a_restart_on_empty_nodes_reads_each_object_from_the_bucket_once(ring):
    """A checkpoint another job left in the bucket (a model file both nodes
    load, a shard each); both servers fresh. Every load is served, each
    object is read from the bucket by one node only (the restore plan's),
    the other node pulls it over the ring, and nothing is uploaded again."""
    r = ring
    objects = {"step9/model.pt": {"w": torch.randn(1 << 16)}, "step9/shard0.pt": {"m": torch.randn(1 << 15)},
               "step9/shard1.pt": {"m": torch.randn(1 << 15) + 1}}
    blobs = {}
    for rel, state in objects.items():
        buf = io.BytesIO()
        torch.save(state, buf)
        blobs[rel] = buf.getvalue()
        r.s3.put_object(Bucket=r.bucket, Key="run1/" + rel, Body=blobs[rel])
    before = len(r.proxy.requests())
    for i, shard in ((0, "step9/shard0.pt"), (1, "step9/shard1.pt")):
        for rel in ("step9/model.pt", shard):
            got = r.call(i, lambda rel=rel: tce.load(r.path(rel), weights_only=True))
            assert all(torch.equal(got[k], objects[rel][k]) for k in objects[rel])
    reads = [sum(j.storage_bytes for j in r.call(i, lambda: _service.client().status()).job_loads
                 if j.job == r.job) for i in range(2)]
    assert sum(reads) == sum(len(b) for b in blobs.values()), reads
    assert not [q for q in r.proxy.requests()[before:] if q.kind in ("PutObject", "CreateMultipartUpload")]
