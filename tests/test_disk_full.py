"""Storage that runs out, for real: a small ext4 filesystem on a loop device
(root), filled, then freed. A checkpoint whose persistence failed for lack of
space is persisted once there is room, with nobody asking."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest
import torch

import tce
from tce import _service, api
from tce.core import _knobs
from tce.tools._server import LocalServer
from tce.v1 import tce_pb2 as pb

from helpers import until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a loop device (root)")


@pytest.fixture
def small_disk(tmp_path):
    image, mnt = tmp_path / "disk.img", tmp_path / "disk"
    mnt.mkdir()
    subprocess.run(["truncate", "-s", "48M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(root, leave_bytes: int):
    """A ballast file that leaves about `leave_bytes` free."""
    st = os.statvfs(root)
    free = st.f_bavail * st.f_frsize
    ballast = root / "ballast"
    with open(ballast, "wb") as f:
        f.truncate(0)
        os.posix_fallocate(f.fileno(), 0, max(0, free - leave_bytes))
    return ballast


def test_a_checkpoint_failed_on_a_full_disk_persists_once_there_is_room(small_disk):
    s = LocalServer(memory_budget="128MiB", storage_roots=[str(small_disk)],
                    extra_args=["--persist-retries", "0", "--persist-failed-retry-ms", "300"]).start()
    try:
        ballast = _fill(small_disk, 1 << 20)
        job = f"full-{uuid.uuid4().hex[:8]}"
        path = small_disk / "step1.pt"
        w = torch.randn(2 << 20)  # 8 MiB: does not fit
        with _knobs.override(socket=s.socket, job=job, on_unavailable="raise"):
            tce.save({"w": w}, path, tag="step1")
            client = _service.client()
            info = client.wait(job, [str(path)], 20)[0]
            assert info.state == pb.FILE_STATE_FAILED
            assert "No space left on device" in info.reason, info.reason
            assert "persisted again every 0.30 s" in info.reason, info.reason
            assert not path.exists()  # never a torn file
            ballast.unlink()  # room again
            until(lambda: client.lookup(job, str(path)).state == pb.FILE_STATE_PERSISTED, timeout=20,
                  what="the file to persist once there is room")
            api.close()
        assert torch.equal(torch.load(path, weights_only=True)["w"], w)
        assert "persisting again job=" in s.log()
    finally:
        assert s.stop() == 0, s.log()
        s.cleanup()


def _tce(server, *args) -> subprocess.CompletedProcess:
    import sys

    return subprocess.run([sys.executable, "-m", "tce.cli", "--socket", server.socket, *args],
                          capture_output=True, text=True, timeout=60)


def test_an_operator_retries_or_drops_what_failed(small_disk):
    """With automatic retries off, FAILED files wait for the operator:
    `tce retry` persists one once there is room, `tce drop` lets go of the
    other (it is never written)."""
    s = LocalServer(memory_budget="128MiB", storage_roots=[str(small_disk)],
                    extra_args=["--persist-retries", "0", "--persist-failed-retry-ms", "0"]).start()
    try:
        ballast = _fill(small_disk, 1 << 20)
        job = f"ops-{uuid.uuid4().hex[:8]}"
        keep, drop = small_disk / "keep.pt", small_disk / "drop.pt"
        w = torch.randn(2 << 20)
        with _knobs.override(socket=s.socket, job=job, on_unavailable="raise"):
            tce.save({"w": w}, keep, tag="t")
            tce.save({"w": w}, drop, tag="t")
            client = _service.client()
            infos = client.wait(job, [str(keep), str(drop)], 20)
            assert [i.state for i in infos] == [pb.FILE_STATE_FAILED] * 2, [i.reason for i in infos]
            assert "persisted again" not in infos[0].reason  # nobody retries by itself
            ballast.unlink()
            p = _tce(s, "retry", str(keep))
            assert p.returncode == 0 and f"retrying  {keep} (job {job})" in p.stdout, p.stderr
            until(lambda: client.lookup(job, str(keep)).state == pb.FILE_STATE_PERSISTED,
                  what="the retried file to persist")
            p = _tce(s, "drop", str(drop))
            assert p.returncode == 0 and f"dropped   {drop} (job {job})" in p.stdout, p.stderr
            assert str(drop) not in {f.path for f in client.list(job)}
            p = _tce(s, "retry", str(keep))  # persisted: nothing to retry, and it says so
            assert p.returncode == 1 and "is PERSISTED, not FAILED: nothing to retry" in p.stderr, p.stderr
            api.close()
        assert torch.equal(torch.load(keep, weights_only=True)["w"], w)
        assert not drop.exists()
    finally:
        assert s.stop() == 0, s.log()
        s.cleanup()
