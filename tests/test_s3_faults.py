"""Object storage (S3) when the endpoint misbehaves or the server dies, against
moto's S3 server on loopback behind the fault proxy (tests/s3_helpers):
throttling, an endpoint down, one that takes requests and never answers
(each request's deadline; the other roots' files persist meanwhile), an
answer lost after its request took effect, and SIGKILL at each point of an
upload (the restart aborts what the crash left, and no other writer's).
"""

from __future__ import annotations

import io

import pytest
import torch

import tce
from tce import api
from tce.core import _knobs
from tce.v1 import tce_pb2 as pb
from helpers import until
from test_s3 import (MiB, Node, _dcp_save, _exists, _file, _object, _state, _uploads,  # noqa: F401
                     bucket, node, proxy, s3)  # the fixtures

pytestmark = pytest.mark.s3


def test_throttling_is_retried_until_the_file_is_durable(node, s3, bucket, proxy):
    proxy.throttle(3)
    path = node.path("t.pt")
    tce.save({"v": torch.arange(10)}, path)
    tce.wait([path])
    assert proxy.counts().get("SlowDown") == 3
    assert int(api.status()["object_retries"]) >= 3
    assert torch.equal(torch.load(io.BytesIO(_object(s3, bucket, node.key("t.pt"))))["v"], torch.arange(10))


def test_an_endpoint_down_then_back_persists_once_it_answers(tmp_path, bucket, proxy, s3):
    n = Node(tmp_path, bucket, proxy, "--s3-retries", "1", "--persist-retries", "0",
             "--persist-failed-retry-ms", "100").start()
    try:
        with _knobs.override(socket=n.server.socket, job="down", on_unavailable="raise"):
            proxy.refuse()
            path = n.path("x.pt")
            tce.save({"v": torch.arange(5)}, path)
            until(lambda: _state(path) == pb.FILE_STATE_FAILED, what="the upload failing")
            assert "persisted again" in _file(path).reason
            assert not _exists(s3, bucket, n.key("x.pt"))
            proxy.accept()
            until(lambda: _state(path) == pb.FILE_STATE_PERSISTED, what="persisted once it answers")
            assert _exists(s3, bucket, n.key("x.pt"))
            api.close()
    finally:
        n.stop()
        n.server.cleanup()


def test_a_request_the_endpoint_never_answers_ends_at_its_deadline(tmp_path, bucket, proxy, s3):
    """The endpoint takes the PutObject (its body included) and never
    answers: the upload ends at s3_request_timeout_ms, whatever the retries
    left, and the file is FAILED naming the deadline; once the endpoint
    answers again it is persisted (an attempt it let through late is
    recognised as this write's)."""
    n = Node(tmp_path, bucket, proxy, "--s3-request-timeout-ms", "1000", "--s3-retries", "100",
             "--persist-failed-retry-ms", "100").start()
    try:
        with _knobs.override(socket=n.server.socket, job="hung", on_unavailable="raise"):
            proxy.hold("PutObject")
            path = n.path("h.pt")
            tce.save({"v": torch.arange(5)}, path)
            until(lambda: _state(path) == pb.FILE_STATE_FAILED, what="the upload to end at its deadline")
            assert "not done within 1000 ms (s3_request_timeout_ms)" in _file(path).reason
            assert proxy.counts().get("PutObject", 0) >= 1
            proxy.release()
            until(lambda: _state(path) == pb.FILE_STATE_PERSISTED, what="persisted once it answers")
            assert _exists(s3, bucket, n.key("h.pt"))
            api.close()
    finally:
        proxy.release()
        n.stop()
        n.server.cleanup()


@pytest.mark.parametrize("lost", ["PutObject", "CompleteMultipartUpload"])
def test_an_upload_that_landed_unanswered_is_this_writes_not_another_writers(tmp_path, bucket, proxy, s3, lost):
    """The request that makes the object visible is done upstream, and its
    answer never comes (cut off at the request's deadline): the next
    attempt finds the object its own write left, by the marker that write
    recorded, and the file is PERSISTED, not DISCARDED as created by another
    writer; nothing is uploaded over it again."""
    n = Node(tmp_path, bucket, proxy, "--s3-request-timeout-ms", "1000", "--s3-retries", "0",
             "--persist-retries", "0", "--persist-failed-retry-ms", "100", "--s3-part-size", "5MiB").start()
    try:
        with _knobs.override(socket=n.server.socket, job="lost", on_unavailable="raise"):
            proxy.hold_replies(lost)
            path = n.path("l.pt")
            t = torch.arange((6 if lost == "CompleteMultipartUpload" else 1) * MiB // 4, dtype=torch.int32)
            tce.save({"t": t}, path)
            proxy.wait_held_replies(1)  # done upstream: the object is there, its answer waits
            assert _exists(s3, bucket, n.key("l.pt"))
            until(lambda: _state(path) != pb.FILE_STATE_CACHED, what="the attempt to end")
            proxy.drop_replies()
            proxy.release_replies()
            until(lambda: _state(path) in (pb.FILE_STATE_PERSISTED, pb.FILE_STATE_DISCARDED),
                  what="the file persisted again")
            assert _state(path) == pb.FILE_STATE_PERSISTED, _file(path).reason
            assert proxy.counts()[lost] == 1  # found, not uploaded again
            assert torch.equal(torch.load(io.BytesIO(_object(s3, bucket, n.key("l.pt"))))["t"], t)
            assert not _uploads(s3, bucket)
            api.close()
    finally:
        proxy.release_replies()
        n.stop()
        n.server.cleanup()


def test_a_hung_endpoint_holds_no_other_roots_files(tmp_path, bucket, proxy, s3):
    """Both persistence workers' uploads wait on an endpoint that took their
    bodies and does not answer; a file saved under a directory root
    meanwhile is persisted all the same (each root has workers of its own),
    while the uploads are still held."""
    disk = tmp_path / "disk"
    disk.mkdir()
    n = Node(tmp_path, bucket, proxy, "--persist-threads", "2")
    n.dirs = [str(disk)]
    n.start()
    try:
        with _knobs.override(socket=n.server.socket, job="lanes", on_unavailable="raise"):
            proxy.hold("PutObject")
            stuck = [n.path(f"s{i}.pt") for i in range(2)]
            for p in stuck:
                tce.save({"v": torch.arange(4)}, p)
            proxy.wait_held(2)  # every worker a shared pool would have is taken
            local = str(disk / "local.pt")
            tce.save({"v": torch.arange(6)}, local)
            until(lambda: _state(local) == pb.FILE_STATE_PERSISTED, what="the directory root's file persisted")
            assert torch.equal(torch.load(local, weights_only=True)["v"], torch.arange(6))
            assert len(proxy.held()) == 2  # the uploads still wait
            assert all(_state(p) == pb.FILE_STATE_CACHED for p in stuck)
            proxy.release()
            tce.wait(stuck)
            api.close()
    finally:
        proxy.release()
        n.stop()
        n.server.cleanup()


@pytest.mark.parametrize("point", ["after-create", "mid-parts", "before-complete"])
def test_kill_9_mid_upload_leaves_no_object_and_the_restart_aborts_the_upload(
        tmp_path, bucket, proxy, s3, point):
    n = Node(tmp_path, bucket, proxy, "--s3-part-size", "5MiB").start()
    seen = {"parts": 0}

    def mid_parts(r):  # the third part waits (two went up)
        if r.kind != "UploadPart":
            return False
        seen["parts"] += 1
        return seen["parts"] >= 3

    proxy.hold({"after-create": "UploadPart", "mid-parts": mid_parts,
                "before-complete": "CompleteMultipartUpload"}[point])
    try:
        with _knobs.override(socket=n.server.socket, job="kill", on_unavailable="raise"):
            path = n.path("k.pt")
            tce.save({"t": torch.zeros(4 * MiB, dtype=torch.int32)}, path)
            proxy.wait_held(1)
            n.kill()
        proxy.drop_held()
        proxy.release()
        assert not _exists(s3, bucket, n.key("k.pt"))  # never a partial object
        assert [u["Key"] for u in _uploads(s3, bucket)] == [n.key("k.pt")]
        n.start()  # the same state dir: its journal names the upload
        until(lambda: not _uploads(s3, bucket), what="the unfinished upload aborted")
        assert not _exists(s3, bucket, n.key("k.pt"))
    finally:
        if n.server.proc.poll() is None:
            n.stop()
        n.server.cleanup()


def test_kill_9_before_a_creation_is_answered_the_restart_aborts_that_upload_and_no_other(
        tmp_path, bucket, proxy, s3):
    """The server is killed once S3 created its multipart upload but before
    the answer (the upload id) reached it: its journal names the creation,
    not the upload. The restart finds it by its key and the time S3
    initiated it, and aborts it; another writer's upload in the same bucket
    stays."""
    theirs = s3.create_multipart_upload(Bucket=bucket, Key="run2/theirs.pt")["UploadId"]
    n = Node(tmp_path, bucket, proxy, "--s3-part-size", "5MiB").start()
    proxy.hold_replies("CreateMultipartUpload")
    try:
        with _knobs.override(socket=n.server.socket, job="kill", on_unavailable="raise"):
            tce.save({"t": torch.zeros(4 * MiB, dtype=torch.int32)}, n.path("k.pt"))
            proxy.wait_held_replies(1)  # the upload exists; its id is still on its way
            n.kill()
        proxy.drop_replies()
        proxy.release_replies()
        assert sorted(u["Key"] for u in _uploads(s3, bucket)) == [n.key("k.pt"), "run2/theirs.pt"]
        n.start()  # the same state dir: its journal names the creation
        until(lambda: [u["Key"] for u in _uploads(s3, bucket)] == ["run2/theirs.pt"],
              what="the unanswered creation's upload aborted")
        assert _uploads(s3, bucket)[0]["UploadId"] == theirs
        assert not _exists(s3, bucket, n.key("k.pt"))
    finally:
        if n.server.proc.poll() is None:
            n.stop()
        n.server.cleanup()


def test_kill_9_before_the_data_is_durable_leaves_no_marker(tmp_path, bucket, proxy, s3):
    n = Node(tmp_path, bucket, proxy).start()
    proxy.hold(lambda r: r.kind == "PutObject" and r.path.endswith(".distcp"))
    try:
        with _knobs.override(socket=n.server.socket, job="killdcp", on_unavailable="raise"):
            _dcp_save(n.path("dcp/s"), {"w": torch.randn(16)})
            proxy.wait_held(1)
            n.kill()
        proxy.drop_held()
        proxy.release()
        assert not _exists(s3, bucket, n.key("dcp/s/.metadata"))
    finally:
        n.server.cleanup()
