"""tce.client through a real tce-server: a session with a chosen server,
listing files and tags, a cached file's bytes, settings."""

from __future__ import annotations

import mmap
import os

import pytest
import torch

import tce
from tce import buffers, client
from tce.errors import NotCachedError, ServerUnavailableError
from tce.v1 import tce_pb2 as pb


def test_a_session_points_every_call_at_its_server_and_ends_with_the_block(make_server,
                                                                         tmp_path):
    a, b = make_server(), make_server()
    path = str(tmp_path / "ckpt" / "model.pt")
    with client.session(a.socket, job="client-test"):
        assert client.setting("socket") == a.socket
        assert client.settings()["job"] == "client-test"
        tce.save({"w": torch.arange(4)}, path, tag="step1")
        assert [f.path for f in client.files()] == [path]
        assert client.mapped_buffers() == 1  # the save's buffer, kept for the next save
    with client.session(b.socket, job="client-test"):
        assert client.files() == []  # b holds nothing: the calls went to b
    with client.session(a.socket):
        assert client.mapped_buffers() == 0  # a new session: the first one ended with its block
        assert [f.path for f in client.files(job="")] == [path]  # every job
        info = client.lookup(path, job="client-test")
        assert info.tag == "step1" and info.state == pb.FILE_STATE_CACHED


def test_a_session_with_no_server_raises_on_entry(tmp_path):
    with pytest.raises(ServerUnavailableError):
        with client.session(str(tmp_path / "none.sock")):
            pytest.fail("entered a session with no server")


def test_open_fd_gives_the_cached_bytes_and_its_size(server, tmp_path):
    path = str(tmp_path / "ckpt" / "model.pt")
    tce.save({"w": torch.arange(1000, dtype=torch.float32)}, path)
    expected = client.lookup(path).size
    with buffers.open_fd(path) as cached:
        assert cached.size == expected
        data = os.pread(cached.fd, cached.size, 0)
    assert cached.fd == -1  # closed, and its lease released
    assert data[:2] == b"PK" and len(data) == expected  # torch.save's zip
    mm = buffers.open_mapping(path)
    assert bytes(mm[:expected]) == data
    info, mapped = buffers.open_mapped_file(path)
    assert info.size == expected and info.path == path
    assert len(mapped) % mmap.PAGESIZE == 0 and len(mapped) >= expected  # whole pages
    assert bytes(mapped[:expected]) == data
    assert buffers.open_fd(str(tmp_path / "never.pt")) is None
    assert buffers.open_mapped_file(str(tmp_path / "never.pt")) is None
    with pytest.raises(NotCachedError):
        client.lookup(str(tmp_path / "never.pt"))


def test_tags_lists_what_commit_tag_recorded(server, tmp_path):
    path = str(tmp_path / "ckpt" / "step5" / "model.pt")
    os.makedirs(os.path.dirname(path))
    tce.save({"w": torch.ones(3)}, path, tag="step5")
    job = client.setting("job")
    size = client.lookup(path).size
    client.commit_tag(pb.TagInfo(job=job, tag="step5", world_size=1,
                                 files=[pb.TagFile(rank=0, path=path, size=size)]))
    (tag,) = [t for t in client.tags() if t.tag == "step5"]
    assert [(f.path, f.size) for f in tag.files] == [(path, size)]


def test_settings_come_from_configure_override_and_the_environment(monkeypatch):
    monkeypatch.setenv("TCE_JOB", "from-env")
    assert client.setting("job") == "from-env"
    with client.override(job="from-override"):
        assert client.settings()["job"] == "from-override"
    assert client.setting("job") == "from-env"
    with pytest.raises(KeyError):
        client.setting("no_such_setting")
