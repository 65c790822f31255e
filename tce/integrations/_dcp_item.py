"""One item of a DCP data file, read with one copy: the planned part of a
tensor item goes from the file straight into the destination tensor.

A tensor item is a ``torch.save`` archive of one tensor (an uncompressed zip:
``data.pkl`` naming the storage record, its dtype, offset, size and stride;
the record's bytes). :func:`tensor_layout` reads the archive's directory and
``data.pkl`` (a few small reads) and says where the tensor's elements lie in
the file; :func:`read_tensor` then reads the planned region with
``os.preadv`` into the destination's memory when both are contiguous, else
the region's span into a scratch buffer and copies from there. Nothing is
mapped, so no page tables are set up, and no storage is allocated per item.

The archive is not trusted: ``data.pkl`` may name only what a plain
tensor's pickle names, and the storage record it names must exist, lie in
the archive and hold every element of the tensor (by its size, stride,
storage offset and dtype) before any element is read.
"""

from __future__ import annotations

import abc
import collections
import concurrent.futures
import ctypes
import functools
import io
import os
import pickle
import re
import warnings
import zipfile
from typing import Any, NamedTuple

import torch

from tce import client
from tce.errors import CorruptCheckpointError


class Source(abc.ABC):
    """Bytes of one data file: ``readinto(view, offset)`` fills ``view``."""

    @abc.abstractmethod
    def readinto(self, view: memoryview, offset: int) -> None:
        """Fill ``view`` with the bytes at ``offset``."""


class FdSource(Source):
    """A file descriptor (a cached buffer, or a file on storage), read with
    ``os.preadv``."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size = fd, size

    def readinto(self, view: memoryview, offset: int) -> None:
        done, want = 0, len(view)
        while done < want:
            n = os.preadv(self.fd, [view[done:]], offset + done)
            if n <= 0:
                raise ValueError(f"short read: {done} of {want} bytes at offset {offset}")
            done += n


class MemorySource(Source):
    """The bytes of a data file in memory (a mapping of it, as a flat uint8
    tensor of the file's size)."""

    def __init__(self, data: torch.Tensor) -> None:
        self.data, self.size = data, data.numel()

    def readinto(self, view: memoryview, offset: int) -> None:
        if offset < 0 or offset + len(view) > self.size:
            raise ValueError(f"bytes [{offset}, {offset + len(view)}) are past the file's "
                             f"{self.size}")
        view[:] = memoryview(self.data[offset:offset + len(view)].numpy())


# The archive's head (local headers and data.pkl) and tail (the central
# directory) are read once each; the reader's many small reads come from them.
_HEAD = 4096
_TAIL = 8192


class _Archive(io.RawIOBase):
    """The archive at ``[start, start + length)`` of a source, as a file
    (what ``torch._C.PyTorchFileReader`` reads its directory through)."""

    def __init__(self, source: Source, start: int, length: int) -> None:
        super().__init__()
        self.source, self.start, self.length, self.pos = source, start, length, 0
        self.head = bytearray(min(length, _HEAD))
        source.readinto(memoryview(self.head), start)
        self.tail_at = max(len(self.head), length - _TAIL)
        self.tail = bytearray(length - self.tail_at)
        source.readinto(memoryview(self.tail), start + self.tail_at)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        n = max(0, min(len(view), self.length - self.pos))
        pos, end = self.pos, self.pos + n
        if end <= len(self.head):
            view[:n] = self.head[pos:end]
        elif pos >= self.tail_at:
            view[:n] = self.tail[pos - self.tail_at:end - self.tail_at]
        elif n:
            self.source.readinto(view[:n], self.start + pos)
        self.pos += n
        return n

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self.pos, self.length)[whence]
        self.pos = base + offset
        return self.pos

    def tell(self) -> int:
        return self.pos


class Layout(NamedTuple):
    """Where a tensor item's elements lie in its data file."""

    offset: int  # file offset of the storage record's first byte
    dtype: torch.dtype
    storage_offset: int  # in elements
    size: tuple[int, ...]
    stride: tuple[int, ...]


class _Storage(NamedTuple):
    key: str  # the archive's record data/<key> holds its bytes
    dtype: torch.dtype


class _Tensor(NamedTuple):
    """A tensor as ``data.pkl`` describes it; the numbers are not checked."""

    storage: _Storage
    storage_offset: Any
    size: Any
    stride: Any


@functools.cache
def _storage_dtypes() -> dict[str, torch.dtype]:
    """The storage types ``data.pkl`` may name (torch's typed storages, by
    class name) and their dtypes; an untyped storage holds bytes."""
    with warnings.catch_warnings():  # the legacy typed storages are deprecated
        warnings.simplefilter("ignore")
        dtypes = {name: getattr(value, "dtype", None) for name, value in vars(torch).items()
                  if name.endswith("Storage") and isinstance(value, type)}
    table = {name: dtype for name, dtype in dtypes.items() if isinstance(dtype, torch.dtype)}
    table["UntypedStorage"] = torch.uint8
    return table


# A storage's name, as torch.save gives it (its record is data/<name>).
_STORAGE_NAME = re.compile(r"\w{1,64}", re.ASCII)


class _Header(pickle.Unpickler):
    """Unpickles ``data.pkl`` of a one-tensor archive into a :class:`_Tensor`.
    Any other global is refused (``pickle.UnpicklingError``: not a plain
    tensor); a storage of no torch type, or with a name no record of an
    archive has, is :class:`CorruptCheckpointError`."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return self._rebuild  # a bound method: no pickle can set its attributes
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch" and name.endswith("Storage"):
            return name  # checked by persistent_load
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a plain tensor")

    def _rebuild(self, storage: Any, storage_offset: Any, size: Any, stride: Any,
                 *_: Any) -> _Tensor:
        if not isinstance(storage, _Storage):
            raise pickle.UnpicklingError(f"{storage!r} is not a storage")
        return _Tensor(storage, storage_offset, size, stride)

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"persistent id {pid!r}")
        _, storage_type, key, _location, _numel = pid
        dtype = _storage_dtypes().get(storage_type) if isinstance(storage_type, str) else None
        if dtype is None:
            raise CorruptCheckpointError(f"its tensor's storage is of type {storage_type!r}, "
                                         "which is no torch storage")
        if not (isinstance(key, str) and _STORAGE_NAME.fullmatch(key)):
            raise CorruptCheckpointError(f"its tensor's storage is named {key!r}, which is no "
                                         "storage name")
        return _Storage(key, dtype)


def _count(n: Any) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1 << 63


def _shape(t: _Tensor) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """The tensor's storage offset, size and stride, checked: counts, one
    stride per dimension.

    Raises:
        CorruptCheckpointError: they describe no tensor.
    """
    size = tuple(t.size) if isinstance(t.size, (tuple, list)) else None
    stride = tuple(t.stride) if isinstance(t.stride, (tuple, list)) else None
    if (size is None or stride is None or len(size) != len(stride) or not _count(t.storage_offset)
            or not all(_count(n) for n in size + stride)):
        raise CorruptCheckpointError(f"its tensor has size {t.size!r}, stride {t.stride!r} and "
                                     f"storage offset {t.storage_offset!r}, which describe no "
                                     "tensor")
    return t.storage_offset, size, stride


def _extent(storage_offset: int, size: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """How many elements of its storage a tensor spans, from the storage's start."""
    if 0 in size:
        return 0
    return storage_offset + sum((n - 1) * s for n, s in zip(size, stride)) + 1


def _record_sizes(archive: _Archive) -> dict[str, int] | None:
    """The size the archive's zip directory gives each record, by its name
    inside the archive (``data.pkl``, ``data/0``); None when it is no zip
    of one top folder.

    Read from the directory rather than asked of torch's reader, whose
    ``get_record_size`` only recent torch versions have."""
    try:
        with zipfile.ZipFile(archive) as z:
            entries = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return None
    tops = {i.filename.split("/", 1)[0] for i in entries}
    if len(tops) != 1 or any("/" not in i.filename for i in entries):
        return None
    return {i.filename.split("/", 1)[1]: i.file_size for i in entries}


def _header(source: Source, offset: int,
            length: int) -> tuple[Any, dict[str, int], _Tensor] | None:
    """The archive at ``[offset, offset + length)``, its records' sizes and
    the tensor its ``data.pkl`` describes; None when it is no archive of one
    plain tensor.

    Raises:
        CorruptCheckpointError: its ``data.pkl`` claims more bytes than the
            archive has, or names a storage :class:`_Header` refuses.
    """
    try:
        archive = torch._C.PyTorchFileReader(_Archive(source, offset, length))
    except RuntimeError:  # no torch archive: torch.load says why
        return None
    sizes = _record_sizes(_Archive(source, offset, length))
    if sizes is None or "data.pkl" not in sizes:
        return None
    if sizes["data.pkl"] > length:  # checked before the reader allocates that much
        raise CorruptCheckpointError(f"its data.pkl claims {sizes['data.pkl']} bytes, more "
                                     f"than the archive's {length}")
    try:
        t = _Header(io.BytesIO(archive.get_record("data.pkl"))).load()
    except CorruptCheckpointError:
        raise
    except (pickle.UnpicklingError, RuntimeError, ValueError, TypeError, EOFError):
        return None  # not one plain tensor: torch.load reads it, or says why not
    return (archive, sizes, t) if isinstance(t, _Tensor) else None


def tensor_layout(source: Source, offset: int, length: int) -> Layout | None:
    """The layout of the tensor archive at ``[offset, offset + length)``;
    None when it is not an uncompressed archive of one plain tensor.

    Before anything but the archive's directory and ``data.pkl`` is read,
    the tensor's storage must be a record of the archive, and its size,
    stride and storage offset must keep every element inside that record.

    Raises:
        CorruptCheckpointError: the archive describes one plain tensor, but
            a storage of no torch type or name, missing from the archive or
            past its end, or elements outside it.
    """
    found = _header(source, offset, length)
    if found is None:
        return None
    archive, sizes, t = found
    storage_offset, size, stride = _shape(t)
    record = f"data/{t.storage.key}"
    try:
        at, nbytes = archive.get_record_offset(record), sizes[record]
    except (RuntimeError, KeyError):
        raise CorruptCheckpointError(f"its tensor's storage {record} is not in the archive") \
            from None
    if at + nbytes > length:
        raise CorruptCheckpointError(f"its tensor's storage {record} ({nbytes} bytes at {at}) "
                                     f"ends past the archive's {length} bytes")
    dtype = t.storage.dtype
    spans = _extent(storage_offset, size, stride) * dtype.itemsize
    if spans > nbytes:
        raise CorruptCheckpointError(
            f"its tensor ({dtype}, size {size}, stride {stride}, storage offset "
            f"{storage_offset}) spans {spans} bytes of its storage, which holds {nbytes}")
    return Layout(offset + at, dtype, storage_offset, size, stride)


def view_tensor(data: torch.Tensor, layout: Layout) -> torch.Tensor | None:
    """The tensor at ``layout`` as a view of ``data`` (the file's bytes, a
    flat uint8 tensor whose first byte is aligned for any dtype, as a
    mapping's is): nothing is copied. None when its elements are not
    aligned for its dtype in the file (then read it with :func:`read_tensor`).
    ``layout`` is :func:`tensor_layout`'s, of an archive inside ``data``."""
    item = layout.dtype.itemsize
    spans = _extent(layout.storage_offset, layout.size, layout.stride)
    if spans == 0:
        return torch.empty(layout.size, dtype=layout.dtype)
    if layout.offset % item:
        return None
    storage = data[layout.offset:layout.offset + spans * item].view(layout.dtype)
    return storage.as_strided(layout.size, layout.stride, storage.storage_offset()
                              + layout.storage_offset)


def load_tensor(source: Source, item: str, offset: int, length: int) -> torch.Tensor:
    """The tensor ``torch.load`` (``weights_only``) reads of the item at
    ``[offset, offset + length)`` that is not one plain tensor (a copy).

    Raises:
        CorruptCheckpointError: it is no tensor torch.load reads.
    """
    data = bytearray(length)
    source.readinto(memoryview(data), offset)
    try:
        tensor = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 (whatever torch.load refuses)
        raise CorruptCheckpointError(f"{item} is no tensor torch.load reads: {e}") from None
    if not isinstance(tensor, torch.Tensor):
        raise CorruptCheckpointError(f"{item} holds a {type(tensor).__name__}, not a tensor")
    return tensor


def _writable_bytes(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, writable."""
    n = t.numel() * t.element_size()
    return memoryview((ctypes.c_ubyte * n).from_address(t.data_ptr())).cast("B")


class Scratch:
    """A buffer kept across items for regions that cannot be read straight
    into their destination (grown, never shrunk, so it is faulted in once)."""

    def __init__(self) -> None:
        self.buf = torch.empty(0, dtype=torch.uint8)

    def get(self, n: int) -> torch.Tensor:
        if self.buf.numel() < n:
            self.buf = torch.empty(n, dtype=torch.uint8)
        return self.buf[:n]


def read_tensor(source: Source, layout: Layout, offsets: Any, lengths: Any,
                target: torch.Tensor, scratch: Scratch, reads: "Reads") -> str:
    """Copy the region ``offsets``/``lengths`` of the tensor at ``layout``
    into ``target`` (whose size is ``lengths``); returns "direct" when the
    bytes go straight into ``target`` (queued on ``reads``: done once it ran),
    else "scratch" (done). ``layout`` is :func:`tensor_layout`'s (every
    element inside its record) and the caller checked that the region lies
    inside ``layout.size``."""
    item = layout.dtype.itemsize
    offsets = list(offsets) or [0] * len(layout.size)
    lengths = list(lengths) or list(layout.size)
    first = layout.storage_offset + sum(o * s for o, s in zip(offsets, layout.stride))
    numel = 1
    for n in lengths:
        numel *= n
    if numel == 0:
        return "direct"
    # The region is contiguous in the file when its strides are row-major
    # (dimensions of length 1 aside).
    expect, contiguous = 1, True
    for n, s in zip(reversed(lengths), reversed(layout.stride)):
        if n != 1 and s != expect:
            contiguous = False
            break
        expect *= n
    if (contiguous and target.is_contiguous() and target.dtype == layout.dtype
            and target.device.type == "cpu"):
        reads.add(source, _writable_bytes(target), layout.offset + first * item)
        return "direct"
    last = first + sum((n - 1) * s for n, s in zip(lengths, layout.stride))
    span = (last - first + 1) * item
    buf = scratch.get(span)
    source.readinto(memoryview(buf.numpy()), layout.offset + first * item)
    region = buf.view(layout.dtype).as_strided(lengths, layout.stride)
    target.copy_(region)
    return "scratch"


# Reads straight into destinations run on `dcp_read_threads` threads (a
# setting: preadv drops the GIL, so more threads help where the storage or
# the cores allow), in pieces of at most READ_PIECE bytes so the threads
# share the work evenly.
READ_PIECE = 32 << 20
_pool: concurrent.futures.ThreadPoolExecutor | None = None


class Reads:
    """Queued reads of file bytes into destination memory; :meth:`run`
    does them all, on ``dcp_read_threads`` threads."""

    def __init__(self) -> None:
        self.pieces: list[tuple[Source, memoryview, int]] = []

    def add(self, source: Source, view: memoryview, offset: int) -> None:
        for at in range(0, len(view), READ_PIECE):
            self.pieces.append((source, view[at:at + READ_PIECE], offset + at))

    def run(self) -> None:
        global _pool
        pieces, self.pieces = self.pieces, []
        threads = client.setting("dcp_read_threads")
        if threads <= 1 or len(pieces) <= 1:
            for source, view, offset in pieces:
                source.readinto(view, offset)
            return
        if _pool is None or _pool._max_workers != threads:  # the setting changed
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = concurrent.futures.ThreadPoolExecutor(threads, "tce-dcp-read")
        for f in [_pool.submit(source.readinto, view, offset) for source, view, offset in pieces]:
            f.result()
