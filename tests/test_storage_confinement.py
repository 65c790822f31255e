"""A root server writes only beneath its storage roots, whatever symlinks a
local user plants, and its temp files fit any valid name and outlive no
restart. Real server, real files."""

from __future__ import annotations

import os
import uuid

import pytest
import torch

import tce
from tce import _service, api
from tce.core import _knobs
from tce.tools._server import LocalServer
from tce.v1 import tce_pb2 as pb

from helpers import Blocker, exchange


@pytest.fixture
def roots(tmp_path):
    storage, outside = tmp_path / "storage", tmp_path / "outside"
    storage.mkdir()
    outside.mkdir()
    return storage, outside


def _server(storage, state=None):
    extra = ["--persist-backoff-ms", "10", "--persist-retries", "1"]
    if state is not None:
        extra += ["--state-dir", str(state)]
    return LocalServer(memory_budget="256MiB", storage_roots=[str(storage)], extra_args=extra).start()


def _save_and_wait(server, path, obj) -> pb.FileInfo:
    with _knobs.override(socket=server.socket, job=f"conf-{uuid.uuid4().hex[:8]}", on_unavailable="raise"):
        tce.save(obj, path, tag="t")
        infos = _service.client().wait(_knobs.get("job"), [str(path)], 20)
        api.close()
    return infos[0]


def test_a_planted_temp_symlink_never_redirects_a_write(roots):
    """Symlinks at every guessable temp name (".NAME.tce-tmp-<version>") point at a file outside the roots; the save
    persists and the file outside is untouched."""
    storage, outside = roots
    victim = outside / "victim"
    victim.write_bytes(b"not yours")
    for v in range(1, 65):
        os.symlink(victim, storage / f".x.pt.tce-tmp-{v}")
    s = _server(storage)
    try:
        info = _save_and_wait(s, storage / "x.pt", {"w": torch.arange(10)})
        assert info.state == pb.FILE_STATE_PERSISTED, info.reason
        assert victim.read_bytes() == b"not yours"
        assert torch.equal(torch.load(storage / "x.pt")["w"], torch.arange(10))
    finally:
        assert s.stop() == 0, s.log()
        s.cleanup()


def test_a_file_name_of_250_bytes_persists(roots):
    storage, _ = roots
    s = _server(storage)
    try:
        path = storage / ("n" * 250 + ".pt")
        info = _save_and_wait(s, path, {"w": torch.ones(3)})
        assert info.state == pb.FILE_STATE_PERSISTED, info.reason
        assert path.exists()
        assert [p.name for p in storage.iterdir()] == [path.name]
    finally:
        assert s.stop() == 0, s.log()
        s.cleanup()


def test_a_symlink_swapped_in_for_a_directory_is_not_written_through(roots, tmp_path):
    """The save is accepted while ckpt/ is a directory under the root. An
    immutable file at the final name makes every attempt fail, so persistence
    retries; meanwhile ckpt/ is replaced by a symlink out of the roots (to a
    place that looks the same). No retry writes through it: the directory the
    save found is gone, so the save is discarded."""
    storage, outside = roots
    blocker = Blocker(storage / "ckpt" / "x.pt")
    target = blocker.path
    s = LocalServer(memory_budget="256MiB", storage_roots=[str(storage)],
                    extra_args=["--persist-backoff-ms", "300", "--persist-retries", "4"]).start()
    try:
        job = f"conf-{uuid.uuid4().hex[:8]}"
        with _knobs.override(socket=s.socket, job=job, on_unavailable="raise"):
            (outside / "x.pt").write_bytes(b"looks the same on the other side")
            os.symlink(outside, storage / "ckpt.link")
            tce.save({"w": torch.ones(3)}, target, tag="t")
            exchange(storage / "ckpt", storage / "ckpt.link")  # swapped during the retries, atomically
            info = _service.client().wait(job, [str(target)], 30)[0]
            api.close()
        assert info.state == pb.FILE_STATE_DISCARDED
        # Found by the path resolving out of the roots, or by the directory
        # opened without following symlinks: which one depends on where in
        # a retry the swap lands.
        assert f"{storage / 'ckpt'} is no longer the directory the file was saved in" in info.reason, info.reason
        assert sorted(p.name for p in outside.iterdir()) == ["x.pt"]
        assert (outside / "x.pt").read_bytes() == b"looks the same on the other side"
    finally:
        assert s.stop() == 0, s.log()
        s.cleanup()
        blocker.path = storage / "ckpt.link" / "x.pt"
        blocker.release()
