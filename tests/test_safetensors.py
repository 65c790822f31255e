"""safetensors files through the cache: tce.integrations.safetensors."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

import tce
from tce import api, client
from tce.core import _knobs
from tce.integrations import safetensors as tst
from tce.tools._server import LocalServer

st = pytest.importorskip("safetensors.torch")
_ORIGINAL_SAVE, _ORIGINAL_LOAD = st.save_file, st.load_file


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
    with client.open_fd(path) as cached:
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
    _ORIGINAL_SAVE(tensors, tmp_path / "disk.safetensors")
    assert list(out) == list(_ORIGINAL_LOAD(tmp_path / "disk.safetensors"))  # file order
    for name, t in tensors.items():
        assert out[name].dtype == t.dtype and out[name].shape == t.shape
        assert torch.equal(out[name].view(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))
    # every tensor views the cached file, where its header puts it (no copy)
    header = client.read_safetensors_header(_cached_bytes(path))
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
    dest = client.allocate(path, 16)
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
    assert torch.equal(_ORIGINAL_LOAD(path)["bf16"], tensors["bf16"])


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
