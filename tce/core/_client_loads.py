"""The client's load calls: a mixin of :class:`~tce.core._client.Client`,
which provides ``_call``, ``_flush``, ``_unmap``, ``_request_fd``,
``_lock``, ``_leases``, ``_released``, ``_range_buffer``, ``loaded`` and
``session``. A load maps a cached buffer privately (copy-on-write) under a
lease that is released when the last view of it dies."""

from __future__ import annotations

import logging
import mmap
import os
import weakref

import torch

from tce.core import _mapping
from tce.errors import TCEError
from tce.v1 import tce_pb2 as pb

log = logging.getLogger(__name__)

MAX_RANGE = 16 << 20  # the most one ReadRange call returns (the server's kMaxRangeLength)

# LookupResponse.source -> the key of Client.loaded
_SOURCES = {pb.LOAD_SOURCE_CACHE: "cache", pb.LOAD_SOURCE_PEER: "peer", pb.LOAD_SOURCE_STORAGE: "storage"}


class LoadCalls:
    def _leased_lookup(self, job: str, path: str, local_only: bool) -> pb.LookupResponse:
        self._flush()
        resp = self._call(
            "Lookup", pb.LookupRequest(session=self.session, job=job, path=path, lease=True,
                                       local_only=local_only)
        )
        self._unmap(resp.unmap_buffer_ids)
        source = _SOURCES.get(resp.source)
        if source:
            self.loaded[source] += resp.file.size
        return resp

    def open(self, job: str, path: str, *, local_only: bool = False) -> tuple[pb.FileInfo, mmap.mmap]:
        """Map a cached file privately (copy-on-write) under a lease.

        The lease is released once the returned mapping is garbage (all views
        of it, e.g. loaded tensors, are gone). With ``local_only`` the server
        does not bring the file here from the ring on a miss. Raises
        NotCachedError.
        """
        resp = self._leased_lookup(job, path, local_only)
        info = resp.file
        try:
            fd = self._request_fd(info.buffer_id)
            try:
                mm, mapped = _mapping.map_private(fd, info.size)
            finally:
                os.close(fd)
        except BaseException:
            self._released.append(resp.lease_id)
            raise
        lease = resp.lease_id
        if not mapped:  # a copy: the buffer is free for reuse at once
            self._released.append(lease)
            return info, mm
        with self._lock:
            self._leases[lease] = weakref.ref(mm)
        weakref.finalize(mm, self._lease_done, lease)
        return info, mm

    def open_fd(self, job: str, path: str, *, local_only: bool = False) -> tuple[pb.FileInfo, int, int]:
        """A cached file's buffer as a file descriptor, under a lease: (the
        file, the fd, the lease). Nothing is mapped, so reading it with
        ``os.preadv`` sets up no page tables. The caller closes the fd and
        passes the lease to :meth:`release_lease`. Raises NotCachedError.
        """
        resp = self._leased_lookup(job, path, local_only)
        try:
            fd = self._request_fd(resp.file.buffer_id)
        except BaseException:
            self._released.append(resp.lease_id)
            raise
        return resp.file, fd, resp.lease_id

    def release_lease(self, lease: int) -> None:
        """Give back a lease of :meth:`open_fd` (sent with the next call)."""
        self._released.append(lease)

    def _lease_done(self, lease: int) -> None:
        # Runs in whichever thread drops the last view: no I/O, no blocking.
        self._leases.pop(lease, None)
        self._released.append(lease)

    def detach_leases(self) -> int:
        """Make every live load independent of the cache, then release its lease.

        Loaded tensors view a private (copy-on-write) mapping of a cached
        buffer, which keeps the buffer from being reused while they live (an
        optimizer keeps its loaded state for the whole run). Writing one byte
        per page forces the kernel to give each page its own copy; after that
        the buffer may be reused. Returns the number of leases released.
        """
        with self._lock:
            live = [(lease, ref()) for lease, ref in self._leases.items()]
        released = 0
        for lease, mm in live:
            if mm is None:
                continue
            pages = torch.frombuffer(mm, dtype=torch.uint8)[:: mmap.PAGESIZE]
            pages.copy_(pages.clone())
            del pages
            if self._leases.pop(lease, None) is not None:
                self._released.append(lease)
                released += 1
        self._flush()
        return released

    def read_range(self, job: str, path: str, offset: int, length: int, *, buffer_offset: int | None = None,
                   etag: str = "", size: int = 0) -> pb.ReadRangeResponse:
        """Bytes ``[offset, offset + length)`` (at most :data:`MAX_RANGE`) of a file from this
        server's cache, a copy it holds, a ring peer, or its object (``etag``, ``size``: the
        identity a load pinned): in the reply's ``data``, or with ``buffer_offset`` at that
        offset of this session's range buffer (:meth:`range_buffer`). Raises NotCachedError
        when none has it."""
        return self._call("ReadRange", pb.ReadRangeRequest(
            session=self.session, job=job, path=path, offset=offset, length=length,
            into_buffer=buffer_offset is not None, buffer_offset=buffer_offset or 0, expect_etag=etag,
            expect_size=size))

    def range_buffer(self) -> tuple[int, int] | None:
        """This session's range buffer, where :meth:`read_range` can put the
        bytes so they never travel inside a reply: (a read-only fd, its size
        in bytes), got once per session and closed with the client. None when
        the server has none to give (an older server, or too many sessions
        hold one); read through the reply then."""
        with self._lock:
            if self._range_buffer is not None:
                return self._range_buffer or None
        try:
            fd = self._request_fd(0, range_buffer=True)
            got: tuple[int, int] | tuple[()] = (fd, os.fstat(fd).st_size)
        except TCEError as e:
            log.debug("no range buffer: %s", e)
            got = ()
        with self._lock:
            if self._range_buffer is None:
                self._range_buffer = got
            elif got:  # another thread got it first
                os.close(got[0])
            return self._range_buffer or None
