"""A node pulls its files back from the ring without undoing what happened
on storage while it was down: a file rewritten there (the client's fallback
writes straight to storage while the server is away) or deleted stays so,
whether the node restarts with its metadata or is replaced with nothing.
Real servers in network namespaces, real SIGKILLs, one real storage
directory both nodes share."""

from __future__ import annotations

import os
import shutil
import warnings

import pytest
import torch

import tce
from tce import api
from tce.core import _knobs
from tce.v1 import tce_pb2 as pb

from helpers import until, wait_metadata_written
from test_ring import _files, _node_server, _set_ring, _stop

pytestmark = pytest.mark.multinode


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(1 << 18, generator=g), "step": seed}  # the same size each step


def _same(a: dict, b: dict) -> bool:
    return torch.equal(a["w"], b["w"]) and a["step"] == b["step"]


def _ring_with_storage(tmp_path, nodes2):
    """Node 0's server (storage, metadata) and node 1's, in a ring; the
    storage directory and the checkpoint's path there."""
    storage = tmp_path / "storage"
    (storage / "step").mkdir(parents=True)
    a = _node_server(tmp_path, "tcp", nodes2, 0, "a", storage=str(storage), metadata=True)
    b = _node_server(tmp_path, "tcp", nodes2, 1, "b")
    _set_ring([a, b])
    return str(storage), str(storage / "step" / "model.pt"), [a, b]


def _lose(servers, a) -> None:
    """Node 0's server dies: SIGKILL, its memory gone."""
    servers.remove(a)
    a.kill()
    a.cleanup()


def _save_persisted_and_held(a, b, path) -> dict:
    """Node 0 saves v1 at `path`; it is persisted, backed up to node 1, and
    node 1 knows the file is on storage. Returns v1."""
    v1 = _state(1)
    with _knobs.override(socket=a.socket, job="ring-job", on_unavailable="raise"):
        tce.save(v1, path, tag="step1")
        tce.wait()
        api.close()
    until(lambda: _files(a)[path].backup_holder, what="the backup")
    # Told after the persist, or the copy was (re)sent after it.
    until(lambda: any(f"path={path} " in ln and "'s storage" in ln for ln in b.log().splitlines()),
          what="node 1 to learn the file is persisted")
    with _knobs.override(socket=a.socket):
        wait_metadata_written()
        api.close()
    return v1


def _bring_back(tmp_path, nodes2, how, a, b, storage):
    """Node 0's server again: restarted with its metadata (it rejoins the
    ring recorded there), or replaced with empty state (the job tells it)."""
    if how == "restarted":
        return _node_server(tmp_path, "tcp", nodes2, 0, "a", storage=storage, metadata=True)
    fresh = _node_server(tmp_path, "tcp", nodes2, 0, "a-new", storage=storage)
    _set_ring([fresh, b])
    return fresh


def _restore_done(server) -> bool:
    return "recovered 0 of 1 file(s) of job=ring-job" in server.log() or \
        "recovered 1 of 1 file(s) of job=ring-job" in server.log()


@pytest.mark.parametrize("how", ["restarted", "replaced"])
@pytest.mark.parametrize("change", ["rewritten", "deleted"])
def test_a_node_back_from_the_dead_never_undoes_storage(tmp_path, nodes2, how, change):
    storage, path, servers = _ring_with_storage(tmp_path, nodes2)
    a, b = servers
    try:
        v1 = _save_persisted_and_held(a, b, path)
        _lose(servers, a)
        v2 = _state(2)
        if change == "rewritten":  # what the client does while its server is down
            with _knobs.override(socket=a.socket, job="ring-job"), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "writing with plain torch.save" (once a process)
                tce.save(v2, path, tag="step2")
                api.close()
            assert _same(torch.load(path, weights_only=True), v2)
        else:
            os.unlink(path)
        a = _bring_back(tmp_path, nodes2, how, a, b, storage)
        servers.append(a)
        until(lambda: _restore_done(a), what="the restore from node 1")
        assert "not restoring job=ring-job path=" + path in a.log()
        with _knobs.override(socket=a.socket, job="ring-job", on_unavailable="raise"):
            tce.wait()  # nothing may be queued to persist
            f = _files(a)[path]
            assert pb.FileState.Name(f.state) == "FILE_STATE_EVICTED", f
            assert "older than storage" in f.reason
            if change == "rewritten":
                assert _same(torch.load(path, weights_only=True), v2)  # storage as the job left it
                assert _same(tce.load(path, weights_only=True), v2)   # and what loads get
            else:
                assert not os.path.exists(path)
                with pytest.raises(FileNotFoundError):
                    tce.load(path, weights_only=True)
                assert not os.path.exists(path)
            assert int(tce.status()["recovered_files"]) == 0
            assert int(tce.status()["stale_drops"]) >= 1
            api.close()
    finally:
        _stop(*servers)


@pytest.mark.parametrize("how", ["restarted", "replaced"])
def test_a_node_back_from_the_dead_gets_unchanged_files_back_from_memory(tmp_path, nodes2, how):
    """Storage untouched: the copy comes back into memory as PERSISTED, the
    file on storage is not written again, and loads are served from memory."""
    storage, path, servers = _ring_with_storage(tmp_path, nodes2)
    a, b = servers
    try:
        v1 = _save_persisted_and_held(a, b, path)
        before = os.stat(path)
        _lose(servers, a)
        a = _bring_back(tmp_path, nodes2, how, a, b, storage)
        servers.append(a)
        until(lambda: _restore_done(a), what="the restore from node 1")
        with _knobs.override(socket=a.socket, job="ring-job", on_unavailable="raise"):
            f = _files(a)[path]
            assert pb.FileState.Name(f.state) == "FILE_STATE_PERSISTED", f
            assert int(tce.status()["recovered_files"]) == 1
            tce.wait()
            after = os.stat(path)
            assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
            assert _same(tce.load(path, weights_only=True), v1)
            assert int(tce.status()["persisted_files"]) == 0
            api.close()
    finally:
        _stop(*servers)


@pytest.mark.parametrize("storage_holds", ["another file", "nothing"])
def test_a_copy_that_says_nothing_of_storage_is_persisted_only_where_storage_holds_nothing(
        tmp_path, nodes2, storage_holds):
    """Node 0's server kept its files in memory only (no storage roots), so
    the copy node 1 holds records nothing of storage. Node 0 is replaced by
    a server with the storage root. If storage now holds a file at the
    copy's path (the job wrote it there directly), the copy is not written
    over it: it is dropped (EVICTED, with the reason, logged) and loads read
    storage's file. If storage holds nothing there, the copy comes back and
    is persisted."""
    storage = tmp_path / "storage"
    (storage / "step").mkdir(parents=True)
    path = str(storage / "step" / "model.pt")
    a = _node_server(tmp_path, "tcp", nodes2, 0, "a")  # memory only
    b = _node_server(tmp_path, "tcp", nodes2, 1, "b")
    servers = [a, b]
    try:
        _set_ring(servers)
        v1 = _state(1)
        with _knobs.override(socket=a.socket, job="ring-job", on_unavailable="raise"):
            tce.save(v1, path, tag="step1")
            api.close()
        until(lambda: _files(a)[path].backup_holder, what="the backup")
        assert not os.path.exists(path)
        _lose(servers, a)
        v2 = _state(2)
        if storage_holds == "another file":
            torch.save(v2, path)
        before = os.stat(path) if storage_holds == "another file" else None
        a = _node_server(tmp_path, "tcp", nodes2, 0, "a-new", storage=str(storage))
        servers.append(a)
        _set_ring([a, b])
        until(lambda: _restore_done(a), what="the restore from node 1")
        with _knobs.override(socket=a.socket, job="ring-job", on_unavailable="raise"):
            tce.wait()  # whatever is queued to persist
            f = _files(a)[path]
            if storage_holds == "another file":
                assert f"not restoring job=ring-job path={path}" in a.log()
                assert pb.FileState.Name(f.state) == "FILE_STATE_EVICTED", f
                assert "is not written over storage" in f.reason and "does not record" in f.reason, f.reason
                after = os.stat(path)
                assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
                assert _same(torch.load(path, weights_only=True), v2)
                assert _same(tce.load(path, weights_only=True), v2)
            else:
                assert pb.FileState.Name(f.state) == "FILE_STATE_PERSISTED", f
                assert _same(torch.load(path, weights_only=True), v1)
                assert _same(tce.load(path, weights_only=True), v1)
            api.close()
    finally:
        _stop(*servers)


@pytest.mark.parametrize("how", ["restarted", "replaced"])
def test_a_copy_is_not_written_over_a_file_in_a_directory_tree_it_never_saw(tmp_path, nodes2, how):
    """While node 0 is down, the checkpoint's directory and its parent are
    removed and made again, with another file at the copy's path (storage
    that is not the one the copy's node saw, as on a new disk). The copy is
    not written over that file: dropped, logged, and loads read storage."""
    storage, _, servers = _ring_with_storage(tmp_path, nodes2)
    a, b = servers
    run = os.path.join(storage, "run")
    os.makedirs(os.path.join(run, "step"))
    path = os.path.join(run, "step", "model.pt")
    try:
        _save_persisted_and_held(a, b, path)
        _lose(servers, a)
        os.rename(run, run + ".old")  # held until the new tree is made: new inode numbers
        os.makedirs(os.path.join(run, "step"))
        v2 = _state(2)
        torch.save(v2, path)
        shutil.rmtree(run + ".old")
        before = os.stat(path)
        a = _bring_back(tmp_path, nodes2, how, a, b, storage)
        servers.append(a)
        until(lambda: _restore_done(a), what="the restore from node 1")
        assert "not restoring job=ring-job path=" + path in a.log()
        with _knobs.override(socket=a.socket, job="ring-job", on_unavailable="raise"):
            tce.wait()
            f = _files(a)[path]
            assert pb.FileState.Name(f.state) == "FILE_STATE_EVICTED", f
            after = os.stat(path)
            assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
            assert _same(tce.load(path, weights_only=True), v2)
            api.close()
    finally:
        _stop(*servers)
