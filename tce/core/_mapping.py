"""This process's mappings of cache buffers: a writable shared mapping kept
for a buffer's life (faulted in once), and the private (copy-on-write)
mappings loads read through."""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import warnings
from typing import Any

import torch

from tce.core import _staging
from tce.errors import TCEError

log = logging.getLogger(__name__)


def page_size(fd: int) -> int:
    """The size of the pages backing a buffer's memfd: 2 MiB for a hugetlb
    (or shmem THP) buffer, whose filesystem reports it as ``st_blksize``,
    else the base page size."""
    return max(os.fstat(fd).st_blksize, mmap.PAGESIZE)


def _advise_huge(mm: mmap.mmap) -> None:
    """Let a mapping of a buffer on shmem transparent huge pages map them
    with huge page-table entries (needed when ``shmem_enabled`` is
    ``advise``; a THP memfd reports 4 KiB ``st_blksize``, so every mapping
    is advised; on 4 KiB and hugetlb buffers it changes nothing)."""
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mm.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass  # hugetlb mappings are huge already


_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux 5.14


_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _populate(mm: mmap.mmap, tensor: torch.Tensor, page: int) -> None:
    """Fault in every page of a mapping now (read faults). Through ctypes,
    which lets go of the GIL for the call (``mmap.madvise`` holds it, and
    populating a GiB of 4 KiB pages takes tenths of a second that no other
    thread of the process could run)."""
    if _libc.madvise(tensor.data_ptr(), len(mm), _MADV_POPULATE_READ) != 0:
        tensor[::page].max()  # an older kernel: touch a byte per page


def map_private(fd: int, size: int) -> tuple[mmap.mmap, bool]:
    """Map a cached file copy-on-write; returns the mapping and whether it
    is a mapping of the buffer (False: a private copy).

    The length is rounded up to the buffer's page size: the kernel unmaps a
    hugetlb mapping only in whole huge pages (an unaligned ``munmap`` fails and
    would leak the mapping). A private hugetlb mapping needs free huge pages
    reserved for its copy-on-write; where the kernel has too few (ENOMEM),
    the file is read into private anonymous memory instead.
    """
    page = page_size(fd)
    length = min(-(-size // page) * page, os.fstat(fd).st_size)
    try:
        mm = mmap.mmap(fd, length, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        _advise_huge(mm)
        return mm, True
    except OSError as e:
        if e.errno != errno.ENOMEM or page == mmap.PAGESIZE:
            raise
    global _copy_logged
    if not _copy_logged:
        _copy_logged = True
        log.info("no free huge pages for a copy-on-write mapping of a cached file: loads copy it "
                 "(reserve more in /proc/sys/vm/nr_hugepages to load without a copy)")
    mm = mmap.mmap(-1, max(size, 1))
    view = memoryview(mm)
    try:
        done = 0
        while done < size:
            n = os.preadv(fd, [view[done:size]], done)
            if n <= 0:
                raise TCEError(f"short read of a cached file: {done} of {size} bytes")
            done += n
    finally:
        view.release()
    return mm, False


_copy_logged = False


class ReadMapping:
    """A read-only shared mapping of a buffer a reader leases, kept across
    leases (FdRequest.keep_mapped): a reader of published versions whose
    buffers the trainer reuses maps and faults each in once, and registers
    it with CUDA once. Its bytes are read under a lease only (they may
    change between leases); the server says when to unmap it."""

    __slots__ = ("buffer_id", "capacity", "mm", "tensor", "cuda_registered", "parsed")

    def __init__(self, buffer_id: int, capacity: int, fd: int) -> None:
        self.buffer_id = buffer_id
        self.capacity = capacity
        self.cuda_registered = False
        self.parsed: Any = None  # a reader's parse of the file in it (tce.weights), kept with it
        self.mm = mmap.mmap(fd, capacity, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        _advise_huge(self.mm)
        with warnings.catch_warnings():  # read-only by the mapping: never written through
            warnings.simplefilter("ignore", UserWarning)
            self.tensor = torch.frombuffer(self.mm, dtype=torch.uint8)

    def close(self) -> None:
        if self.cuda_registered:
            _staging.unregister(self)
        self.tensor = None
        self.parsed = None
        try:
            self.mm.close()
        except BufferError:  # a tensor of a load still views it: it goes with the last one
            pass


class Mapping:
    """A writable shared mapping of one buffer, kept for the buffer's life."""

    __slots__ = ("buffer_id", "capacity", "mm", "view", "tensor", "cuda_registered")

    def __init__(self, buffer_id: int, capacity: int, fd: int) -> None:
        self.buffer_id = buffer_id
        self.capacity = capacity
        self.cuda_registered = False  # registered with CUDA by the first GPU save (_staging)
        self.mm = mmap.mmap(
            fd, capacity, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE
        )
        page = page_size(fd)
        _advise_huge(self.mm)
        self.view = memoryview(self.mm)
        self.tensor = torch.frombuffer(self.mm, dtype=torch.uint8)
        # Fault every page in once, now, so no save into this buffer ever takes
        # a page fault. Measured on a 1 GiB memfd of 4 KiB pages:
        # MADV_POPULATE_READ takes 0.09 s, read-touching one byte per page
        # 0.12 s, both mapping writable entries (shmem needs no write
        # notification); MAP_POPULATE took 1.8 s and MADV_POPULATE_WRITE 1.5 s.
        # Letting the first copy fault instead costs 0.35 s. With 2 MiB pages
        # it is one fault per huge page: 0.02-0.05 s.
        _populate(self.mm, self.tensor, page)

    def close(self) -> None:
        if self.cuda_registered:
            _staging.unregister(self)
        self.tensor = None
        self.view.release()
        try:
            self.mm.close()
        except BufferError:
            # Tensors still view the buffer (a DCP stager's staged state
            # dict): the mapping goes when the last of them does.
            pass
