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
from tce import _api, _knobs
from tce._server import LocalServer
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
            client = _api._get_client()
            info = client.wait(job, [str(path)], 20)[0]
            assert info.state == pb.FILE_STATE_FAILED
            assert "No space left on device" in info.reason, info.reason
            assert "persisted again every 0.30 s" in info.reason, info.reason
            assert not path.exists()  # never a torn file
            ballast.unlink()  # room again
            until(lambda: client.lookup(job, str(path)).state == pb.FILE_STATE_PERSISTED, timeout=20,
                  what="the file to persist once there is room")
            _api.close()
        assert torch.equal(torch.load(path, weights_only=True)["w"], w)
        assert "persisting again job=" in s.log()
    finally:
        assert s.stop() == 0, s.log()
        s.cleanup()
