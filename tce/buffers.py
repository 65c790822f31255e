"""``tce.buffers``: a cached file's bytes and mappings, and buffers to write into.

:mod:`tce.client` says which files the node's cache server holds; this
module reaches their bytes and writes files that are not one ``torch.save``
of a path. A cached file comes back as a read-only fd, a copy-on-write
mapping, or a range of it (from this node's cache, another node's through
the ring, or the bucket under an object root). A file to write (a DCP data
file, a safetensors file) gets a buffer of its size to fill, then commit;
:func:`object_layout` and :func:`safetensors_layout` lay out the bytes
``torch.save`` and safetensors write. :func:`save_file` and
:func:`load_file` are ``tce.save`` / ``tce.load`` on a path that say
whether the cache took part, and :data:`torch_save` / :data:`torch_load`
are torch's own, never the patch. The safetensors reader is strict: a file
that lies about its tensors raises ``CorruptCheckpointError`` before any
tensor views it.

Every call goes through this process's session, as :mod:`tce.client`'s do
(:func:`tce.client.session` points it at a server for a block). Any thread
may call these functions.

Example::

    import os
    import tce.buffers

    with tce.buffers.open_fd("/ckpt/step100/model.pt") as cached:
        head = os.pread(cached.fd, 64, 0)             # cached.size bytes in all
    dest = tce.buffers.allocate("/ckpt/step100/notes.bin", 5)
    dest.view[:5] = b"hello"
    dest.commit()                                     # the server persists it
"""

from __future__ import annotations

import mmap
import os
import pickle
from typing import Any, Callable

from tce import _service
from tce.core import _client, _objects
from tce.core._originals import torch_load, torch_save
from tce.core._safetensors import (
    DTYPES as SAFETENSORS_DTYPES,
    header_size as safetensors_header_size,
    iter_safetensors,
    layout as safetensors_layout,
    read_header as read_safetensors_header,
)
from tce.core._staging import StagedSave
from tce.v1 import tce_pb2 as pb

__all__ = [
    "MAX_RANGE", "SAFETENSORS_DTYPES", "StagedSave", "allocate", "iter_safetensors", "load_file",
    "object_layout", "open_fd", "open_mapped_file", "open_mapping", "range_buffer", "read_range",
    "read_safetensors_header", "safetensors_header_size", "safetensors_layout", "save_file",
    "stage_later", "torch_load", "torch_save",
]

# ---------------------------------------------------------------------------
# A cached file's bytes
# ---------------------------------------------------------------------------

MAX_RANGE = _client.MAX_RANGE  # the most bytes one read_range call returns


def open_fd(path: str | os.PathLike, *, job: str | None = None,
            local_only: bool = False) -> Any:
    """The cached file at ``path`` as a read-only file descriptor: an object
    with ``fd`` and ``size`` whose ``close()`` (or the end of a ``with``
    block) closes the fd and releases the lease that keeps the bytes in
    place meanwhile. Read it with ``os.pread``/``os.preadv`` (nothing is
    mapped). None when this node's cache cannot serve it (not held, stale,
    or no server). With ``local_only`` a file that is only in another
    node's memory is not brought here through the ring.
    """
    return _service.open_cached_fd(path, job=job, local_only=local_only)


def open_mapping(path: str | os.PathLike, *, job: str | None = None,
                 local_only: bool = False) -> mmap.mmap | None:
    """The cached file at ``path`` as a private, copy-on-write mapping
    (writes to it never reach the cache), under a lease held while the
    mapping or any view of it (a tensor, a memoryview) lives. None when
    this node's cache cannot serve it; ``local_only`` as for :func:`open_fd`.
    """
    return _service.open_cached(path, job=job, local_only=local_only)


def open_mapped_file(path: str | os.PathLike, *, job: str | None = None,
                     local_only: bool = False) -> tuple[pb.FileInfo, mmap.mmap] | None:
    """:func:`open_mapping` with the file's record: (``FileInfo``, the
    mapping). The file is ``FileInfo.size`` bytes; the mapping may be
    longer (rounded up to whole pages)."""
    return _service.open_cached_file(path, job=job, local_only=local_only)


def read_range(path: str | os.PathLike, offset: int, length: int, *, job: str | None = None,
               buffer_offset: int | None = None,
               pin: _objects.ObjectPin | None = None) -> tuple[Any, str] | None:
    """Bytes ``[offset, offset + length)`` of the file at ``path`` (at most
    :data:`MAX_RANGE`), from this node's cache (``"local"``), through
    the ring, a copy held here or another node's memory (``"peer"``), or,
    under an object root, the object in the bucket (``"storage"``); only
    the range moves. Returns (the bytes, the source); with
    ``buffer_offset`` and a :func:`range_buffer`, ((its fd, the offset),
    the source): the bytes are there. None when no cache has the file.
    ``pin`` (a :class:`tce.objects.ObjectPin` of ``path``, one per load):
    the first range from the bucket pins the object's identity, and later
    ones are read from that object only.

    Raises:
        ValueError: the range is not inside the file.
        FailedPreconditionError: the object pinned was replaced or deleted
            on object storage since.
    """
    return _service.read_range_piece(path, offset, length, job=job, buffer_offset=buffer_offset,
                                     pin=pin)


def range_buffer() -> tuple[int, int] | None:
    """The server's range buffer for this process's session, where
    :func:`read_range` can put bytes so they never travel inside a reply:
    (a read-only fd, its size), closed with the session; None when the
    server has none to give."""
    return _service.range_buffer()


# ---------------------------------------------------------------------------
# Saves and loads, for integrations
# ---------------------------------------------------------------------------

# torch_save and torch_load (imported above) are torch.save and torch.load as
# torch defines them, never the patch (tce.patch_torch): what a fallback
# writes and reads with.


def save_file(obj: Any, f: str | os.PathLike, pickle_module: Any = pickle,
              pickle_protocol: int = 2, *, job: str | None = None, tag: str = "",
              rank: int | None = None, blocking: bool = True) -> Any:
    """``tce.save`` to a path, telling how it went: the committed
    ``FileInfo`` (with ``blocking=False``, a :class:`StagedSave`), or None
    when it fell back to a plain ``torch.save`` (the file is durable then)."""
    return _service.save_file(obj, f, pickle_module, pickle_protocol, job=job, tag=tag,
                              rank=rank, blocking=blocking)


def load_file(f: str | os.PathLike, map_location: Any = None, pickle_module: Any = None, *,
              weights_only: bool | None = None, mmap: bool | None = None,
              job: str | None = None, **pickle_load_args: Any) -> tuple[Any, bool]:
    """``tce.load`` from a path: (the object, whether it came from the cache)."""
    return _service.load_file(f, map_location, pickle_module, weights_only=weights_only,
                              mmap=mmap, job=job, **pickle_load_args)


def allocate(path: str | os.PathLike, size: int, *, job: str | None = None, tag: str = "",
             rank: int | None = None) -> Any:
    """A buffer for a file of ``size`` bytes that is not one torch zip (a
    DCP data file): write its bytes through ``.tensor`` (uint8) or
    ``.view``, then ``.commit()`` (the server persists it; returns the
    ``FileInfo``) or ``.abort()``. When the server is unreachable or full
    (and ``on_unavailable`` is ``fallback``) the buffer is private memory
    and ``.commit()`` writes the file itself, atomically (returns None)."""
    return _service.allocate_file(path, size, job=job, tag=tag, rank=rank)


def object_layout(obj: Any) -> Any:
    """The bytes ``torch.save(obj, stream)`` writes, laid out: ``.size``,
    ``.records``, and ``.write(view, tensor)`` into a buffer (e.g. one of
    :func:`allocate`)."""
    return _service.object_layout(obj)


# safetensors files (tce.core._safetensors): safetensors_layout(tensors,
# metadata) lays out the bytes safetensors.torch.save_file writes, for a
# buffer of allocate(); read_safetensors_header(buf, *, file_size, source),
# safetensors_header_size(first_8_bytes, file_size, *, source) and
# iter_safetensors(buf, *, names, source) read any buffer strictly (tensors
# view it), raising CorruptCheckpointError; SAFETENSORS_DTYPES: name -> dtype.


def stage_later(path: str, size: int, work: Callable[[], Any]) -> StagedSave:
    """Run ``work`` on the staging thread, as an asynchronous save's copies;
    the fence (``tce.wait_staged``, also run before every optimizer step)
    waits for it."""
    return _service.stage_later(path, size, work)
