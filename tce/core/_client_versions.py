"""The client's calls for published versions (tce.weights): a mixin of
:class:`~tce.core._client.Client`, which provides ``_call``, ``_flush``,
``_unmap``, ``_request_fd``, ``_lock``, ``_kept``, ``_released_versions``
and ``session``."""

from __future__ import annotations

import mmap
import os

from tce.core import _mapping
from tce.errors import NotCachedError
from tce.v1 import tce_pb2 as pb


class VersionCalls:
    def _flush_versions(self) -> None:
        """Send the version releases finalizers queued."""
        while self._released_versions:
            lease = self._released_versions.popleft()
            try:
                self._call("ReleaseVersion", pb.ReleaseVersionRequest(session=self.session,
                                                                      lease_id=lease))
            except NotCachedError:  # it ended already (expired)
                pass

    def get_version(self, job: str, *, after: int = 0, timeout: float = 0.0) -> pb.TagInfo:
        """The job's newest version above ``after``; with ``timeout`` > 0 the
        server answers when one is published (DeadlineExceededError when none
        is in time), else NotCachedError at once."""
        self._flush()  # a reader's last version's release goes before it waits
        request = pb.GetVersionRequest(session=self.session, job=job, after=after, timeout_s=timeout)
        return self._call("GetVersion", request,
                          timeout=None if timeout <= 0 else timeout + 30).tag

    def acquire_version(self, job: str, version: int = 0, *, lease_s: float = 0.0,
                        paths: list[str] | None = None) -> pb.AcquireVersionResponse:
        """A lease on a version (0: the newest): its files, with a buffer id
        for each one held in this server's memory. ``paths``: of a followed
        job, the files to bring here first when this node lacks them."""
        self._flush()
        resp = self._call("AcquireVersion", pb.AcquireVersionRequest(
            session=self.session, job=job, version=version, lease_s=lease_s, paths=paths or []),
            timeout=None if paths else -1.0)
        self._unmap(resp.unmap_buffer_ids)
        return resp

    def renew_version(self, lease: int, lease_s: float = 0.0) -> float:
        return self._call("RenewVersion", pb.RenewVersionRequest(
            session=self.session, lease_id=lease, lease_s=lease_s)).lease_s

    def release_version(self, lease: int, *, later: bool = False) -> None:
        """End a version lease now, or (``later``: from a finalizer, which
        may not block) with the next call."""
        self._released_versions.append(lease)
        if not later:
            self._flush()

    def map_leased(self, buffer_id: int, size: int) -> tuple[mmap.mmap, bool]:
        """A private (copy-on-write) mapping of a buffer this session leases,
        and whether it maps the buffer (False: a private copy)."""
        fd = self._request_fd(buffer_id)
        try:
            return _mapping.map_private(fd, size)
        finally:
            os.close(fd)

    def kept_mapping(self, buffer_id: int, capacity: int) -> _mapping.ReadMapping:
        """A read-only shared mapping of a buffer this session leases, made
        once and kept until the server says the buffer went (see
        :class:`~tce.core._mapping.ReadMapping`): read it under a lease only."""
        with self._lock:
            m = self._kept.get(buffer_id)
        if m is not None:
            return m
        fd = self._request_fd(buffer_id, keep_mapped=True)
        try:
            m = _mapping.ReadMapping(buffer_id, capacity, fd)
        finally:
            os.close(fd)
        with self._lock:
            kept = self._kept.setdefault(buffer_id, m)
        if kept is not m:  # another thread mapped it meanwhile
            m.close()
        return kept

    def follow(self, job: str, sources: list[str]) -> pb.TagInfo | None:
        """Follow a job published on other nodes (their peer endpoints): the
        newest version they have, or None."""
        resp = self._call("Follow", pb.FollowRequest(session=self.session, job=job, sources=sources))
        return resp.newest if resp.HasField("newest") else None

    def grant_read(self, job: str, uids: list[int], gids: list[int], nodes: list[str] | None = None, *,
                   revoke: bool = False) -> pb.GrantReadResponse:
        return self._call("GrantRead", pb.GrantReadRequest(
            session=self.session, job=job, uids=uids, gids=gids, nodes=nodes or [], revoke=revoke))
