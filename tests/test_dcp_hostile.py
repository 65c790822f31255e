"""tce.dcp.StorageReader against hostile checkpoint files: a forged
``.metadata`` (on storage or in the cache) runs nothing, and storage data
or tensor headers that point outside their files are refused with
``CorruptCheckpointError``, before any byte outside them is read."""

from __future__ import annotations

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
