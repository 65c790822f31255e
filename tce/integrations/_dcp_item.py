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
"""

from __future__ import annotations

import abc
import collections
import concurrent.futures
import ctypes
import io
import os
import pickle
import warnings
from typing import Any, NamedTuple

import torch

from tce.core import _knobs


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


class _Tensor(NamedTuple):
    key: str
    dtype: torch.dtype
    storage_offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild(storage: Any, storage_offset: int, size: Any, stride: Any, *_: Any) -> _Tensor:
    key, dtype = storage
    return _Tensor(key, dtype, int(storage_offset), tuple(size), tuple(stride))


_DTYPES: dict[str, torch.dtype] = {}


def _storage_dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        with warnings.catch_warnings():  # the legacy typed storages are deprecated
            warnings.simplefilter("ignore")
            _DTYPES[name] = getattr(torch, name).dtype
    return _DTYPES[name]


class _Header(pickle.Unpickler):
    """Unpickles ``data.pkl`` of a one-tensor archive into a :class:`_Tensor`;
    any other object (any other global) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch" and name.endswith("Storage") and name != "UntypedStorage":
            return name
        if (module, name) == ("torch", "UntypedStorage"):
            return "UntypedStorage"
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a plain tensor")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"persistent id {pid!r}")
        _, storage_type, key, _location, _numel = pid
        dtype = torch.uint8 if storage_type == "UntypedStorage" else _storage_dtype(storage_type)
        return str(key), dtype


def tensor_layout(source: Source, offset: int, length: int) -> Layout | None:
    """The layout of the tensor archive at ``[offset, offset + length)``;
    None when it is not an uncompressed archive of one plain tensor."""
    try:
        archive = torch._C.PyTorchFileReader(_Archive(source, offset, length))
        t = _Header(io.BytesIO(archive.get_record("data.pkl"))).load()
        if not isinstance(t, _Tensor):
            return None
        at = archive.get_record_offset(f"data/{t.key}")
    except (pickle.UnpicklingError, RuntimeError, ValueError, TypeError, EOFError):
        return None
    return Layout(offset + at, t.dtype, t.storage_offset, t.size, t.stride)


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
    else "scratch" (done)."""
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
        threads = _knobs.get("dcp_read_threads")
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
