"""tce.save / tce.load through a real tce-server."""

from __future__ import annotations

import argparse
import io
import os
import resource
import warnings

import pytest
import torch

import tce
from tce import _service, api
from tce.core import _knobs
from tce.core._staging import StagedSave
from tce.tools._server import LocalServer
from tce.v1 import tce_pb2 as pb
from conftest import run_python
from helpers import assert_same, every_dtype, sample_tensor


def _ckpt(tmp_path, name="model.pt"):
    # Nothing is ever written at this path: a successful load proves the bytes
    # came from the cache (the shared test server has no storage roots, so it
    # persists nothing).
    return str(tmp_path / "ckpt" / name)


def _roundtrip(obj, path, **load_kwargs):
    tce.save(obj, path)
    assert not os.path.exists(path)
    return tce.load(path, **load_kwargs)


def test_nested_containers_and_objects(server, tmp_path):
    base = torch.arange(50, dtype=torch.float64)
    obj = {
        "l": [base[:5], (base[5:9], {"deep": [1, 2.5, "s", None, b"raw"]})],
        "ns": argparse.Namespace(lr=3e-4, betas=(0.9, 0.95)),
        "step": 1234,
    }
    assert_same(_roundtrip(obj, _ckpt(tmp_path), weights_only=False), obj)


def test_every_dtype(server, tmp_path):
    obj = {str(d): sample_tensor(d) for d in every_dtype()}
    out = _roundtrip(obj, _ckpt(tmp_path), weights_only=True)
    assert_same(out, obj)
    assert {str(v.dtype) for v in out.values()} >= {"torch.bfloat16", "torch.bool",
                                                    "torch.complex64", "torch.float8_e4m3fn"}


def test_shapes_and_layouts(server, tmp_path):
    m = torch.arange(600, dtype=torch.float32).view(20, 30)
    obj = {
        "zero_dim": torch.tensor(7.25),
        "empty": torch.empty(0),
        "empty2d": torch.empty(0, 5, dtype=torch.int64),
        "transposed": m.t(),
        "strided": m[::2, 1::3],
        "offset_view": m[5:],
        "param": torch.nn.Parameter(torch.ones(3)),
    }
    assert_same(_roundtrip(obj, _ckpt(tmp_path), weights_only=False), obj)


def test_views_still_share_storage(server, tmp_path):
    base = torch.arange(100, dtype=torch.int32)
    out = _roundtrip({"base": base, "view": base[10:20], "t": base.view(10, 10).t()},
                     _ckpt(tmp_path), weights_only=True)
    assert out["view"].untyped_storage().data_ptr() == out["base"].untyped_storage().data_ptr()
    out["base"][15] = -1
    assert out["view"][5].item() == -1 and out["t"][5, 1].item() == -1


def test_loaded_tensors_are_copy_on_write(server, tmp_path):
    path = _ckpt(tmp_path)
    tce.save({"w": torch.ones(1000)}, path)
    first = tce.load(path, weights_only=True)
    first["w"].mul_(5)  # must not reach the cached bytes
    assert torch.equal(tce.load(path, weights_only=True)["w"], torch.ones(1000))


def test_cached_bytes_are_a_torch_file(server, tmp_path):
    """The buffer holds a standard torch zip: torch.load reads it without TCE."""
    obj = {"w": torch.randn(64, 64), "b": torch.arange(7), "bf": torch.ones(3, dtype=torch.bfloat16)}
    path = _ckpt(tmp_path)
    tce.save(obj, path)
    info, mm = _service.client().open(_knobs.get("job"), path)
    raw = tmp_path / "raw.pt"
    raw.write_bytes(mm[: info.size])
    del mm
    ref = tmp_path / "ref.pt"
    torch.save(obj, ref)
    out = run_python(
        "import sys, torch\n"
        f"a = torch.load({str(raw)!r}, weights_only=True)\n"
        f"b = torch.load({str(ref)!r}, weights_only=True)\n"
        f"c = torch.load({str(raw)!r}, weights_only=True, mmap=True)\n"
        "assert 'tce' not in sys.modules\n"
        "assert a.keys() == b.keys() == c.keys()\n"
        "assert all(torch.equal(a[k], b[k]) and torch.equal(c[k], b[k]) for k in a)\n"
        "print('same')\n"
    )
    assert out.strip() == "same"


@pytest.mark.parametrize("map_location", [
    None, "cpu", torch.device("cpu"), {"cpu": "cpu"},
    lambda storage, loc: storage,
], ids=["none", "str", "device", "dict", "lambda"])
def test_map_location_forms(server, tmp_path, map_location):
    obj = {"w": torch.randn(10, 10)}
    out = _roundtrip(obj, _ckpt(tmp_path), map_location=map_location, weights_only=True)
    assert_same(out, obj)


def test_map_location_meta(server, tmp_path):
    out = _roundtrip({"w": torch.randn(3, 4)}, _ckpt(tmp_path), map_location="meta",
                     weights_only=True)
    assert out["w"].is_meta and out["w"].shape == (3, 4)


def test_weights_only_refuses_arbitrary_objects(server, tmp_path):
    path = _ckpt(tmp_path)
    tce.save({"ns": argparse.Namespace(a=1)}, path)
    import pickle

    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        tce.load(path, weights_only=True)
    assert tce.load(path, weights_only=False)["ns"].a == 1


def test_load_falls_back_to_disk_when_not_cached(server, tmp_path):
    path = tmp_path / "plain.pt"
    torch.save({"x": torch.arange(3)}, path)
    assert not tce.cached(path)
    assert torch.equal(tce.load(path)["x"], torch.arange(3))


def test_relative_paths_resolve_to_the_same_entry(server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tce.save({"x": torch.ones(2)}, "rel.pt")
    assert tce.cached(tmp_path / "rel.pt")
    assert torch.equal(tce.load(str(tmp_path / "rel.pt"))["x"], torch.ones(2))


def test_overwrite_replaces_and_recycles(server, tmp_path):
    path = _ckpt(tmp_path)
    client_status = lambda: _service.client().status()  # noqa: E731
    for i in range(4):
        tce.save({"w": torch.full((4096,), float(i))}, path)
        assert tce.load(path)["w"][0].item() == float(i)
    files = [f for f in _service.client().list(_knobs.get("job")) if f.path == path]
    assert len(files) == 1 and files[0].state == pb.FILE_STATE_CACHED
    assert client_status().buffers_reused >= 2


def test_steady_state_save_needs_no_mmap_no_fd_and_no_faults(server, tmp_path):
    sd = {f"layer{i}": torch.randn(1 << 20) for i in range(32)}  # 128 MiB
    path = _ckpt(tmp_path)
    client = _service.client()
    # Two buffers alternate: the first two saves write new ones (pwrite, then
    # mapped in the background), the next two wait for those mappings.
    for _ in range(4):
        tce.save(sd, path)
    st = client.status()
    mapped = client.mapped_buffers
    fd_requests = client.fd_requests
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for step in range(5):
        for t in sd.values():
            t.add_(1)
        tce.save(sd, path)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    pages = 5 * (128 << 20) // 4096
    assert client.mapped_buffers == mapped
    assert client.fd_requests == fd_requests
    assert client.status().buffers_created == st.buffers_created
    assert faults < pages * 0.02, f"{faults} page faults for {pages} pages written"
    assert torch.equal(tce.load(path, weights_only=True)["layer0"], sd["layer0"])


def test_a_first_save_is_written_with_pwrite_then_the_buffer_is_mapped(tmp_path):
    """A large save into a buffer this process has not mapped goes by pwrite
    (no page tables set up on the save's path); the buffer is mapped in the
    background, and saves into it after are plain copies (no fd, no
    pwrite). The file is the same torch zip either way: loaded from the
    cache and, once persisted, by torch.load from storage."""
    storage = tmp_path / "storage"
    storage.mkdir()
    server = LocalServer(memory_budget="1GiB", storage_roots=[str(storage)],
                         extra_args=["--memory-backing", "4k"]).start()
    try:
        with _knobs.override(socket=server.socket, job="pwrite", on_unavailable="raise"):
            client = _service.client()
            sd = {f"layer{i}": torch.randn(1 << 20) for i in range(20)}  # 80 MiB
            sd["half"] = sd["layer0"][::2]  # a view: shares layer0's storage
            sd["ints"] = torch.arange(1000, dtype=torch.int16)
            sd["step"] = 7
            path = str(storage / "model.pt")
            tce.save(sd, path)
            assert client.pwrite_saves == 1
            got = tce.load(path, weights_only=True)
            assert_same(got, sd)
            assert got["half"].untyped_storage().data_ptr() == got["layer0"].untyped_storage().data_ptr()
            del got
            tce.wait(path)
            assert_same(torch.load(path, weights_only=True), sd)  # no TCE in the way: the bytes on disk
            sd["layer1"].add_(1)
            tce.save(sd, path)  # the second buffer (the first holds the cached file)
            assert client.pwrite_saves == 2
            tce.wait(path)  # persisted: the older buffer is free again
            fd_requests = client.fd_requests
            for step in range(4):
                sd["layer2"].fill_(step)
                tce.save(sd, path)
                tce.wait(path)
            assert client.pwrite_saves == 2 and client.fd_requests == fd_requests
            assert client.mapped_buffers == 2
            assert_same(tce.load(path, weights_only=True), sd)
            assert_same(torch.load(path, weights_only=True), sd)
            api.close()
    finally:
        server.stop()
        server.cleanup()


def test_save_falls_back_to_torch_save_when_server_unreachable(tmp_path):
    path = tmp_path / "fallback.pt"
    with _knobs.override(socket=str(tmp_path / "nobody.sock")):
        _service._warned_fallback = False
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tce.save({"x": torch.ones(3)}, path)
            tce.save({"x": torch.ones(4)}, tmp_path / "second.pt")
        assert [str(w.message) for w in caught if "TCE" in str(w.message)] == [
            f"TCE: UNAVAILABLE: cannot reach the TCE server at {tmp_path / 'nobody.sock'}: "
            "No such file or directory; writing with plain torch.save instead "
            "(set TCE_ON_UNAVAILABLE=raise to make this an error)"
        ]
        assert torch.equal(torch.load(path)["x"], torch.ones(3))
        assert torch.equal(tce.load(path)["x"], torch.ones(3))  # load falls back too


def test_an_asynchronous_save_that_falls_back_returns_a_finished_handle(tmp_path, monkeypatch):
    path = tmp_path / "fallback.pt"
    with _knobs.override(socket=str(tmp_path / "nobody.sock")):
        monkeypatch.setattr(_service, "_warned_fallback", True)  # another test's business
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            staged = tce.save({"x": torch.ones(3)}, path, blocking=False)
            assert tce.save({"x": torch.ones(3)}, path) is None  # blocking: None, as before
        assert isinstance(staged, StagedSave) and staged.done()
        assert staged.wait(timeout=0) is None
        assert staged.path == str(path) and staged.size == path.stat().st_size
        assert torch.equal(torch.load(path)["x"], torch.ones(3))
    buf = io.BytesIO()
    staged = tce.save({"x": torch.ones(2)}, buf, blocking=False)
    assert isinstance(staged, StagedSave) and staged.done() and staged.wait(timeout=0) is None
    assert staged.path is None and staged.size is None
    buf.seek(0)
    assert torch.equal(torch.load(buf)["x"], torch.ones(2))


def test_unreachable_server_raises_when_configured(tmp_path):
    with _knobs.override(socket=str(tmp_path / "nobody.sock"), on_unavailable="raise"):
        with pytest.raises(tce.ServerUnavailableError, match="cannot reach the TCE server"):
            tce.save({"x": 1}, tmp_path / "x.pt")
    assert not (tmp_path / "x.pt").exists()


def test_cache_full_raises_or_falls_back(make_server, tmp_path):
    small = make_server("8MiB")
    big = {"w": torch.zeros(4 << 20)}  # 16 MiB
    with _knobs.override(socket=small.socket, on_unavailable="raise"):
        with pytest.raises(tce.CacheFullError, match="exceeds the cache budget"):
            tce.save(big, tmp_path / "big.pt")
        assert not (tmp_path / "big.pt").exists()
    with _knobs.override(socket=small.socket):
        tce.save({"w": torch.ones(10)}, tmp_path / "big.pt")  # an older cached copy...
        with pytest.warns(RuntimeWarning, match="RESOURCE_EXHAUSTED"):
            _service._warned_fallback = False
            tce.save(big, tmp_path / "big.pt")  # ...must not shadow the fallback file
        assert not tce.cached(tmp_path / "big.pt")
        assert torch.equal(tce.load(tmp_path / "big.pt")["w"], big["w"])


def test_server_restart_reconnects(make_server, tmp_path):
    s = make_server("64MiB")
    with _knobs.override(socket=s.socket):
        tce.save({"x": torch.ones(2)}, tmp_path / "a.pt")
        s.stop()
        s.start()
        assert not tce.cached(tmp_path / "a.pt")  # memory is gone with the server
        tce.save({"x": torch.ones(3)}, tmp_path / "a.pt")
        assert torch.equal(tce.load(tmp_path / "a.pt")["x"], torch.ones(3))


def test_file_like_targets_go_to_torch(server):
    import io

    buf = io.BytesIO()
    tce.save({"x": torch.ones(2)}, buf)
    buf.seek(0)
    assert torch.equal(tce.load(buf)["x"], torch.ones(2))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tensor_over_4gib_uses_zip64(make_server, tmp_path):
    s = make_server("9GiB")
    big = torch.empty((4 << 30) + 100, dtype=torch.uint8)
    big[:: 1 << 20] = 7  # touch sparsely; the rest is zero pages
    obj = {"big": big, "after": torch.arange(10)}
    path = tmp_path / "big.pt"
    with _knobs.override(socket=s.socket, on_unavailable="raise"):
        tce.save(obj, path)
        out = tce.load(path, weights_only=True)
        assert out["big"].shape == big.shape
        assert torch.equal(out["big"][:: 1 << 20], big[:: 1 << 20])
        assert torch.equal(out["big"][-100:], big[-100:])
        assert torch.equal(out["after"], torch.arange(10))
        info = _service.client().lookup(_knobs.get("job"), str(path))
        assert info.size > 1 << 32
        assert [r.name.split("/", 1)[1] for r in info.records][4:6] == ["data/0", "data/1"]
        assert info.records[5].header_offset > 1 << 32
        del out
        # the same through the patched torch.save / torch.load
        patched = tmp_path / "patched" / "big.pt"
        tce.patch_torch([patched.parent])
        try:
            torch.save(obj, patched)
            assert tce.cached(patched) and not patched.exists()
            out = torch.load(patched, weights_only=True)
            assert torch.equal(out["big"][:: 1 << 20], big[:: 1 << 20])
            assert torch.equal(out["big"][-100:], big[-100:])
            del out
        finally:
            tce.unpatch_torch()


def test_live_loads_do_not_pin_the_cache(make_server, tmp_path):
    s = make_server("40MiB")
    v = lambda x: {"w": torch.full((3 << 20,), float(x))}  # noqa: E731  12 MiB
    p1, p2 = str(tmp_path / "p1.pt"), str(tmp_path / "p2.pt")
    with _knobs.override(socket=s.socket, on_unavailable="raise"):
        tce.save(v(1), p1)                       # buffer A
        held = tce.load(p1, weights_only=True)   # leases A (views it copy-on-write)
        tce.save(v(2), p1)                       # B; A is replaced but still leased
        tce.save(v(3), p2)                       # C; 3 buffers fill the budget
        tce.save(v(4), p1)                       # full: our lease on A is detached, A reused
        client = _service.client()
        assert client.status().buffers_created == 3
        assert torch.equal(held["w"], v(1)["w"])  # the held load kept its own copy
        assert torch.equal(tce.load(p1, weights_only=True)["w"], v(4)["w"])
        assert torch.equal(tce.load(p2, weights_only=True)["w"], v(3)["w"])


def test_concurrent_clients(server, tmp_path):
    """Four processes save and load at once; each gets its own bytes back."""
    import subprocess
    import sys

    code = """
import os, sys, torch, tce
rank = int(sys.argv[1])
tce.configure(on_unavailable="raise")
for step in range(5):
    sd = {"w": torch.full((1 << 18,), float(rank * 100 + step))}
    path = os.path.join(sys.argv[2], f"rank{rank}.pt")
    tce.save(sd, path, rank=rank, tag=f"step{step}")
    assert torch.equal(tce.load(path, weights_only=True)["w"], sd["w"]), (rank, step)
print("ok", rank)
"""
    env = dict(os.environ, TCE_SOCKET=server.socket, TCE_JOB=_knobs.get("job"))
    procs = [subprocess.Popen([sys.executable, "-c", code, str(r), str(tmp_path)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(4)]
    for r, p in enumerate(procs):
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == f"ok {r}", err
    for r in range(4):
        assert tce.load(tmp_path / f"rank{r}.pt", weights_only=True)["w"][0].item() == r * 100 + 4
