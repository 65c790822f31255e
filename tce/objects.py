"""``tce.objects``: files under the server's object storage roots (S3).

A server started with ``storage_roots`` entries ``DIR=s3://BUCKET/PREFIX``
keeps the files under ``DIR`` as objects of the bucket: nothing exists
there on the local filesystem. What a script or an integration would do to
a local file (see whether it is there, read a small one such as
``latest``, write one, delete an old ``.metadata``, list a directory) goes
through the server instead, and this module is how. :class:`ObjectPin`
keeps one load's ranged reads (:func:`tce.buffers.read_range`) on the
object it began with.

Every call goes through this process's session, as :mod:`tce.client`'s do.
Any thread may call these functions.

Example::

    import tce.objects

    latest = "/ckpt/run1/latest"                     # under DIR=s3://bucket/run1
    if tce.objects.is_object_path(latest):
        tag = (tce.objects.read_bytes(latest) or b"").decode()
        for path, size in tce.objects.stored_files(f"/ckpt/run1/{tag}"):
            print(path, size)
"""

from __future__ import annotations

import os

from tce import _service, buffers
from tce.core import _objects

__all__ = ["ObjectPin", "delete_object", "is_object_path", "read_bytes", "save_bytes",
           "stored_files"]

ObjectPin = _objects.ObjectPin


def is_object_path(path: str | os.PathLike) -> bool:
    """Whether ``path`` lies under one of the server's object storage roots:
    nothing exists there on the local filesystem, only in the bucket."""
    return _objects.is_object_path(path)


def delete_object(path: str | os.PathLike, *, job: str | None = None) -> None:
    """Drops ``path`` from the cache and deletes its object from the bucket
    (no error when neither holds it)."""
    _objects.delete(_service.norm(path), _service.job_or_default(job))


def stored_files(directory: str | os.PathLike, *, job: str | None = None) -> list[tuple[str, int]]:
    """``(path, size)`` of each file object storage holds under
    ``directory`` (under an object root), by path: what a job restarted on
    empty nodes finds there.

    Raises:
        InvalidArgumentError: ``directory`` is not under an object root.
    """
    return _objects.stored(_service.norm(directory), _service.job_or_default(job))


def read_bytes(path: str | os.PathLike, *, job: str | None = None) -> bytes | None:
    """The bytes of a (small) file through the cache: under an object root,
    fetched from the bucket on a miss. None when there is none."""
    opened = buffers.open_mapped_file(path, job=job)
    if opened is None:
        return None
    info, mm = opened
    try:
        return bytes(mm[:info.size])
    finally:
        mm.close()


def save_bytes(path: str | os.PathLike, data: bytes, *, job: str | None = None, tag: str = "",
               rank: int = 0) -> None:
    """Saves ``data`` at ``path`` through the cache under ``tag``. Under an
    object root the server writes a tag's marker (``latest``,
    ``.metadata``) to the bucket only after the tag's other files are there."""
    dest = buffers.allocate(path, len(data), job=job, tag=tag, rank=rank)
    try:
        dest.view[:len(data)] = data
    except BaseException:
        dest.abort()
        raise
    dest.commit()
