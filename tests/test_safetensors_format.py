"""The safetensors format (tce.core._safetensors): the writer's bytes against
the safetensors library's, its refusals against the library's, and the
strict reader against hostile bytes."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from tce import buffers
from tce.errors import CorruptCheckpointError

st = pytest.importorskip("safetensors.torch")


def _ours(tensors, metadata=None) -> bytes:
    layout = buffers.safetensors_layout(tensors, metadata)
    out = torch.zeros(layout.size, dtype=torch.uint8)
    layout.write(out)
    return bytes(out.numpy())


def _sample(dtype: torch.dtype, shape=(3, 5)) -> torch.Tensor:
    """Distinct bytes in every element (random bits, viewed as ``dtype``)."""
    n = dtype.itemsize * max(1, torch.Size(shape).numel())
    raw = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype)[:torch.Size(shape).numel()].reshape(shape).clone()


EVERY_DTYPE = list(buffers.SAFETENSORS_DTYPES.values())


@pytest.mark.parametrize("dtype", EVERY_DTYPE, ids=str)
def test_each_dtype_is_byte_equal(dtype):
    tensors = {"t": _sample(dtype), "scalar": _sample(dtype, ()), "empty": _sample(dtype, (0, 4))}
    assert _ours(tensors) == st.save(tensors)


def test_every_dtype_in_one_file_is_ordered_as_safetensors_orders_it():
    # One tensor per dtype, names against the dtype order, plus ties broken by name.
    tensors = {f"{i:02d}": _sample(d, (i % 3 + 1,)) for i, d in enumerate(EVERY_DTYPE)}
    tensors.update({"b": _sample(torch.float32), "a": _sample(torch.float32, (2,)),
                    "é\"\n\x01\u2028": _sample(torch.int8, (1,))})
    assert _ours(tensors) == st.save(tensors)


@pytest.mark.parametrize("metadata", [None, {}, {"format": "pt"}, {"k\x7f\"\\/": "v\n\té€"}])
def test_metadata_is_byte_equal(metadata):
    tensors = {"w": _sample(torch.bfloat16), "b": _sample(torch.float16, (7,))}
    assert _ours(tensors, metadata) == st.save(tensors, metadata=metadata)


def test_several_metadata_entries_keep_their_order_and_read_back_alike():
    # safetensors orders several entries by a hash; TCE keeps the dict's
    # order: the same header length, tensors and bytes, an equal reading.
    tensors = {"w": _sample(torch.float32)}
    metadata = {f"key{i}": str(i) for i in range(12)}
    ours, theirs = _ours(tensors, metadata), st.save(tensors, metadata=metadata)
    assert len(ours) == len(theirs) and ours[-60:] == theirs[-60:]
    head = json.loads(ours[8:8 + struct.unpack("<Q", ours[:8])[0]])
    assert list(head["__metadata__"]) == list(metadata)
    assert buffers.read_safetensors_header(ours).metadata == metadata
    assert torch.equal(st.load(ours)["w"], tensors["w"])


def test_views_into_one_storage_that_do_not_overlap_are_byte_equal():
    base = torch.arange(40, dtype=torch.float32)
    tensors = {"head": base[:10], "tail": base[10:].view(6, 5), "offset": torch.arange(9)[3:],
               "empty": base[3:3]}  # an empty tensor shares nothing
    assert tensors["tail"].storage_offset() == 10
    assert _ours(tensors) == st.save(tensors)


def _refusal(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return e
    raise AssertionError("no exception")


x = torch.zeros(10)
REFUSED = {
    "not a dict": (["x"], None),
    "not a tensor": ({"a": torch.zeros(1), "b": None}, None),
    "sparse": ({"a": torch.zeros(3).to_sparse()}, None),
    "shared storage": ({"a": x, "b": x}, None),
    "overlapping views": ({"a": x[:6], "b": x[5:]}, None),
    "non-contiguous (transposed)": ({"a": torch.zeros(4, 3).t()}, None),
    "non-contiguous (strided)": ({"a": torch.zeros(10)[::2]}, None),
    "name not a str": ({1: torch.zeros(1)}, None),
    "metadata value not a str": ({"a": torch.zeros(1)}, {"k": 1}),
    "metadata not a dict": ({"a": torch.zeros(1)}, [("k", "v")]),
    "meta device": ({"a": torch.zeros(2, device="meta")}, None),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refusals_match_safetensors(case):
    tensors, metadata = REFUSED[case]
    theirs = _refusal(lambda: st.save(tensors, metadata=metadata))
    ours = _refusal(lambda: buffers.safetensors_layout(tensors, metadata))
    assert type(ours) is type(theirs), f"{case}: safetensors raises {theirs!r}, TCE {ours!r}"


def test_refused_beyond_safetensors():
    # safetensors writes this file, then cannot read its own header back
    with pytest.raises(ValueError, match="__metadata__"):
        buffers.safetensors_layout({"__metadata__": torch.zeros(1)})
    with pytest.raises(ValueError, match="complex128"):
        buffers.safetensors_layout({"c": torch.zeros(1, dtype=torch.complex128)})


# ---------------------------------------------------------------------------
# The reader
# ---------------------------------------------------------------------------


def test_reader_views_the_buffer_without_copying():
    tensors = {"w": _sample(torch.float32, (4, 3)), "i": torch.arange(6), "s": torch.tensor(True),
               "e": torch.empty(0, 2, dtype=torch.bfloat16), "f8": _sample(torch.float8_e4m3fn)}
    buf = bytearray(st.save(tensors, metadata={"format": "pt"}))
    out = dict(buffers.iter_safetensors(buf))
    assert set(out) == set(tensors)
    for name, t in tensors.items():
        assert out[name].dtype == t.dtype and out[name].shape == t.shape
        assert torch.equal(out[name].view(torch.uint8), t.view(torch.uint8)) if t.dim() else \
            out[name].item() == t.item()
    header = buffers.read_safetensors_header(buf)
    start = header.tensors["i"].start
    buf[start:start + 8] = struct.pack("<q", -7)  # the tensor sees the buffer's bytes
    assert out["i"][0].item() == -7
    base = torch.frombuffer(buf, dtype=torch.uint8).data_ptr()
    assert out["w"].data_ptr() == base + header.tensors["w"].start


def test_reader_order_is_file_order_as_safetensors_load_file(tmp_path):
    tensors = {"z": torch.zeros(2, dtype=torch.int64), "a": torch.zeros(3, dtype=torch.int8),
               "m": torch.zeros(1)}
    st.save_file(tensors, tmp_path / "f.safetensors")
    data = bytearray((tmp_path / "f.safetensors").read_bytes())
    assert [n for n, _ in buffers.iter_safetensors(data)] == \
        list(st.load_file(tmp_path / "f.safetensors"))


def test_header_fields():
    tensors = {"a": torch.zeros(2, 3, dtype=torch.float16), "b": torch.zeros((), dtype=torch.int64)}
    data = st.save(tensors, metadata={"format": "pt"})
    header = buffers.read_safetensors_header(data)
    n = struct.unpack("<Q", data[:8])[0]
    assert header.data_start == 8 + n and header.file_size == len(data)
    assert header.metadata == {"format": "pt"}
    assert header.tensors == {
        "b": (torch.int64, (), 8 + n, 8 + n + 8),
        "a": (torch.float16, (2, 3), 8 + n + 8, 8 + n + 20)}
    # the header alone, with the file's size, reads the same
    assert buffers.safetensors_header_size(data[:8], len(data)) == 8 + n
    assert buffers.read_safetensors_header(data[:8 + n], file_size=len(data)) == header


def test_names_filter():
    tensors = {"a": torch.ones(2), "b": torch.zeros(3, dtype=torch.int32), "c": torch.ones(1)}
    data = bytearray(st.save(tensors))
    got = dict(buffers.iter_safetensors(data, names=["c", "b"]))
    assert set(got) == {"b", "c"} and torch.equal(got["b"], tensors["b"])
    with pytest.raises(KeyError, match="'nope'"):
        buffers.iter_safetensors(data, names=["a", "nope"])


def _file(header, data: bytes = b"", *, length: int | None = None) -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + data


F32x2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
HOSTILE = {
    "shorter than the length field": (b"\x08\x00\x00", "shorter than the 8-byte header length"),
    "header over the limit": (_file(b"{}", length=100_000_001), "over the 100000000-byte limit"),
    "absurd header length": (_file(b"{}", length=2**64 - 1), "over the 100000000-byte limit"),
    "header past the end": (_file(b"{}  ", length=64), "runs past the end of the file"),
    "not UTF-8": (_file(b'{"\xff":1}'), "not UTF-8"),
    "not JSON": (_file(b'{"a": '), "not JSON"),
    "NaN": (_file(b'{"a": NaN}'), "not JSON (NaN)"),
    "not an object": (_file(b"[1, 2]"), "a JSON list, not an object"),
    "entry not an object": (_file({"a": 3}), "'a': its entry is not a JSON object"),
    "no dtype": (_file({"a": {"shape": [], "data_offsets": [0, 0]}}), "'a': no 'dtype'"),
    "unknown dtype": (_file({"a": dict(F32x2, dtype="F31")}, bytes(8)), "unknown dtype 'F31'"),
    "dtype not a string": (_file({"a": dict(F32x2, dtype=4)}, bytes(8)), "unknown dtype 4"),
    "negative dim": (_file({"a": dict(F32x2, shape=[-2])}, bytes(8)), "shape [-2] is not a list"),
    "float dim": (_file({"a": dict(F32x2, shape=[2.0])}, bytes(8)), "shape [2.0] is not a list"),
    "bool dim": (_file({"a": dict(F32x2, shape=[True, 2])}, bytes(8)), "is not a list of counts"),
    "three offsets": (_file({"a": dict(F32x2, data_offsets=[0, 4, 8])}, bytes(8)),
                      "not two counts"),
    "negative offset": (_file({"a": dict(F32x2, data_offsets=[-8, 0])}, bytes(8)),
                        "not two counts"),
    "offsets reversed": (_file({"a": dict(F32x2, data_offsets=[8, 0])}, bytes(8)),
                         "end before they start"),
    "size not shape times itemsize": (_file({"a": dict(F32x2, shape=[3])}, bytes(8)),
                                      "8 bytes for shape [3] of F32 (12 bytes)"),
    "huge shape": (_file({"a": dict(F32x2, shape=[2**62, 2**62])}, bytes(8)), "bytes for shape"),
    "past the data area": (_file({"a": dict(F32x2, data_offsets=[0, 8])}, bytes(4)),
                           "ends at 8, past the data area (4 bytes)"),
    "overlap": (_file({"a": F32x2, "b": dict(F32x2, data_offsets=[4, 12])}, bytes(12)),
                "'b' at [4, 12) overlaps the bytes before it"),
    "hole": (_file({"a": F32x2, "b": dict(F32x2, data_offsets=[12, 20])}, bytes(20)),
             "'b' starts at 12, leaving a hole of 4 bytes"),
    "hole before the first": (_file({"a": dict(F32x2, data_offsets=[4, 12])}, bytes(12)),
                              "leaving a hole of 4 bytes after 0"),
    "bytes after the last": (_file({"a": F32x2}, bytes(9)), "1 bytes after the last tensor"),
    "duplicated name": (_file(b'{"a":' + json.dumps(F32x2).encode() + b',"a":'
                              + json.dumps(F32x2).encode() + b"}", bytes(8)), "names 'a' twice"),
    "duplicated metadata key": (_file(b'{"__metadata__":{"k":"1","k":"2"}}'), "names 'k' twice"),
    "metadata not strings": (_file({"__metadata__": {"k": 1}}), "not a map of strings to strings"),
    "deep nesting": (_file(b"[" * 100_000 + b"]" * 100_000), "not JSON"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_bytes_are_refused(case):
    data, fault = HOSTILE[case]
    with pytest.raises(CorruptCheckpointError) as e:
        buffers.iter_safetensors(bytearray(data), source="/ckpt/evil.safetensors")
    assert e.value.message.startswith("/ckpt/evil.safetensors: ")
    assert fault in e.value.message
    assert isinstance(e.value, ValueError)


def test_what_safetensors_reads_tce_reads():
    # the same edge cases both accept: no tensors, zero-size tensors, null metadata
    for data in (_file(b"{}"), _file({"__metadata__": None}),
                 _file({"e": {"dtype": "I64", "shape": [0], "data_offsets": [0, 0]},
                        "f": {"dtype": "U8", "shape": [2, 0], "data_offsets": [0, 0]}}),
                 _file(b' {"a":' + json.dumps(F32x2).encode() + b"}  \n ", bytes(8))):
        theirs = st.load(data)
        ours = dict(buffers.iter_safetensors(bytearray(data)))
        assert ours.keys() == theirs.keys()
        assert all(torch.equal(ours[k], theirs[k]) for k in ours)
