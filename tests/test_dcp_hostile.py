"""tce.dcp.StorageReader against hostile checkpoint files: a forged
``.metadata`` (on storage or in the cache) runs nothing, and storage data
or tensor headers that point outside their files are refused with
``CorruptCheckpointError``, before any byte outside them is read."""

from __future__ import annotations

import collections
import io
import os
import pathlib
import pickle
import re

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata

import tce
import tce.dcp
from tce import _service
from tce.integrations._dcp_item import FdSource, Layout, tensor_layout


def _load_error(state_dict: dict, reader: tce.dcp.StorageReader) -> BaseException:
    """What dcp.load raised on the (only) rank."""
    with pytest.raises(CheckpointException) as e:
        dcp.load(state_dict, storage_reader=reader, no_dist=True)
    (exc, _), = e.value.failures.values()
    return exc


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _save(path: pathlib.Path, state_dict: dict) -> Metadata:
    """``state_dict`` saved by DCP's own FileSystemWriter; its metadata."""
    dcp.save(state_dict, storage_writer=dcp.FileSystemWriter(path), no_dist=True)
    return pickle.loads((path / ".metadata").read_bytes())


class _System:
    """Unpickles to ``os.system(command)`` (under its own name, posix.system)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def _str4(s: str) -> bytes:
    """A protocol-4 short string opcode."""
    return b"\x8c" + bytes([len(s)]) + s.encode()


# A pickle that sets an attribute of the Metadata class itself (BUILD on
# the class, with slot state), for the whole process.
_SET_CLASS_ATTRIBUTE = (b"\x80\x02ctorch.distributed.checkpoint.metadata\nMetadata\n"
                        b"N}X\x0a\x00\x00\x00tce_forgedK\x01s\x86b.")


def _forgeries(tmp_path: pathlib.Path, marker: pathlib.Path) -> dict[str, tuple[bytes, str]]:
    """Forged .metadata contents: name -> (bytes, fragment of the refusal)."""
    touch = f"touch {marker}"
    real = _save(tmp_path / "real", {"a": torch.ones(2)})
    real.planner_data = {"a": ("a",), "x": _System(touch)}
    # A dotted name (protocol 4) reaching os.system through a module the
    # allow list knows.
    dotted = (b"\x80\x04" + _str4("torch.distributed.checkpoint.metadata") + _str4("os.system")
              + b"\x93" + _str4(touch) + b"\x85R.")
    return {
        "system": (pickle.dumps(_System(touch)), r"the global posix\.system, which DCP metadata "
                   r"never holds \(refused, never looked up or called\)"),
        "inside_metadata": (pickle.dumps(real), r"global posix\.system"),
        "dotted_name": (dotted, r"global torch\.distributed\.checkpoint\.metadata\.os\.system"),
        "class_attribute": (_SET_CLASS_ATTRIBUTE, "sets the state of a type, which is no DCP "
                            "metadata object"),
    }


FORGERIES = ["system", "inside_metadata", "dotted_name", "class_attribute"]


@pytest.mark.parametrize("forgery", FORGERIES)
def test_forged_metadata_on_storage_runs_nothing(server, tmp_path, forgery):
    """A .metadata whose pickle would call os.system (or set an attribute of
    a class) is refused, naming what it asked for; nothing ran."""
    marker = tmp_path / "ran"
    data, fragment = _forgeries(tmp_path, marker)[forgery]
    ckpt = tmp_path / "ckpt"
    _save(ckpt, {"a": torch.ones(2)})
    (ckpt / ".metadata").write_bytes(data)
    try:
        with pytest.raises(tce.CorruptCheckpointError, match=fragment) as e:
            tce.dcp.StorageReader(ckpt).read_metadata()
        assert str(ckpt / ".metadata") in str(e.value) and e.value.code == "DATA_LOSS"
        # dcp.load reports a failed read_metadata with its message.
        exc = _load_error({"a": torch.zeros(2)}, tce.dcp.StorageReader(ckpt))
        assert re.search(f"DATA_LOSS: .*{fragment}", str(exc)), exc
        assert not marker.exists()
        assert not hasattr(Metadata, "tce_forged")
    finally:
        if hasattr(Metadata, "tce_forged"):  # left by a reader that ran the pickle
            del Metadata.tce_forged


def test_forged_metadata_in_the_cache_runs_nothing(server, tmp_path):
    """A checkpoint saved through the cache, then its cached .metadata
    replaced by a forged one (what a reader gets from the cache or the
    ring): refused, nothing ran."""
    marker = tmp_path / "ran"
    ckpt = tmp_path / "cached"
    dcp.save({"a": torch.ones(2)}, storage_writer=tce.dcp.StorageWriter(ckpt), no_dist=True)
    path = str(ckpt / ".metadata")
    data = pickle.dumps(_System(f"touch {marker}"))
    alloc = _service.allocate_file(path, len(data))
    alloc.view[:] = data
    alloc.commit()
    mm = _service.open_cached(path, local_only=True)
    assert mm is not None and bytes(mm[:len(data)]) == data  # what the reader gets: the forgery
    del mm
    with pytest.raises(tce.CorruptCheckpointError, match=r"global posix\.system"):
        tce.dcp.StorageReader(ckpt).read_metadata()
    assert not marker.exists()


def test_every_kind_of_state_loads_through_the_allow_list(server, tmp_path):
    """What DCP saves of nested dicts, objects, every dtype, a channels-last
    tensor and a path as checkpoint id: unpickled whole, loaded equal."""
    sd = {"f32": torch.randn(8, 4), "f16": torch.randn(4, 2).half(),
          "bf16": torch.randn(4).bfloat16(), "i32": torch.arange(6, dtype=torch.int32),
          "u8": torch.arange(3, dtype=torch.uint8), "bool": torch.tensor([True, False]),
          "c64": torch.randn(2, dtype=torch.complex64), "f8": torch.ones(2).to(torch.float8_e4m3fn),
          "empty": torch.empty(0, 3), "scalar": torch.tensor(3.0),
          "cl": torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last),
          "nested": {"x": {"y": torch.ones(2)}, "l": [torch.ones(1), 3, "s"]},
          "obj": {"n": None, "f": 1.5, "t": (1, 2), "set": {1, 2}, "b": b"raw",
                  "p": pathlib.Path("/x")}}
    meta = _save(tmp_path / "all", sd)
    assert isinstance(meta.storage_meta.checkpoint_id, pathlib.PosixPath)
    got = tce.dcp.StorageReader(tmp_path / "all").read_metadata()
    assert got.state_dict_metadata == meta.state_dict_metadata
    assert got.storage_data == meta.storage_data and got.planner_data == meta.planner_data
    out = {k: (torch.zeros_like(v) if isinstance(v, torch.Tensor) else None) for k, v in sd.items()}
    out["nested"] = {"x": {"y": torch.zeros(2)}, "l": [torch.zeros(1), 0, ""]}
    out["obj"] = dict.fromkeys(sd["obj"])
    dcp.load(out, storage_reader=tce.dcp.StorageReader(tmp_path / "all"), no_dist=True)
    for k, v in sd.items():
        if isinstance(v, torch.Tensor):
            assert out[k].dtype == v.dtype and out[k].shape == v.shape, k
            assert _bytes(out[k]) == _bytes(v), k
    assert torch.equal(out["nested"]["x"]["y"], torch.ones(2))
    assert out["nested"]["l"][1:] == [3, "s"]
    assert out["obj"] == sd["obj"]


def _rewrite_storage_data(ckpt: pathlib.Path, change, *, cached: bool = False) -> None:
    """``change(storage_data)`` applied to the checkpoint's .metadata on
    storage, or (``cached``) to its copy in the cache."""
    path = ckpt / ".metadata"
    if cached:
        mm = _service.open_cached(path, local_only=True)
        meta = pickle.loads(mm)
        del mm
    else:
        meta = pickle.loads(path.read_bytes())
    change(meta.storage_data)
    data = pickle.dumps(meta)
    if not cached:
        path.write_bytes(data)
        return
    alloc = _service.allocate_file(str(path), len(data))
    alloc.view[:] = data
    alloc.commit()


def _set_all(field: str, value):
    def change(storage_data: dict) -> None:
        for info in storage_data.values():
            setattr(info, field, value)
    return change


@pytest.mark.parametrize("name", ["../outside.distcp", "sub/__0_0.distcp", "..", "ABSOLUTE"])
def test_storage_data_naming_a_file_outside_the_directory_is_refused(server, tmp_path, name):
    """An item placed in a file outside the checkpoint's directory (where a
    copy of the real data file lies) is refused; nothing is read."""
    ckpt = tmp_path / "ckpt"
    _save(ckpt, {"a": torch.arange(4.0)})
    (ckpt / "sub").mkdir()
    for copy in (tmp_path / "outside.distcp", ckpt / "sub" / "__0_0.distcp"):
        copy.write_bytes((ckpt / "__0_0.distcp").read_bytes())
    if name == "ABSOLUTE":
        name = str(tmp_path / "outside.distcp")
    _rewrite_storage_data(ckpt, _set_all("relative_path", name))
    reader = tce.dcp.StorageReader(ckpt)
    exc = _load_error({"a": torch.zeros(4)}, reader)
    assert isinstance(exc, tce.CorruptCheckpointError), exc
    assert f"lies in {name!r}, which is no file name in the checkpoint's directory" in str(exc)
    assert reader.reads == []


def _no_local_fd(monkeypatch) -> None:
    """The reader finds no data file in this node's cache, so it reads them
    through ReadRange, as another node's files in the ring (the server
    answers from its cache)."""
    monkeypatch.setattr(_service, "open_cached_fd", lambda *args, **kwargs: None)


@pytest.mark.parametrize("where", ["storage", "cache", "ring"])
@pytest.mark.parametrize("case", ["past_the_end", "negative", "missing"])
def test_storage_data_outside_the_data_file_is_refused(server, tmp_path, monkeypatch, where, case):
    """An item placed past its file's end, at a negative offset, or nowhere
    is refused with the reason, wherever the file comes from; nothing is read."""
    ckpt = tmp_path / "ckpt"
    if where == "storage":
        _save(ckpt, {"a": torch.arange(4.0)})
    else:
        dcp.save({"a": torch.arange(4.0)}, storage_writer=tce.dcp.StorageWriter(ckpt),
                 no_dist=True)
    if where == "ring":
        _no_local_fd(monkeypatch)
    change, fragment = {
        "past_the_end": (_set_all("offset", 1 << 40), {
            "storage": r"item a ends at byte \d+, past the file's \d+ bytes",
            "cache": r"item a ends at byte \d+, past the file's \d+ bytes",
            "ring": r"its items end at byte \d+, past the end of the file the ring holds"}[where]),
        "negative": (_set_all("offset", -64), "has offset -64 and length \\d+, which are no "
                     "byte range of a file"),
        "missing": (dict.clear, r"\.metadata has no storage data for item a"),
    }[case]
    _rewrite_storage_data(ckpt, change, cached=where != "storage")
    reader = tce.dcp.StorageReader(ckpt)
    exc = _load_error({"a": torch.zeros(4)}, reader)
    assert isinstance(exc, tce.CorruptCheckpointError), exc
    assert re.search(fragment, str(exc)), exc
    assert reader.reads == []


_STORAGE = object()  # stands for the tensor's storage in a forged data.pkl


class _PickledTensor:
    """Pickles as torch.save pickles a tensor, with the given fields."""

    def __init__(self, storage_offset, size, stride) -> None:
        self.fields = (storage_offset, size, stride)

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2,
                (_STORAGE, *self.fields, False, collections.OrderedDict()))


def _data_pkl(*, storage_type: str = "FloatStorage", key: str = "0", storage_offset=0,
              size=(4,), stride=(1,)) -> bytes:
    """A one-tensor data.pkl as torch.save writes it (protocol 2)."""
    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            return ("storage", torch.FloatStorage, key, "cpu", 4) if obj is _STORAGE else None

    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(_PickledTensor(storage_offset, size, stride))
    return buf.getvalue().replace(b"ctorch\nFloatStorage\n", f"ctorch\n{storage_type}\n".encode())


def _torch_archive(data_pkl: bytes, records: dict[str, bytes]) -> bytes:
    """A torch.save archive (uncompressed zip) of data.pkl and ``records``."""
    buf = io.BytesIO()
    writer = torch._C.PyTorchFileWriter(buf)
    for name, data in {"data.pkl": data_pkl, **records}.items():
        writer.write_record(name, data, len(data))
    writer.write_end_of_file()
    return buf.getvalue()


FOUR_FLOATS = {"data/0": torch.arange(4.0).numpy().tobytes()}  # a 16-byte record

FORGED_HEADERS = {  # name: (data.pkl fields, fragment of the refusal)
    "size_2e31_stride_2": (dict(size=(1 << 31,), stride=(2,)),
                           r"size \(2147483648,\), stride \(2,\), storage offset 0\) spans "
                           r"17179869180 bytes of its storage, which holds 16"),
    "storage_offset_past_the_record": (dict(storage_offset=1000),
                                       r"spans 4016 bytes of its storage, which holds 16"),
    "negative_storage_offset": (dict(storage_offset=-8), r"storage offset -8, which describe no"),
    "negative_stride": (dict(stride=(-1,)), r"stride \(-1,\) .* which describe no tensor"),
    "stride_per_dimension": (dict(size=(2, 2), stride=(1,)), r"which describe no tensor"),
    "size_not_counts": (dict(size=("4",)), r"size \('4',\), .* which describe no tensor"),
    "unknown_storage_type": (dict(storage_type="EvilStorage"),
                             r"storage is of type 'EvilStorage', which is no torch storage"),
    "untyped_class": (dict(storage_type="TypedStorage"), r"of type 'TypedStorage', which is no"),
    "storage_name_with_a_path": (dict(key="../0"), r"storage is named '\.\./0', which is no "
                                 r"storage name"),
    "storage_not_in_the_archive": (dict(key="7"), r"storage data/7 is not in the archive"),
}


def _layout_of(tmp_path: pathlib.Path, archive: bytes, *, at: int = 64) -> Layout | None:
    """tensor_layout of ``archive`` written at ``at`` in a file, after other bytes."""
    path = tmp_path / "items"
    path.write_bytes(b"\xff" * at + archive + b"\xee" * 4096)
    fd = os.open(path, os.O_RDONLY)
    try:
        return tensor_layout(FdSource(fd, path.stat().st_size), at, len(archive))
    finally:
        os.close(fd)


def test_a_plain_forged_header_gives_its_layout(tmp_path):
    """The archives these tests forge are read as torch.save's are."""
    archive = _torch_archive(_data_pkl(storage_offset=1, size=(3,)), FOUR_FLOATS)
    assert torch.equal(torch.load(io.BytesIO(archive), weights_only=True), torch.arange(1.0, 4.0))
    layout = _layout_of(tmp_path, archive)
    assert layout is not None and layout[1:] == (torch.float32, 1, (3,), (1,))


@pytest.mark.parametrize("forgery", sorted(FORGED_HEADERS))
def test_a_header_outside_its_record_is_refused(tmp_path, forgery):
    """A tensor header naming a storage of no type, a storage name that is
    a path or no record, or elements outside the record is refused before
    the record is read."""
    fields, fragment = FORGED_HEADERS[forgery]
    with pytest.raises(tce.CorruptCheckpointError, match=fragment):
        _layout_of(tmp_path, _torch_archive(_data_pkl(**fields), FOUR_FLOATS))


def _replace_item(ckpt: pathlib.Path, fqn: str, item: bytes, *, size=None) -> None:
    """The checkpoint's (only) data file holds ``item`` in place of ``fqn``'s
    tensor (the .metadata says so; with ``size``, it says that size too)."""
    meta = pickle.loads((ckpt / ".metadata").read_bytes())
    info, = [v for k, v in meta.storage_data.items() if k.fqn == fqn]
    (ckpt / info.relative_path).write_bytes(item)
    info.offset, info.length = 0, len(item)
    if size is not None:
        md = meta.state_dict_metadata[fqn]
        md.size = md.chunks[0].sizes = torch.Size(size)
    (ckpt / ".metadata").write_bytes(pickle.dumps(meta))


def _torch_save(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_loading_a_header_outside_its_record_reads_nothing(server, tmp_path):
    """dcp.load of a data file whose tensor header spans 2^31 elements at
    stride 2 over a 16-byte record: refused, naming the item; the
    destination is untouched."""
    ckpt = tmp_path / "ckpt"
    _save(ckpt, {"a": torch.arange(4.0)})
    _replace_item(ckpt, "a", _torch_archive(_data_pkl(size=(1 << 31,), stride=(2,)), FOUR_FLOATS))
    out = {"a": torch.full((4,), 7.0)}
    reader = tce.dcp.StorageReader(ckpt)
    exc = _load_error(out, reader)
    assert isinstance(exc, tce.CorruptCheckpointError), exc
    assert re.search(r"__0_0\.distcp: item a: its tensor \(torch\.float32, size \(2147483648,\)"
                     r".* which holds 16", str(exc)), exc
    assert torch.equal(out["a"], torch.full((4,), 7.0)) and not reader.copies


@pytest.mark.parametrize("item", ["system", "dict", "region"])
def test_loading_an_item_that_is_not_the_planned_tensor_is_refused(server, tmp_path, item):
    """An item whose data.pkl calls os.system (nothing runs), one holding a
    dict, and one smaller than the region the metadata plans: refused."""
    marker = tmp_path / "ran"
    ckpt = tmp_path / "ckpt"
    _save(ckpt, {"a": torch.arange(4.0)})
    size, fragment = {
        "system": (None, r"item a is no tensor torch\.load reads: .*posix\.system"),
        "dict": (None, r"item a holds a dict, not a tensor"),
        "region": ((8,), r"item a has size \(4,\), the plan wants \(8,\) at \(0,\)"),
    }[item]
    forged = {"system": lambda: _torch_archive(pickle.dumps(_System(f"touch {marker}"), protocol=2),
                                               FOUR_FLOATS),
              "dict": lambda: _torch_save({"x": 1}),
              "region": lambda: _torch_save(torch.arange(4.0))}[item]()
    _replace_item(ckpt, "a", forged, size=size)
    exc = _load_error({"a": torch.zeros(size or (4,))}, tce.dcp.StorageReader(ckpt))
    assert isinstance(exc, tce.CorruptCheckpointError), exc
    assert re.search(fragment, str(exc), re.S), exc
    assert not marker.exists()
