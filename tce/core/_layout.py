"""The torch-zip layout of an object, written straight into a cache buffer.

The bytes TCE writes *are* the file: the same zip that ``torch.save`` writes
(PyTorch's miniz writer: stored records, payloads aligned to 64 bytes with an
``FB`` padding field, a data descriptor after each non-empty record, zip64
fields where sizes or offsets reach 4 GiB, zip64 end records always). Two
differences, both invisible to ``torch.load``:

* CRC-32 fields are left zero; the server fills them before the file leaves
  memory (the training rank never computes checksums, and ``torch.load`` does
  not check them).
* ``.data/serialization_id`` is random instead of torch's content hash.

A save happens in two steps. :func:`plan` pickles the object (collecting its
storages, exactly as ``torch.save`` does) and computes where every record goes;
the layout part is cached by structure, so a repeated save of the same state
dict only re-pickles. :meth:`Plan.write` then copies headers and storages into
a buffer.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import secrets
import struct
import sys
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import torch

ALIGNMENT = 64  # torch's storage alignment inside the zip
_U32_MAX = 0xFFFFFFFF

_LOCAL_SIG = 0x04034B50
_CENTRAL_SIG = 0x02014B50
_DESCRIPTOR_SIG = 0x08074B50
_ZIP64_EOCD_SIG = 0x06064B50
_ZIP64_LOCATOR_SIG = 0x07064B50
_EOCD_SIG = 0x06054B50
_FLAG_UTF8 = 0x0800
_FLAG_DESCRIPTOR = 0x0008

_LOCAL = struct.Struct("<IHHHHHIIIHH")  # 30 bytes
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")  # 46 bytes
_ZIP64_EOCD = struct.Struct("<IQHHIIQQQQ")  # 56 bytes
_ZIP64_LOCATOR = struct.Struct("<IIQI")  # 20 bytes
_EOCD = struct.Struct("<IHHHHIIH")  # 22 bytes

# Records torch.save writes around the storages, with their contents.
_FORMAT_VERSION = b"1"
_STORAGE_ALIGNMENT = str(ALIGNMENT).encode()
_BYTEORDER = sys.byteorder.encode()
_VERSION = b"3\n"
_SERIALIZATION_ID_LEN = 40


def archive_name(path: str | os.PathLike | None) -> str:
    """The record-name prefix torch.save uses for ``path``.

    torch uses the file's base name without its last extension, and
    ``archive`` when writing to a stream (which it does for non-ASCII names).
    """
    if path is None:
        return "archive"
    name = os.path.basename(os.fspath(path))
    try:
        name.encode("ascii")
    except UnicodeEncodeError:
        return "archive"
    dot = name.rfind(".")
    return name[:dot] if dot != -1 else name


@dataclass(frozen=True)
class Record:
    """One zip record of a planned file."""

    name: str  # full record name, e.g. "archive/data/0"
    header_offset: int
    data_offset: int
    size: int
    central_offset: int  # its entry in the central directory


@dataclass(frozen=True)
class _Layout:
    """Where every record lands, with every header byte precomputed.

    Depends only on the archive name, the pickle's length and the storages'
    sizes: that is the structure the plan cache is keyed by.
    """

    records: tuple[Record, ...]
    # (offset, bytes) runs to copy verbatim: local headers, data descriptors,
    # the small fixed records, the central directory and the end records.
    fixed: tuple[tuple[int, bytes], ...]
    size: int


def _local_zip64(size: int, header_offset: int) -> bytes:
    # miniz's local zip64 field: (uncompressed, compressed=0) when the size
    # needs it, and the header's own offset when that needs it.
    fields = b""
    if size >= _U32_MAX:
        fields += struct.pack("<QQ", size, 0)
    if header_offset >= _U32_MAX:
        fields += struct.pack("<Q", header_offset)
    return struct.pack("<HH", 1, len(fields)) + fields if fields else b""


def _central_zip64(size: int, header_offset: int) -> bytes:
    fields = b""
    if size >= _U32_MAX:
        fields += struct.pack("<QQ", size, size)
    if header_offset >= _U32_MAX:
        fields += struct.pack("<Q", header_offset)
    return struct.pack("<HH", 1, len(fields)) + fields if fields else b""


def _compute_layout(prefix: str, sizes: Sequence[tuple[str, int]]) -> _Layout:
    fixed: list[tuple[int, bytes]] = []
    records: list[tuple[str, int, int, int]] = []
    central: list[bytes] = []
    offset = 0
    for name, size in sizes:
        full_name = f"{prefix}/{name}"
        full = full_name.encode()
        header_offset = offset
        wide = size >= _U32_MAX or header_offset >= _U32_MAX
        zip64 = _local_zip64(size, header_offset)
        start = header_offset + _LOCAL.size + len(full) + len(zip64)
        pad = -start % ALIGNMENT
        if pad < 4:  # the FB field needs 4 bytes of its own
            pad += ALIGNMENT
        padding = b"FB" + struct.pack("<H", pad - 4) + b"Z" * (pad - 4)
        flags = _FLAG_UTF8 | (_FLAG_DESCRIPTOR if size else 0)
        local = _LOCAL.pack(
            _LOCAL_SIG, 0, flags, 0, 0, 0, 0, 0, 0, len(full), len(zip64) + pad
        )
        fixed.append((header_offset, local + full + zip64 + padding))
        data_offset = start + pad
        records.append((full_name, header_offset, data_offset, size))
        offset = data_offset + size
        if size:
            if wide:
                descriptor = struct.pack("<IIQQ", _DESCRIPTOR_SIG, 0, size, size)
            else:
                descriptor = struct.pack("<IIII", _DESCRIPTOR_SIG, 0, size, size)
            fixed.append((offset, descriptor))
            offset += len(descriptor)
        cz64 = _central_zip64(size, header_offset)
        central.append(
            _CENTRAL.pack(
                _CENTRAL_SIG, 0, 0, flags, 0, 0, 0, 0,
                min(size, _U32_MAX), min(size, _U32_MAX),
                len(full), len(cz64), 0, 0, 0, 0,
                min(header_offset, _U32_MAX),
            )
            + full
            + cz64
        )
    cd_offset = offset
    cd = b"".join(central)
    entries = []
    at = cd_offset
    for rec, entry in zip(records, central):
        entries.append(Record(*rec, central_offset=at))
        at += len(entry)
    n = len(records)
    zip64_eocd_offset = cd_offset + len(cd)
    tail = (
        cd
        + _ZIP64_EOCD.pack(
            _ZIP64_EOCD_SIG, _ZIP64_EOCD.size - 12, 0x031E, 0x002D, 0, 0,
            n, n, len(cd), cd_offset,
        )
        + _ZIP64_LOCATOR.pack(_ZIP64_LOCATOR_SIG, 0, zip64_eocd_offset, 1)
        + _EOCD.pack(
            _EOCD_SIG, 0, 0, min(n, 0xFFFF), min(n, 0xFFFF),
            min(len(cd), _U32_MAX), min(cd_offset, _U32_MAX), 0,
        )
    )
    fixed.append((cd_offset, tail))
    return _Layout(tuple(entries), tuple(fixed), cd_offset + len(tail))


class _LayoutCache:
    """A small LRU of layouts keyed by structure; thread-safe."""

    def __init__(self, capacity: int = 64) -> None:
        self._capacity = capacity
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict[Any, _Layout] = collections.OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, prefix: str, pickled: int, storages: tuple[int, ...]) -> _Layout:
        """The layout of a file named ``prefix`` with a pickle of ``pickled``
        bytes and storages of these sizes."""
        key = (prefix, pickled, storages)
        with self._lock:
            layout = self._entries.get(key)
            if layout is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return layout
        sizes = (
            ("data.pkl", pickled),
            (".format_version", len(_FORMAT_VERSION)),
            (".storage_alignment", len(_STORAGE_ALIGNMENT)),
            ("byteorder", len(_BYTEORDER)),
            *((f"data/{i}", n) for i, n in enumerate(storages)),
            ("version", len(_VERSION)),
            (".data/serialization_id", _SERIALIZATION_ID_LEN),
        )
        layout = _compute_layout(prefix, sizes)
        with self._lock:
            self.misses += 1
            self._entries[key] = layout
            if len(self._entries) > self._capacity:
                self._entries.popitem(last=False)
        return layout


layout_cache = _LayoutCache()


def _pickle(obj: Any, pickle_module: Any, protocol: int) -> tuple[bytes, list[torch.UntypedStorage]]:
    """Pickle ``obj`` as torch.save does, collecting its storages in key order."""
    storages: list[torch.UntypedStorage] = []
    keys: dict[int, str] = {}
    dtypes: dict[int, torch.dtype] = {}

    def persistent_id(o: Any) -> Any:
        if isinstance(o, torch.storage.TypedStorage):
            storage = o._untyped_storage
            dtype = o.dtype
            storage_type = getattr(torch, o._pickle_storage_type())
            numel = o._size()
        elif torch.is_storage(o):
            storage = o
            dtype = torch.uint8
            storage_type = torch.serialization.normalize_storage_type(type(o))
            numel = storage.nbytes()
        else:
            return None
        if storage.device.type != "meta" and storage.data_ptr() != 0:
            seen = dtypes.setdefault(storage.data_ptr(), dtype)
            if seen != dtype:
                raise RuntimeError(
                    "Cannot save multiple tensors or storages that view the same "
                    "data as different types"
                )
        key = keys.get(storage._cdata)
        if key is None:
            key = keys[storage._cdata] = str(len(storages))
            storages.append(storage)
        location = torch.serialization.location_tag(storage)
        return ("storage", storage_type, key, location, numel)

    class _Pickler(pickle_module.Pickler):  # type: ignore[name-defined,misc]
        def persistent_id(self, o: Any) -> Any:
            return persistent_id(o)

    buf = io.BytesIO()
    _Pickler(buf, protocol=protocol).dump(obj)
    return buf.getvalue(), storages


class Plan:
    """Everything needed to write one object's file into a buffer."""

    def __init__(self, pickled: bytes, storages: list[torch.UntypedStorage], layout: _Layout) -> None:
        self.pickled = pickled
        self.storages = storages
        self._layout = layout

    @property
    def size(self) -> int:
        """Exact file size in bytes."""
        return self._layout.size

    @property
    def records(self) -> tuple[Record, ...]:
        return self._layout.records

    @property
    def storage_bytes(self) -> int:
        return sum(s.nbytes() for s in self.storages)

    def write(self, view: memoryview, tensor: torch.Tensor) -> None:
        """Write the file into a buffer given as a memoryview and a uint8 tensor
        over the same memory (both at least :attr:`size` bytes)."""
        self.write_fixed(view)
        for dst, storage in self.storage_targets(tensor):
            _copy_storage(dst, storage)

    def write_fixed(self, view: memoryview) -> None:
        """Everything but the storages: headers, the pickle, the small records."""
        records = self._layout.records
        for offset, data in self._layout.fixed:
            view[offset : offset + len(data)] = data
        small = (
            self.pickled, _FORMAT_VERSION, _STORAGE_ALIGNMENT, _BYTEORDER,
        )
        for rec, data in zip(records[:4], small):
            view[rec.data_offset : rec.data_offset + rec.size] = data
        version, sid = records[-2], records[-1]
        view[version.data_offset : version.data_offset + version.size] = _VERSION
        view[sid.data_offset : sid.data_offset + sid.size] = _serialization_id()

    def storage_targets(self, tensor: torch.Tensor) -> list[tuple[torch.Tensor, torch.UntypedStorage]]:
        """(slice of ``tensor`` the storage's bytes go to, storage), non-empty ones."""
        return [
            (tensor[rec.data_offset : rec.data_offset + rec.size], storage)
            for rec, storage in zip(self._layout.records[4:], self.storages)
            if rec.size
        ]

    def storage_offsets(self) -> list[tuple[int, torch.UntypedStorage]]:
        """(offset in the file, storage) of the non-empty storages."""
        return [
            (rec.data_offset, storage)
            for rec, storage in zip(self._layout.records[4:], self.storages)
            if rec.size
        ]

    def to_bytes(self) -> bytes:
        """The whole file as bytes (tests and the direct-to-disk fallback)."""
        out = bytearray(self.size)
        self.write(memoryview(out), torch.frombuffer(out, dtype=torch.uint8))
        return bytes(out)


def _serialization_id() -> bytes:
    # torch writes 40 decimal digits; any value is valid, so draw them at random.
    return str(secrets.randbits(128)).zfill(_SERIALIZATION_ID_LEN)[-_SERIALIZATION_ID_LEN:].encode()


_ATOMS = frozenset({int, float, bool, type(None)})  # values pickle never memoizes
_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})
_STRIDED = torch.strided


def _fingerprint(obj: Any) -> tuple[tuple, list[torch.UntypedStorage]] | None:
    """What pickling ``obj`` depends on, and its storages in pickling order.

    The key lists, in the order the pickler visits them, every value, every
    container's type and size, every tensor's type, storage (by first
    appearance), dtype, device, shape, stride, offset and requires_grad,
    and where an object was already seen (the pickler memoizes by identity).
    Two objects with equal keys pickle to the same bytes. None where the
    object holds anything else (other classes, tensor subclasses, tensors
    with attributes, hooks or a layout other than strided): those are
    pickled every time.
    """
    key: list[Any] = []
    storages: list[torch.UntypedStorage] = []
    storage_index: dict[int, int] = {}
    seen: dict[int, int] = {}

    def walk(o: Any) -> bool:
        t = type(o)
        if t in _ATOMS:
            key.append((t, o.hex() if t is float else o))  # hex: -0.0 is not 0.0 here
            return True
        i = seen.get(id(o))
        if i is not None:
            key.append(("ref", i))
            return True
        seen[id(o)] = len(seen)
        if t is str or t is bytes or t is torch.dtype:
            key.append(o)
            return True
        if t in _TENSORS:
            if (o.__dict__ or o._backward_hooks or o.layout is not _STRIDED or o.is_conj()
                    or o.is_neg() or o.is_quantized or not (o.is_cpu or o.is_cuda)):
                return False
            st = o.untyped_storage()
            cdata = st._cdata
            si = storage_index.get(cdata)
            if si is None:
                si = storage_index[cdata] = len(storages)
                storages.append(st)
            key.append((t, si, st.nbytes(), o.dtype, o.device, o.shape, o.stride(),
                        o.storage_offset(), o.requires_grad))
            return True
        if t is dict or t is collections.OrderedDict:
            key.append((t, len(o)))
            for k, v in o.items():
                if not (walk(k) and walk(v)):
                    return False
            return True
        if t is list or t is tuple:
            key.append((t, len(o)))
            for v in o:
                if not walk(v):
                    return False
            return True
        return False

    return (tuple(key), storages) if walk(obj) else None


class _PickleMemo:
    """Pickled bytes of recent objects by fingerprint: saving the same state
    dict again (same tensors, same values) skips the pickler, which costs
    tens of microseconds per tensor. Small LRU; thread-safe."""

    def __init__(self, capacity: int = 8) -> None:
        self._capacity = capacity
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict[Any, bytes] = collections.OrderedDict()
        self.hits = 0

    def pickle(self, obj: Any, pickle_module: Any, protocol: int) -> tuple[bytes, list[torch.UntypedStorage]]:
        fp = _fingerprint(obj)
        if fp is None:
            return _pickle(obj, pickle_module, protocol)
        memo_key = (pickle_module, protocol, fp[0])
        with self._lock:
            pickled = self._entries.get(memo_key)
            if pickled is not None:
                self._entries.move_to_end(memo_key)
                self.hits += 1
                return pickled, fp[1]
        pickled, storages = _pickle(obj, pickle_module, protocol)
        if [s._cdata for s in storages] != [s._cdata for s in fp[1]]:
            return pickled, storages  # the walk does not model this object: never reuse its key
        with self._lock:
            self._entries[memo_key] = pickled
            if len(self._entries) > self._capacity:
                self._entries.popitem(last=False)
        return pickled, storages


pickle_memo = _PickleMemo()


def storage_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A flat uint8 tensor over all of ``storage`` (on its device)."""
    src = torch.empty(0, dtype=torch.uint8, device=storage.device)
    src.set_(storage, 0, (storage.nbytes(),), (1,))
    return src


def _copy_storage(dst: torch.Tensor, storage: torch.UntypedStorage) -> None:
    dst.copy_(storage_bytes(storage))


def plan(
    obj: Any,
    path: str | os.PathLike | None,
    *,
    pickle_module: Any = pickle,
    pickle_protocol: int = 2,
) -> Plan:
    """Pickle ``obj`` and lay out its torch-zip file (for ``path``'s archive name)."""
    pickled, storages = pickle_memo.pickle(obj, pickle_module, pickle_protocol)
    layout = layout_cache.get(archive_name(path), len(pickled), tuple(s.nbytes() for s in storages))
    return Plan(pickled, storages, layout)
