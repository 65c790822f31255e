"""safetensors files through the cache: tce.integrations.safetensors, the
patch of safetensors.torch, and Hugging Face's save_pretrained under it."""

from __future__ import annotations

import os
import types
import warnings

import pytest
import torch

import tce
from tce import api, buffers
from tce.core import _knobs
from tce.integrations import safetensors as tst
from tce.tools._server import LocalServer
from conftest import run_python

st = pytest.importorskip("safetensors.torch")
# Not module attributes: the patch rebinds those that are these functions.
_ORIGINAL = types.SimpleNamespace(save=st.save_file, load=st.load_file)


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    base = torch.randn(64, generator=g)
    return {
        "w": torch.randn(16, 8, generator=g),
        "bf16": torch.randn(33, generator=g).to(torch.bfloat16),
        "f16": torch.randn(5, 3, generator=g).to(torch.float16),
        "ids": torch.arange(-5, 7, dtype=torch.int64),
        "mask": torch.rand(9, generator=g) > 0.5,
        "f8": torch.randn(6, generator=g).to(torch.float8_e4m3fn),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 4),
        "head": base[:10], "tail": base[10:],  # one storage, no overlap
    }


def _cached_bytes(path) -> bytes:
    with buffers.open_fd(path) as cached:
        return os.pread(cached.fd, cached.size, 0)


@pytest.fixture
def persisting(tmp_path):
    """A private server that persists under tmp_path/storage (the yield)."""
    storage = tmp_path / "storage"
    storage.mkdir()
    s = LocalServer(memory_budget="256MiB", storage_roots=[str(storage)],
                    extra_args=["--memory-backing", "4k"]).start()
    try:
        with _knobs.override(socket=s.socket, job="st", on_unavailable="raise"):
            yield storage
            api.close()
    finally:
        code = s.stop()
        s.cleanup()
        assert code == 0, s.log()


def test_save_file_writes_safetensors_bytes_into_the_cache(server, tmp_path):
    tensors = _tensors()
    path = tmp_path / "model.safetensors"
    info = tst.save_file(tensors, path, metadata={"format": "pt"}, tag="t1")
    assert info.path == str(path) and info.tag == "t1" and tce.cached(path)
    assert not path.exists()  # a memory-only server: the cache has it
    assert _cached_bytes(path) == st.save(tensors, metadata={"format": "pt"})
    assert info.size == len(st.save(tensors, metadata={"format": "pt"}))


def test_load_file_views_one_private_mapping_of_the_cache(server, tmp_path):
    tensors = _tensors()
    path = tmp_path / "m.safetensors"
    tst.save_file(tensors, path)
    out = tst.load_file(path)
    _ORIGINAL.save(tensors, tmp_path / "disk.safetensors")
    assert list(out) == list(_ORIGINAL.load(tmp_path / "disk.safetensors"))  # file order
    for name, t in tensors.items():
        assert out[name].dtype == t.dtype and out[name].shape == t.shape
        assert torch.equal(out[name].view(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))
    # every tensor views the cached file, where its header puts it (no copy)
    header = buffers.read_safetensors_header(_cached_bytes(path))
    for a, b in (("w", "ids"), ("w", "bf16"), ("ids", "mask")):
        assert out[b].data_ptr() - out[a].data_ptr() == \
            header.tensors[b].start - header.tensors[a].start
    out["w"].fill_(0)  # copy-on-write: the cache keeps its bytes
    assert torch.equal(tst.load_file(path)["w"], tensors["w"])
    assert _cached_bytes(path) == st.save(tensors)


def test_load_file_of_an_uncached_file_is_safetensors_own(server, tmp_path):
    path = tmp_path / "plain.safetensors"
    st.save_file({"a": torch.arange(4)}, path)
    out = tst.load_file(path, backend="pread")  # options reach safetensors
    assert torch.equal(out["a"], torch.arange(4)) and not tce.cached(path)


def test_a_corrupt_cached_file_is_refused(server, tmp_path):
    path = tmp_path / "bad.safetensors"
    dest = buffers.allocate(path, 16)
    dest.view[:] = b"\x40" + bytes(7) + b"{}      "  # a header length past the end
    dest.commit()
    with pytest.raises(tce.CorruptCheckpointError, match=f"{path}: header length 64 runs past"):
        tst.load_file(path)


def test_refusals_allocate_nothing(server, tmp_path):
    x = torch.zeros(8)
    path = tmp_path / "shared.safetensors"
    with pytest.raises(RuntimeError, match="share memory"):
        tst.save_file({"a": x, "b": x[2:]}, path)
    with pytest.raises(ValueError, match="non contiguous"):
        tst.save_file({"a": torch.zeros(3, 2).t()}, path)
    assert not tce.cached(path)


def test_a_missing_directory_is_refused(persisting):
    with pytest.raises(tce.MissingDirectoryError) as e:
        tst.save_file({"a": torch.zeros(2)}, persisting / "no" / "such.safetensors")
    assert isinstance(e.value, FileNotFoundError)
    assert not (persisting / "no").exists()


def test_without_a_server_the_file_is_written_directly(tmp_path):
    path = tmp_path / "direct.safetensors"
    tensors = _tensors()
    with _knobs.override(socket=str(tmp_path / "nothing.sock"), on_unavailable="fallback"):
        api.close()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert tst.save_file(tensors, path) is None
        assert path.read_bytes() == st.save(tensors)
        assert torch.equal(tst.load_file(path)["w"], tensors["w"])
        api.close()


def test_persisted_file_is_the_safetensors_file(persisting):
    tensors = _tensors()
    path = persisting / "p.safetensors"
    tst.save_file(tensors, path, metadata={"format": "pt"})
    tce.wait([path])
    assert path.read_bytes() == st.save(tensors, metadata={"format": "pt"})
    assert torch.equal(_ORIGINAL.load(path)["bf16"], tensors["bf16"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_tensors_save_and_load(server, tmp_path):
    tensors = _tensors()
    on_gpu = {k: v.cuda() for k, v in tensors.items()}
    path = tmp_path / "gpu.safetensors"
    tst.save_file(on_gpu, path)
    assert _cached_bytes(path) == st.save(tensors)
    out = tst.load_file(path, device="cuda:0")
    assert all(t.device.type == "cuda" for t in out.values())
    assert torch.equal(out["w"].cpu(), tensors["w"]) and out["empty"].shape == (0, 4)
    assert tst.load_file(path, device=0)["ids"].device == torch.device("cuda", 0)


# ---------------------------------------------------------------------------
# The patch
# ---------------------------------------------------------------------------


@pytest.fixture
def patched(server, tmp_path):
    root = tmp_path / "ckpt"
    root.mkdir()
    tce.patch_torch([root])
    try:
        yield root
    finally:
        tce.unpatch_torch()


def test_patched_safetensors_goes_through_the_cache_under_the_prefix(patched, tmp_path):
    tensors = _tensors()
    inside, outside = patched / "m.safetensors", tmp_path / "m.safetensors"
    st.save_file(tensors, inside, metadata={"format": "pt"})
    st.save_file(tensors, outside, metadata={"format": "pt"})
    assert tce.cached(inside) and not inside.exists()
    assert outside.exists() and not tce.cached(outside)
    assert _cached_bytes(inside) == outside.read_bytes()
    out = st.load_file(inside)
    assert torch.equal(out["w"], tensors["w"]) and torch.equal(st.load_file(outside)["w"], out["w"])
    # save_model / load_model call the module's names: patched too
    model = torch.nn.Linear(4, 3)
    st.save_model(model, patched / "linear.safetensors")
    assert tce.cached(patched / "linear.safetensors")
    fresh = torch.nn.Linear(4, 3)
    st.load_model(fresh, patched / "linear.safetensors")
    assert torch.equal(fresh.weight, model.weight)


def test_patched_save_of_a_dtype_tce_does_not_name_reaches_safetensors(patched):
    e8m0 = {"x": torch.full((2,), 4.0).to(torch.float8_e8m0fnu)}
    st.save_file(e8m0, patched / "e8m0.safetensors")
    assert _cached_bytes(patched / "e8m0.safetensors") == st.save(e8m0)
    path = patched / "f4.safetensors"
    st.save_file(dict(e8m0, y=torch.zeros(2, dtype=torch.float4_e2m1fn_x2)), path)
    assert path.exists() and not tce.cached(path)  # safetensors wrote it


def test_patched_refusals_are_safetensors_own(patched):
    x = torch.zeros(4)
    with pytest.raises(RuntimeError, match="share memory"):
        st.save_file({"a": x, "b": x}, patched / "s.safetensors")
    with pytest.raises(ValueError, match="non contiguous"):
        st.save_file({"a": torch.zeros(2, 2).t()}, patched / "s.safetensors")


def test_unpatch_restores_safetensors(server, tmp_path):
    tce.patch_torch([tmp_path])
    tce.patch_torch([tmp_path / "b"])  # never wraps twice
    try:
        assert st.save_file is not _ORIGINAL.save and st.load_file is not _ORIGINAL.load
    finally:
        tce.unpatch_torch()
        tce.unpatch_torch()
    assert st.save_file is _ORIGINAL.save and st.load_file is _ORIGINAL.load
    st.save_file({"a": torch.ones(1)}, tmp_path / "x.safetensors")
    assert (tmp_path / "x.safetensors").exists() and not tce.cached(tmp_path / "x.safetensors")


def test_durable_patch_returns_once_on_storage(persisting):
    tce.patch_torch([persisting], durable=True)
    try:
        tensors = {"w": torch.randn(100)}
        st.save_file(tensors, persisting / "d.safetensors")
        assert (persisting / "d.safetensors").read_bytes() == st.save(tensors)
    finally:
        tce.unpatch_torch()


# ---------------------------------------------------------------------------
# Hugging Face transformers
# ---------------------------------------------------------------------------

def _tiny_model():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=32,
                                     vocab_size=128)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def test_save_pretrained_goes_through_the_cache(persisting, tmp_path):
    import transformers.modeling_utils as mu

    model = _tiny_model()  # transformers imported before the patch: its names are rebound
    plain = tmp_path / "plain"
    model.save_pretrained(plain)
    target = persisting / "tiny"
    target.mkdir()
    tce.patch_torch([persisting])
    try:
        assert mu.safe_save_file is st.save_file
        model.save_pretrained(target)
        weights = target / "model.safetensors"
        assert tce.cached(weights)  # (the server may have persisted it already)
        tce.wait()
    finally:
        tce.unpatch_torch()
    assert mu.safe_save_file is _ORIGINAL.save
    assert weights.read_bytes() == (plain / "model.safetensors").read_bytes()
    loaded = type(model).from_pretrained(target)
    assert loaded.state_dict().keys() == model.state_dict().keys()
    for name, t in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], t), name


def test_save_pretrained_when_transformers_is_imported_after_the_patch(persisting):
    pytest.importorskip("transformers")
    out = run_python(f"""
import os, tce, torch, safetensors.torch as st
tce.patch_torch([{str(persisting)!r}])
import transformers
from transformers import modeling_utils as mu
assert mu.safe_save_file is st.save_file
config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                  num_attention_heads=2, num_key_value_heads=2, vocab_size=128)
model = transformers.LlamaForCausalLM(config)
target = os.path.join({str(persisting)!r}, "llama")
model.save_pretrained(target)
weights = os.path.join(target, "model.safetensors")
assert tce.cached(weights)
tce.wait()
tce.unpatch_torch()
assert mu.safe_save_file is st.save_file and st.save_file.__module__ == "safetensors.torch"
loaded = transformers.LlamaForCausalLM.from_pretrained(target)
same = all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())
print("RESULT", "same" if same else "differ", len(model.state_dict()))
""", env={"TCE_SOCKET": _knobs.get("socket"), "TCE_JOB": "st", "TCE_ON_UNAVAILABLE": "raise"},
        timeout=240)
    assert out.split("RESULT ")[1].split()[0] == "same", out
