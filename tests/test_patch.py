"""tce.patch_torch: torch.save / torch.load through the cache, by path prefix."""

from __future__ import annotations

import argparse
import io
import os
import pickle
import warnings

import pytest
import torch

import tce
from tce import api
from helpers import assert_same, every_dtype, sample_tensor

_ORIGINAL_SAVE, _ORIGINAL_LOAD = torch.save, torch.load


@pytest.fixture
def patched(server, tmp_path):
    root = tmp_path / "ckpt"
    tce.patch_torch([root])
    try:
        yield root
    finally:
        tce.unpatch_torch()


def _objects() -> dict:
    base = torch.arange(60, dtype=torch.float32).view(6, 10)
    return {
        "dtypes": {str(d): sample_tensor(d) for d in every_dtype()},
        "layouts": {"t": base.t(), "strided": base[::2, 1::3], "view": base[2:], "zero_dim": torch.tensor(3.5),
                    "empty": torch.empty(0, 4)},
        "shared": [base, base[1]],  # storage sharing survives
        "param": torch.nn.Parameter(torch.ones(3)),
        "module": torch.nn.Linear(3, 2).state_dict(),
        "optimizer": torch.optim.AdamW(torch.nn.Linear(2, 2).parameters()).state_dict(),
        "nested": [1, 2.5, "s", None, b"raw", (True, {"k": torch.ones(2, dtype=torch.int8)})],
    }


def test_patched_round_trip_goes_through_the_cache(patched):
    obj = _objects()
    path = patched / "a" / "model.pt"
    torch.save(obj, path)
    assert tce.cached(path) and not path.exists()  # nothing on disk: the cache has it
    out = torch.load(path, weights_only=True)
    assert_same(out, obj)
    assert out["shared"][1].untyped_storage().data_ptr() == out["shared"][0].untyped_storage().data_ptr()
    # torch.serialization's names are patched too
    assert torch.serialization.save is torch.save and torch.serialization.load is torch.load


def test_every_load_argument(patched):
    obj = {"w": torch.randn(4, 4), "ns": argparse.Namespace(lr=1.0)}
    path = str(patched / "args.pt")
    torch.save(obj, path, pickle_module=pickle, pickle_protocol=4)
    for map_location in (None, "cpu", torch.device("cpu"), {"cpu": "cpu"}, lambda s, loc: s):
        out = torch.load(path, map_location=map_location, weights_only=False)
        assert_same(out["w"], obj["w"]) and out["ns"].lr == 1.0
    assert torch.load(path, mmap=True, weights_only=False)["ns"] == obj["ns"]
    assert torch.load(path, map_location="meta", weights_only=False)["w"].is_meta
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        torch.load(path)  # torch's default is weights_only=True, and the patch keeps it
    out = torch.load(path, pickle_module=pickle, weights_only=False, encoding="utf-8")
    assert out["ns"].lr == 1.0


def test_other_paths_and_file_objects_reach_the_originals(patched, tmp_path):
    outside = tmp_path / "elsewhere.pt"
    torch.save({"x": torch.arange(3)}, outside)
    assert outside.exists() and not tce.cached(outside)
    assert torch.equal(torch.load(outside)["x"], torch.arange(3))
    buf = io.BytesIO()
    torch.save({"y": torch.ones(2)}, buf)
    buf.seek(0)
    assert torch.equal(torch.load(buf)["y"], torch.ones(2))
    # a sibling that merely shares the prefix's spelling is not under it
    sibling = tmp_path / "ckpt-other.pt"
    torch.save({"z": 1}, sibling)
    assert sibling.exists() and not tce.cached(sibling)


def test_legacy_format_goes_to_the_original(patched):
    path = patched / "legacy.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"x": torch.arange(5)}, path, _use_new_zipfile_serialization=False)
    assert path.exists() and not tce.cached(path)
    with open(path, "rb") as f:
        assert f.read(2) != b"PK"  # really the legacy (non-zip) format
    assert torch.equal(torch.load(path)["x"], torch.arange(5))
    nobyteorder = patched / "nbo.pt"
    torch.save({"x": torch.arange(5)}, nobyteorder, _disable_byteorder_record=True)
    assert nobyteorder.exists() and not tce.cached(nobyteorder)


def test_tce_fallback_does_not_recurse_into_the_patch(tmp_path):
    root = tmp_path / "ckpt"
    root.mkdir()
    tce.patch_torch([root])
    try:
        with tce.core._knobs.override(socket=str(tmp_path / "nothing.sock"), on_unavailable="fallback"):
            api.close()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.save({"x": torch.arange(4)}, root / "f.pt")  # server unreachable
            assert (root / "f.pt").exists()
            assert torch.equal(torch.load(root / "f.pt")["x"], torch.arange(4))
    finally:
        tce.unpatch_torch()


def test_unpatch_restores_and_patch_is_idempotent(server, tmp_path):
    tce.patch_torch([tmp_path / "a"])
    tce.patch_torch([tmp_path / "b"])  # replaces the prefixes, never wraps twice
    try:
        from tce.integrations._patch import patched_prefixes

        assert patched_prefixes() == (str(tmp_path / "b"),)
        torch.save({"x": 1}, tmp_path / "a.pt")
        assert (tmp_path / "a.pt").exists()
        torch.save({"x": 2}, tmp_path / "b" / "x.pt")
        assert tce.cached(tmp_path / "b" / "x.pt")
    finally:
        tce.unpatch_torch()
        tce.unpatch_torch()
    assert torch.save is _ORIGINAL_SAVE and torch.load is _ORIGINAL_LOAD
    assert torch.serialization.save is _ORIGINAL_SAVE and torch.serialization.load is _ORIGINAL_LOAD


@pytest.mark.parametrize("bad", [[], [""], [3]])
def test_bad_prefixes_are_refused(bad):
    with pytest.raises(ValueError, match="patch_torch"):
        tce.patch_torch(bad)
    assert torch.save is _ORIGINAL_SAVE


def test_patched_files_persist_as_torch_files(make_server, tmp_path):
    from tce.tools._server import LocalServer

    storage = tmp_path / "storage"
    storage.mkdir()
    s = LocalServer(memory_budget="64MiB", storage_roots=[str(storage)]).start()
    try:
        with tce.core._knobs.override(socket=s.socket, on_unavailable="raise"):
            tce.patch_torch([storage])
            try:
                obj = {"w": torch.randn(100), "n": 3}
                torch.save(obj, storage / "p.pt")
                tce.wait()
            finally:
                tce.unpatch_torch()
            assert_same(torch.load(storage / "p.pt"), obj)  # the original, from disk
            api.close()
    finally:
        s.stop()
        s.cleanup()
    assert os.path.getsize(storage / "p.pt") > 400
