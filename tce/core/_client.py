"""A session with the node's cache server: gRPC control plus the fd socket.

The session lives as long as the fd-socket connection; the server reclaims a
session's PENDING buffers and leases when it closes (the process exited or was
killed). Buffers this process writes stay mapped (``MAP_SHARED``) for the
buffer's lifetime and are faulted in once, so a steady-state save does no
mmap, no fd passing and no page faults. Loads map the buffer privately (copy-on-write)
under a lease that is released when the last tensor viewing it dies.

Thread-safe: any thread may save or load; releases queued by finalizers are
sent with the next call.
"""

from __future__ import annotations

import collections
import logging
import mmap
import os
import socket
import threading
import weakref
from typing import Any, Callable, Iterable

import grpc
import torch

from tce.core import _layout, _mapping, _staging
from tce.core import _client_loads
from tce.core._client_loads import LoadCalls
from tce.core._client_versions import VersionCalls
from tce.core._files import current_umask
from tce.errors import (
    CacheFullError,
    FailedPreconditionError,
    MissingDirectoryError,
    NotCachedError,
    PathIsADirectoryError,
    ServerUnavailableError,
    TCEError,
    error_for,
)
from tce.v1 import tce_pb2 as pb
from tce.v1 import tce_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

_CODE_NAMES = {sc.value[0]: sc.name for sc in grpc.StatusCode}
_FD_PACKET = 4096
MAX_RANGE = _client_loads.MAX_RANGE  # the most one ReadRange call returns (the server's kMaxRangeLength)



def fd_socket_path(socket_path: str) -> str:
    return socket_path + ".fd"


# A save of at least this many bytes into a buffer not mapped here yet
# writes it with pwrite (FdStaging): below, a mapping costs little.
PWRITE_MIN_BYTES = 64 << 20


class Client(LoadCalls, VersionCalls):
    """One session with a tce-server."""

    def __init__(self, socket_path: str, *, rpc_timeout: float) -> None:
        self.socket_path = socket_path
        self.pid = os.getpid()
        self._timeout = rpc_timeout
        self._fd_sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._fd_sock.connect(fd_socket_path(socket_path))
            packet = self._fd_sock.recv(_FD_PACKET)
        except OSError as e:
            self._fd_sock.close()
            raise ServerUnavailableError(
                f"cannot reach the TCE server at {socket_path}: {e.strerror or e}"
            ) from None
        if not packet:
            self._fd_sock.close()
            raise ServerUnavailableError(f"the TCE server at {socket_path} closed the connection")
        hello = pb.SessionHello.FromString(packet)
        if hello.code != 0:
            self._fd_sock.close()
            raise error_for(_CODE_NAMES.get(hello.code, "UNKNOWN"), hello.message)
        self.session = hello.session
        self.server_version = hello.server_version
        self._channel = grpc.insecure_channel(
            "unix:" + os.path.abspath(socket_path),
            options=[
                ("grpc.max_receive_message_length", 256 << 20),
                ("grpc.enable_http_proxy", 0),
            ],
        )
        self._stub = pb_grpc.CacheStub(self._channel)
        self._lock = threading.Lock()  # guards _mappings, _premapping, _retired and _unmapped
        self._fd_lock = threading.Lock()  # one request/reply at a time on the fd socket
        self._mappings: dict[int, _mapping.Mapping] = {}
        self._premapping: dict[int, threading.Event] = {}  # buffers being mapped in the background
        self.pwrite_saves = 0  # saves written with pwrite into a buffer not mapped yet
        self._retired: set[int] = set()  # of those, the ones the server retired meanwhile
        self._unmapped: list[int] = []
        # The session's range buffer: None until asked for, () when there is none.
        self._range_buffer: tuple[int, int] | tuple[()] | None = None
        self._released: collections.deque[int] = collections.deque()  # appended by finalizers
        self._leases: dict[int, weakref.ref] = {}  # live lease id -> its private mapping
        self._released_versions: collections.deque[int] = collections.deque()  # by finalizers
        self._kept: dict[int, _mapping.ReadMapping] = {}  # leased buffers kept mapped (readers)
        self.fd_requests = 0  # fds received so far (a steady-state save needs none)
        # Bytes this session's loads found, by where (LoadSource name): the
        # node's memory, another node's over the ring, storage.
        self.loaded: collections.Counter[str] = collections.Counter()
        self.closed = False

    # ---- plumbing -------------------------------------------------------

    def _call(self, method: str, request, *, timeout: float | None = -1.0):
        """One RPC; gRPC errors become TCEErrors. timeout -1: the client's default."""
        try:
            return getattr(self._stub, method)(
                request, timeout=self._timeout if timeout == -1.0 else timeout
            )
        except grpc.RpcError as e:
            code = e.code().name if e.code() is not None else "UNKNOWN"
            raise error_for(code, e.details() or code) from None

    def _flush(self) -> None:
        """Send queued lease releases and unmap acknowledgements."""
        self._flush_versions()
        leases = []
        while self._released:
            leases.append(self._released.popleft())
        with self._lock:
            unmapped, self._unmapped = self._unmapped, []
        if leases or unmapped:
            self._call(
                "Release",
                pb.ReleaseRequest(
                    session=self.session, lease_ids=leases, unmapped_buffer_ids=unmapped
                ),
            )

    def _unmap(self, buffer_ids: Iterable[int]) -> None:
        for buffer_id in buffer_ids:
            with self._lock:
                kept = self._kept.pop(buffer_id, None)
                m = self._mappings.pop(buffer_id, None)
            if kept is not None:
                kept.close()
                self._unmapped.append(buffer_id)
                if buffer_id in self._premapping:  # dropped when its mapping is made
                    self._retired.add(buffer_id)
            if m is not None:
                m.close()
                log.debug("unmapped retired buffer %d", buffer_id)

    def _request_fd(self, buffer_id: int, *, range_buffer: bool = False,
                    keep_mapped: bool = False) -> int:
        with self._fd_lock:
            self.fd_requests += 1
            try:
                self._fd_sock.send(pb.FdRequest(buffer_id=buffer_id, range_buffer=range_buffer,
                                                keep_mapped=keep_mapped).SerializeToString())
                packet, fds, _, _ = socket.recv_fds(self._fd_sock, _FD_PACKET, 1)
            except OSError as e:
                raise ServerUnavailableError(f"fd socket failed: {e}") from None
        if not packet:
            for fd in fds:
                os.close(fd)
            raise ServerUnavailableError("the TCE server closed the fd socket")
        reply = pb.FdReply.FromString(packet)
        if reply.code != 0 or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            if reply.code == 0:
                raise TCEError(f"fd reply for buffer {buffer_id} carried {len(fds)} fds")
            raise error_for(_CODE_NAMES.get(reply.code, "UNKNOWN"), reply.message)
        return fds[0]

    def _writable_mapping(self, buffer_id: int, capacity: int, fd: int = -1) -> _mapping.Mapping:
        """This process's mapping of the buffer, made now if there is none
        (from ``fd`` when given: it is closed)."""
        with self._lock:
            m = self._mappings.get(buffer_id)
        if m is not None:
            if fd >= 0:
                os.close(fd)
            return m
        if fd < 0:
            fd = self._request_fd(buffer_id)
        try:
            m = _mapping.Mapping(buffer_id, capacity, fd)
        finally:
            os.close(fd)
        with self._lock:
            self._mappings[buffer_id] = m
        return m

    def registered_mapping(self, buffer_id: int) -> _mapping.Mapping | None:
        """This process's writable mapping of the buffer, if registered with CUDA."""
        with self._lock:
            m = self._mappings.get(buffer_id)
        return m if m is not None and m.cuda_registered else None

    # ---- operations -----------------------------------------------------

    def save(self, plan: _layout.Plan, *, job: str, tag: str, rank: int, path: str,
             blocking: bool = True, on_allocated: Callable[[int], None] | None = None) -> Any:
        """Write a planned file into a fresh buffer and commit it.

        Returns the committed FileInfo; with ``blocking=False``, a
        :class:`~tce.core._staging.StagedSave` as soon as the copies' places on
        the device streams are marked (the staging thread writes the file,
        waits for the copies and commits). ``on_allocated`` is told the
        allocation id (the file's ``version`` once committed) as soon as the
        server gave it.
        """
        resp = self._allocate(job=job, tag=tag, rank=rank, path=path, size=plan.size)
        if on_allocated is not None:
            on_allocated(resp.allocation_id)
        # torch.save reads its CRC choice when it is called: so does this,
        # not the staging thread that commits later.
        omit_zip_crc32 = not torch.serialization.get_crc32_options()

        def commit(staging: _staging.Staging | _staging.FdStaging) -> pb.FileInfo:
            try:
                staging.finish()
                records = [
                    pb.Record(name=r.name, header_offset=r.header_offset,
                              data_offset=r.data_offset, size=r.size,
                              central_offset=r.central_offset)
                    for r in plan.records
                ]
                info = self._call(
                    "Commit",
                    pb.CommitRequest(
                        session=self.session, allocation_id=resp.allocation_id, records=records,
                        omit_zip_crc32=omit_zip_crc32,
                    ),
                ).file
            except BaseException:
                self._abort(resp.allocation_id)
                if isinstance(staging, _staging.FdStaging):
                    staging.close()
                raise
            if isinstance(staging, _staging.FdStaging):
                # Once the save is answered: the mapping's page faults must
                # not compete with the save they would serve later.
                try:
                    self._map_later(resp.buffer_id, resp.capacity, staging.fd)
                finally:
                    staging.close()
            return info

        try:
            staging = self._staging_for(plan, resp.buffer_id, resp.capacity)
        except BaseException:
            self._abort(resp.allocation_id)
            raise
        if blocking:
            return commit(staging)
        return _staging.submit(path, plan.size, lambda: commit(staging))

    def _staging_for(self, plan: _layout.Plan, buffer_id: int, capacity: int) -> Any:
        """How a save reaches the buffer: through this process's mapping of
        it; or, for a large save of host memory into a buffer not mapped here
        yet, by ``pwrite`` (no page-table setup on the save's path), the
        buffer then mapped in the background for the saves after it (a save
        into it meanwhile waits for that mapping, then copies)."""
        with self._lock:
            m = self._mappings.get(buffer_id)
            mapping = self._premapping.get(buffer_id)
        if m is None and mapping is None and plan.size >= PWRITE_MIN_BYTES and \
                all(s.device.type == "cpu" for s in plan.storages):
            fd = self._request_fd(buffer_id)
            if _mapping.page_size(fd) == mmap.PAGESIZE:
                self.pwrite_saves += 1
                return _staging.FdStaging(plan, fd)
            # Huge pages: a mapping costs little (and hugetlbfs has no write()).
            return _staging.Staging(plan, self._writable_mapping(buffer_id, capacity, fd))
        if m is None and mapping is not None:
            mapping.wait()
            with self._lock:
                m = self._mappings.get(buffer_id)
        if m is None:
            m = self._writable_mapping(buffer_id, capacity)
        return _staging.Staging(plan, m)

    def _map_later(self, buffer_id: int, capacity: int, fd: int) -> None:
        """Maps the buffer (and faults it in) on a thread of its own: the
        next save into it is a plain copy. The mapping is dropped if the
        server retired the buffer meanwhile."""
        mine = os.dup(fd)
        done = threading.Event()
        with self._lock:
            self._premapping[buffer_id] = done

        def run() -> None:
            m = None
            try:
                m = _mapping.Mapping(buffer_id, capacity, mine)
            except (OSError, ValueError) as e:
                log.debug("mapping buffer %d in the background failed: %s", buffer_id, e)
            finally:
                os.close(mine)
            with self._lock:
                del self._premapping[buffer_id]
                keep = m is not None and not self.closed and buffer_id not in self._retired \
                    and buffer_id not in self._mappings
                if keep:
                    self._mappings[buffer_id] = m
                self._retired.discard(buffer_id)
            if m is not None and not keep:
                m.close()
            done.set()

        threading.Thread(target=run, name="tce-map", daemon=True).start()

    def _allocate(self, *, job: str, tag: str, rank: int, path: str, size: int) -> Any:
        """Allocate a buffer for a file of ``size`` bytes at ``path``."""
        self._flush()
        request = pb.AllocateRequest(
            session=self.session, job=job, tag=tag, rank=rank, path=path, size=size,
            mode=0o666 & ~current_umask(),
        )
        try:
            try:
                resp = self._call("Allocate", request)
            except CacheFullError:
                if not self.detach_leases():
                    raise
                resp = self._call("Allocate", request)  # our loads no longer pin buffers
        except NotCachedError as e:  # the only NOT_FOUND of Allocate: no such directory
            raise MissingDirectoryError(e.message, filename=path) from None
        except FailedPreconditionError as e:
            if e.message.startswith("Is a directory"):  # storage_check.cc's words
                raise PathIsADirectoryError(e.message, filename=path) from None
            raise
        self._unmap(resp.unmap_buffer_ids)
        return resp

    def allocate(self, *, job: str, tag: str, rank: int, path: str, size: int) -> "Allocation":
        """A mapped, writable buffer for a file of ``size`` bytes that is not
        a torch zip (no records): write its bytes, then commit or abort it."""
        resp = self._allocate(job=job, tag=tag, rank=rank, path=path, size=size)
        try:
            m = self._writable_mapping(resp.buffer_id, resp.capacity)
        except BaseException:
            self._abort(resp.allocation_id)
            raise
        return Allocation(self, resp.allocation_id, m, path, size)

    def _commit_raw(self, allocation_id: int) -> pb.FileInfo:
        # No records (a byte range table is for torch zips only: the persister
        # checks each record's data descriptor), so no zip CRCs to patch.
        return self._call("Commit", pb.CommitRequest(
            session=self.session, allocation_id=allocation_id, omit_zip_crc32=True)).file

    def _abort(self, allocation_id: int) -> None:
        try:
            self._call("Abort", pb.AbortRequest(session=self.session, allocation_id=allocation_id))
        except TCEError:
            pass

    def lookup(self, job: str, path: str) -> pb.FileInfo:
        return self._call(
            "Lookup", pb.LookupRequest(session=self.session, job=job, path=path)
        ).file

    def remove(self, job: str, path: str, from_storage: bool = False) -> pb.FileInfo:
        return self._call("Remove", pb.RemoveRequest(session=self.session, job=job, path=path,
                                                     from_storage=from_storage)).file

    def retry(self, job: str, paths: list[str]) -> list[pb.FileInfo]:
        """Persist FAILED files again now (all of the job's when `paths` is empty)."""
        return list(self._call(
            "Retry", pb.RetryRequest(session=self.session, job=job, paths=paths)).files)

    def list(self, job: str = "", tag: str = "", *, check_storage: bool = False,
             wait_for_restore: bool = False, storage_dir: str = "") -> list[pb.FileInfo]:
        """The job's files; with ``check_storage``, each cached one is first
        compared with storage, as a load would (docs/semantics.md); with
        ``wait_for_restore``, once the server has pulled the job's files back
        from the ring, if it is doing so (bounded by the server's
        ``ring_restore_wait_ms``: DeadlineExceededError); with ``storage_dir``
        (under an object root), the files object storage holds there instead."""
        request = pb.ListRequest(session=self.session, job=job, tag=tag, check_storage=check_storage,
                                 wait_for_restore=wait_for_restore, storage_dir=storage_dir)
        # A wait for a restore is bounded by the server (ring_restore_wait_ms),
        # which then says what it waited for: no client deadline cuts it short.
        return list(self._call("List", request, timeout=None if wait_for_restore else -1.0).files)

    def wait(self, job: str, paths: list[str], timeout: float | None) -> list[pb.FileInfo]:
        """Block until the files are PERSISTED or FAILED (server-side wait)."""
        request = pb.WaitRequest(session=self.session, job=job, paths=paths,
                                 timeout_s=timeout or 0.0)
        return list(self._call("Wait", request,
                               timeout=None if timeout is None else timeout + 30).files)

    def status(self) -> pb.StatusResponse:
        return self._call("Status", pb.StatusRequest(session=self.session))

    def commit_tag(self, tag: pb.TagInfo) -> pb.TagInfo:
        """Record that every rank finished ``tag`` (rank 0 calls this)."""
        return self._call("CommitTag", pb.CommitTagRequest(session=self.session, tag=tag)).tag

    def set_ring(self, job: str, node_rank: int, endpoints: list[str]) -> str:
        """Tell the server the job's ring; returns its successor ("" with one node)."""
        return self._call("SetRing", pb.SetRingRequest(
            session=self.session, job=job, node_rank=node_rank, endpoints=endpoints)).successor

    def prefetch(self, job: str, *, dir: str = "", paths: list[str] | None = None) -> bool:
        """Have the server start reading its share of a checkpoint the job is
        about to load (the files of ``dir`` on storage, or ``paths``); returns
        whether it queued anything."""
        return self._call("Prefetch", pb.PrefetchRequest(
            session=self.session, job=job, dir=dir, paths=paths or [])).queued

    def list_tags(self, job: str, *, wait_for_restore: bool = False) -> list[pb.TagInfo]:
        """The job's complete tags, oldest first; with ``wait_for_restore``,
        once the server has pulled the job back from the ring (its tags come
        back with its files), bounded as :meth:`list` is."""
        request = pb.ListTagsRequest(session=self.session, job=job, wait_for_restore=wait_for_restore)
        return list(self._call("ListTags", request, timeout=None if wait_for_restore else -1.0).tags)

    def flush(self) -> None:
        """Send pending lease releases now."""
        self._flush()

    @property
    def mapped_buffers(self) -> int:
        with self._lock:
            return len(self._mappings)

    def close(self) -> None:
        """End the session (the server frees what it holds for us)."""
        if self.closed:
            return
        self.closed = True
        if os.getpid() != self.pid:
            return  # a forked child must not touch the parent's channel
        try:
            self._flush()
        except TCEError:
            pass
        with self._lock:
            mappings, self._mappings = self._mappings, {}
            kept, self._kept = self._kept, {}
        for m in [*mappings.values(), *kept.values()]:
            m.close()
        with self._lock:
            if self._range_buffer:
                os.close(self._range_buffer[0])
            self._range_buffer = ()
        self._fd_sock.close()
        self._channel.close()


class Allocation:
    """A buffer allocated for one file and mapped writable in this process.

    ``tensor`` (uint8) and ``view`` cover the file's ``size`` bytes. Exactly
    one of :meth:`commit` and :meth:`abort` ends it; a process that dies
    first leaves nothing (the server reclaims its session's allocations).
    """

    def __init__(self, client: Client, allocation_id: int, mapping: _mapping.Mapping, path: str,
                 size: int) -> None:
        self._client = client
        self._id = allocation_id
        self.version = allocation_id  # the committed file's version
        self.path = path
        self.size = size
        self.tensor = mapping.tensor[:size]
        self.view = mapping.view[:size]

    def commit(self) -> pb.FileInfo:
        """Hand the bytes to the server (which persists them); returns the file."""
        try:
            return self._client._commit_raw(self._id)
        except BaseException:
            self._client._abort(self._id)
            raise
        finally:
            self._release()

    def abort(self) -> None:
        """Give the buffer back; nothing is saved."""
        self._client._abort(self._id)
        self._release()

    def _release(self) -> None:
        self.tensor = None
        if self.view is not None:
            self.view.release()
            self.view = None
