"""tce.patch_torch: torch.save / torch.load through the cache, by path prefix."""

from __future__ import annotations

import argparse
import io
import importlib
import os
import pickle
import sys
import types
import warnings

import pytest
import torch

import tce
from tce import api, buffers
from conftest import run_python
from helpers import assert_same, every_dtype, sample_tensor

# Not module attributes: the patch rebinds those that are these functions.
_ORIGINAL = types.SimpleNamespace(save=torch.save, load=torch.load)


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
    assert torch.save is _ORIGINAL.save and torch.load is _ORIGINAL.load
    assert torch.serialization.save is _ORIGINAL.save and torch.serialization.load is _ORIGINAL.load


@pytest.mark.parametrize("bad", [[], [""], [3]])
def test_bad_prefixes_are_refused(bad):
    with pytest.raises(ValueError, match="patch_torch"):
        tce.patch_torch(bad)
    assert torch.save is _ORIGINAL.save


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


# ---------------------------------------------------------------------------
# Names modules bound to the functions: ``from torch import save``
# ---------------------------------------------------------------------------

# A user's module, written into tmp_path and imported: it calls the names it
# bound, as a training script does.
_USER_MODULE = """
import os

from safetensors.torch import load_file, save_file
from torch import load, save


def save_both(state, tensors, root):
    save(state, os.path.join(root, "model.pt"))
    save_file(tensors, os.path.join(root, "model.safetensors"))


def load_both(root):
    return (load(os.path.join(root, "model.pt"), weights_only=True),
            load_file(os.path.join(root, "model.safetensors")))
"""

# The same module, made a module type whose attributes cannot be set.
_READ_ONLY_MODULE = _USER_MODULE + """
import sys
import types


class _ReadOnly(types.ModuleType):
    def __setattr__(self, name, value):
        raise AttributeError(f"{name} is read-only")


sys.modules[__name__].__class__ = _ReadOnly
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """Writes a module into tmp_path and imports it: ``load(name, source)``."""
    pytest.importorskip("safetensors.torch")
    monkeypatch.syspath_prepend(str(tmp_path))
    names: list[str] = []

    def load(name: str, source: str = _USER_MODULE) -> types.ModuleType:
        (tmp_path / f"{name}.py").write_text(source)
        names.append(name)
        return importlib.import_module(name)

    yield load
    for name in names:
        sys.modules.pop(name, None)


def _saved(module: types.ModuleType, root) -> tuple[dict, dict]:
    """Saves through the module's names under root; returns what it saved."""
    state = {"w": torch.randn(8, 4), "step": 3}
    tensors = {"ids": torch.arange(4), "w": torch.randn(5, 3)}  # in the file's (sorted) order
    module.save_both(state, tensors, str(root))
    return state, tensors


def _assert_through_the_cache(module: types.ModuleType, root) -> None:
    import safetensors.torch as st

    state, tensors = _saved(module, root)
    pt, sf = root / "model.pt", root / "model.safetensors"
    assert tce.cached(pt) and tce.cached(sf)
    assert not pt.exists() and not sf.exists()  # nothing on disk: the cache has them
    with buffers.open_fd(sf) as cached:
        assert os.pread(cached.fd, cached.size, 0) == st.save(tensors)
    loaded_state, loaded_tensors = module.load_both(str(root))
    assert_same(loaded_state, state)
    assert_same(loaded_tensors, tensors)


def _assert_originals(module: types.ModuleType) -> None:
    from tce.integrations import safetensors as tst

    assert module.save is _ORIGINAL.save and module.load is _ORIGINAL.load
    assert (module.save_file, module.load_file) == tst.originals()


def test_names_bound_before_the_patch_go_through_the_cache(server, tmp_path, user_module):
    module = user_module("bound_before_patch")
    root = tmp_path / "ckpt"
    root.mkdir()
    tce.patch_torch([root])
    try:
        assert module.save is torch.save and module.load is torch.load
        _assert_through_the_cache(module, root)
        # TCE's own fallbacks keep the originals
        assert buffers.torch_save is _ORIGINAL.save and buffers.torch_load is _ORIGINAL.load
    finally:
        tce.unpatch_torch()
    _assert_originals(module)


def test_names_bound_after_the_patch_go_through_the_cache(server, tmp_path, user_module):
    root = tmp_path / "ckpt"
    root.mkdir()
    tce.patch_torch([root])
    try:
        module = user_module("bound_after_patch")
        _assert_through_the_cache(module, root)
    finally:
        tce.unpatch_torch()
    _assert_originals(module)


def test_a_module_whose_names_cannot_be_set_keeps_the_originals_with_one_warning(
        server, tmp_path, user_module):
    module = user_module("read_only_names", _READ_ONLY_MODULE)
    root = tmp_path / "ckpt"
    root.mkdir()
    with pytest.warns(RuntimeWarning, match="'read_only_names' keeps the unpatched function") as caught:
        tce.patch_torch([root])
    try:
        assert len([w for w in caught if "read_only_names" in str(w.message)]) == 1
        _assert_originals(module)
        _saved(module, root)  # the originals write to disk
        assert (root / "model.pt").exists() and not tce.cached(root / "model.pt")
        assert (root / "model.safetensors").exists() and not tce.cached(root / "model.safetensors")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once per module
            tce.unpatch_torch()
            tce.patch_torch([root])
    finally:
        tce.unpatch_torch()
    _assert_originals(module)


def test_a_script_that_imports_the_names_before_patching(server, tmp_path):
    pytest.importorskip("safetensors.torch")
    out = run_python(f"""
import os

from safetensors.torch import save_file
from torch import save

import tce
import torch

root = {str(tmp_path)!r}
tce.patch_torch([root])
save_file({{"w": torch.arange(6.0)}}, os.path.join(root, "model.safetensors"))
save({{"w": torch.arange(6.0)}}, os.path.join(root, "model.pt"))
for name in ("model.safetensors", "model.pt"):
    path = os.path.join(root, name)
    print("RESULT", name, tce.cached(path), os.path.exists(path))
""", env={"TCE_SOCKET": server.socket, "TCE_JOB": f"script-{os.getpid()}",
          "TCE_ON_UNAVAILABLE": "raise"})
    assert [line.split()[1:] for line in out.splitlines() if line.startswith("RESULT")] == [
        ["model.safetensors", "True", "False"], ["model.pt", "True", "False"]], out
