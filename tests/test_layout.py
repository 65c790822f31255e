"""The torch-zip layout TCE writes: byte-identical to torch.save but CRCs."""

from __future__ import annotations

import argparse
import io
import pickle
import struct
import zipfile

import pytest
import torch

from tce.core import _layout
from helpers import assert_same, every_dtype, sample_tensor


def _mask(data: bytes) -> bytes:
    """Zero what legitimately differs: CRC-32 fields and the serialization id."""
    b = bytearray(data)
    for info in zipfile.ZipFile(io.BytesIO(data)).infolist():
        ho = info.header_offset
        name_len, extra_len = struct.unpack("<HH", b[ho + 26 : ho + 30])
        start = ho + 30 + name_len + extra_len
        if info.filename.endswith(".data/serialization_id"):
            b[start : start + info.file_size] = b"0" * info.file_size
        if info.file_size:
            b[start + info.file_size + 4 : start + info.file_size + 8] = bytes(4)
    p = b.find(b"PK\x01\x02")
    while b[p : p + 4] == b"PK\x01\x02":
        name_len, extra_len, comment_len = struct.unpack("<HHH", b[p + 28 : p + 34])
        b[p + 16 : p + 20] = bytes(4)
        p += 46 + name_len + extra_len + comment_len
    return bytes(b)


def _objects():
    base = torch.arange(120, dtype=torch.float32)
    yield "scalar", 42
    yield "views", {"a": base, "v": base[10:20], "t": base.view(12, 10).t(), "s": base[::3]}
    yield "dtypes", {str(d): sample_tensor(d) for d in every_dtype()}
    yield "shapes", {"zero_dim": torch.tensor(2.5), "empty": torch.empty(0),
                     "empty2d": torch.empty(3, 0), "big": torch.ones(1000, 33)}
    yield "nested", {"l": [base[:3], (base[3:5], {"x": 1})], "ns": argparse.Namespace(lr=0.1),
                     "s": "text", "b": b"bytes", "none": None, "f": 1.5}
    yield "grad", {"p": torch.nn.Parameter(torch.ones(4)), "r": torch.zeros(2).requires_grad_()}
    yield "untyped", base.untyped_storage()


@pytest.mark.parametrize("name,obj", list(_objects()), ids=[n for n, _ in _objects()])
def test_bytes_match_torch_save(tmp_path, name, obj):
    path = tmp_path / f"{name}.pt"
    torch.save(obj, path)
    ref = path.read_bytes()
    mine = _layout.plan(obj, path).to_bytes()
    assert len(mine) == len(ref)
    assert _mask(mine) == _mask(ref)


@pytest.mark.parametrize("name,obj", list(_objects()), ids=[n for n, _ in _objects()])
def test_torch_load_reads_layout(name, obj):
    # torch.load of our bytes gives what torch.load of torch.save's bytes gives
    ref = io.BytesIO()
    torch.save(obj, ref)
    ref.seek(0)
    data = _layout.plan(obj, "/x/model.pt").to_bytes()
    assert_same(torch.load(io.BytesIO(data), weights_only=False),
                torch.load(ref, weights_only=False))


def test_calculated_storage_offsets(tmp_path):
    # torch can compute record offsets from miniz's exact layout instead of
    # reading the directory; that only works if the layout is byte-exact.
    from torch.utils.serialization import config

    obj = {str(d): sample_tensor(d, 100) for d in every_dtype()}
    obj["empty"] = torch.empty(0)
    path = tmp_path / "x.pt"
    path.write_bytes(_layout.plan(obj, path).to_bytes())
    old = config.load.calculate_storage_offsets
    config.load.calculate_storage_offsets = True
    try:
        assert_same(torch.load(path, mmap=True, weights_only=True), obj)
    finally:
        config.load.calculate_storage_offsets = old


def test_records_are_aligned_and_listed():
    obj = {"a": torch.ones(10), "b": torch.zeros(3, dtype=torch.int8)}
    plan = _layout.plan(obj, "/ckpt/global_step10/mp_rank_00_model_states.pt")
    names = [r.name for r in plan.records]
    prefix = "mp_rank_00_model_states"
    assert names == [f"{prefix}/{n}" for n in (
        "data.pkl", ".format_version", ".storage_alignment", "byteorder",
        "data/0", "data/1", "version", ".data/serialization_id")]
    assert all(r.data_offset % 64 == 0 for r in plan.records)
    assert plan.storage_bytes == 43
    data = plan.to_bytes()
    z = zipfile.ZipFile(io.BytesIO(data))
    for r, info in zip(plan.records, z.infolist()):
        assert (info.filename, info.header_offset, info.file_size) == (r.name, r.header_offset, r.size)
        entry = data[r.central_offset : r.central_offset + 46 + len(r.name)]
        assert entry[:4] == b"PK\x01\x02" and entry[46:].decode() == r.name


def test_archive_name():
    assert _layout.archive_name("/a/b/model.pt") == "model"
    assert _layout.archive_name("a.b.pt") == "a.b"
    assert _layout.archive_name("/x/noext") == "noext"
    assert _layout.archive_name("/x/ünï.pt") == "archive"
    assert _layout.archive_name(None) == "archive"


def test_layout_cache_reused_for_same_structure():
    sd = {"w": torch.ones(64, 64), "step": 1}
    _layout.plan(sd, "/c/x.pt")
    hits = _layout.layout_cache.hits
    sd["w"].add_(1)
    p = _layout.plan(sd, "/c/x.pt")
    assert _layout.layout_cache.hits == hits + 1
    assert_same(torch.load(io.BytesIO(p.to_bytes())), sd)


def test_same_data_as_two_dtypes_is_refused_like_torch():
    t = torch.ones(4)
    obj = [t, t.view(torch.int32)]
    with pytest.raises(RuntimeError, match="view the same data as different types"):
        torch.save(obj, io.BytesIO())
    with pytest.raises(RuntimeError, match="view the same data as different types"):
        _layout.plan(obj, "/x.pt")


def test_the_pickle_memo_reuses_bytes_only_for_the_same_structure_and_values():
    from tce.core._layout import _pickle, pickle_memo, plan

    w = torch.randn(4, 3)
    shared = torch.arange(6.0)

    def sd(step, scale=1.0, share=True):
        return {"model": {"w": w, "a": shared[:2], "b": shared[2:] if share else shared.clone()[2:]},
                "opt": {"step": step, "lr": scale * 0.0, "names": ["w", "a"]}}

    cases = [sd(1), sd(1), sd(2), sd(2, scale=-1.0), sd(2, share=False), sd(2)]
    hits = pickle_memo.hits
    for obj in cases:
        pickled, storages = plan(obj, "/x/m.pt").pickled, plan(obj, "/x/m.pt").storages
        want, want_storages = _pickle(obj, pickle, 2)
        assert pickled == want  # a memo hit is byte for byte what the pickler writes
        assert [s._cdata for s in storages] == [s._cdata for s in want_storages]
    assert pickle_memo.hits > hits  # and hits happened
    # Unmodelled objects are pickled every time, correctly.
    odd = {"ns": argparse.Namespace(x=1), "t": w}
    assert plan(odd, "/x/m.pt").pickled == _pickle(odd, pickle, 2)[0]
