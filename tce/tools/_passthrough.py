"""A FUSE passthrough filesystem (fusepy): every operation on the mount is
the same operation on a backing directory. The base of the paced storage of
``tce bench --restore`` (:mod:`tce.tools._pacedfs`) and of the tests'
failing filesystem, which change what a few operations do.

:func:`passthrough_class` builds the class on demand, so importing this
module needs no fusepy.
"""

from __future__ import annotations

import errno
import os


def fuse():
    """fusepy's FUSE, FuseOSError and Operations; SystemExit saying what is
    missing when fusepy or libfuse2 is."""
    try:
        from fuse import FUSE, FuseOSError, Operations  # fusepy
    except (ImportError, OSError) as e:  # OSError: fusepy found no libfuse
        raise SystemExit(f"a FUSE filesystem needs fusepy and libfuse2 ({e})") from None
    return FUSE, FuseOSError, Operations


def passthrough_class():
    """The Passthrough Operations class: ``Passthrough(backing)``. Every
    operation resolves its path with ``_real`` (which a subclass may make
    fail); an OSError reaches the kernel as its errno."""
    _, FuseOSError, Operations = fuse()

    class Passthrough(Operations):
        def __init__(self, backing: str) -> None:
            self.backing = os.path.realpath(backing)

        def _real(self, path: str) -> str:
            return os.path.join(self.backing, path.lstrip("/"))

        def __call__(self, op, path, *args):
            try:
                return super().__call__(op, path, *args)
            except OSError as e:
                if isinstance(e, FuseOSError):
                    raise
                raise FuseOSError(e.errno or errno.EIO) from None

        # ---- metadata ----
        def getattr(self, path, fh=None):
            st = os.lstat(self._real(path)) if fh is None else os.fstat(fh)
            return {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size",
                                                "st_atime", "st_mtime", "st_ctime", "st_ino")}

        def access(self, path, amode):
            if not os.access(self._real(path), amode):
                raise FuseOSError(errno.EACCES)

        def readdir(self, path, fh):
            return [".", "..", *os.listdir(self._real(path))]

        def readlink(self, path):
            return os.readlink(self._real(path))

        def statfs(self, path):
            s = os.statvfs(self._real(path))
            return {k: getattr(s, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                               "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

        def chmod(self, path, mode):
            os.chmod(self._real(path), mode)

        def chown(self, path, uid, gid):
            os.lchown(self._real(path), uid, gid)

        def utimens(self, path, times=None):
            os.utime(self._real(path), times, follow_symlinks=False)

        # ---- names ----
        def mkdir(self, path, mode):
            os.mkdir(self._real(path), mode)

        def rmdir(self, path):
            os.rmdir(self._real(path))

        def unlink(self, path):
            os.unlink(self._real(path))

        def rename(self, old, new):
            os.rename(self._real(old), self._real(new))

        def symlink(self, target, source):
            os.symlink(source, self._real(target))

        def link(self, target, source):
            os.link(self._real(source), self._real(target))

        # ---- data ----
        def open(self, path, flags):
            return os.open(self._real(path), flags)

        def create(self, path, mode, fi=None):
            return os.open(self._real(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)

        def read(self, path, size, offset, fh):
            self._real(path)
            return os.pread(fh, size, offset)

        def write(self, path, data, offset, fh):
            self._real(path)
            return os.pwrite(fh, data, offset)

        def truncate(self, path, length, fh=None):
            if fh is None:
                os.truncate(self._real(path), length)
            else:
                os.ftruncate(fh, length)

        def flush(self, path, fh):
            self._real(path)
            return 0

        def fsync(self, path, datasync, fh):
            self._real(path)
            (os.fdatasync if datasync else os.fsync)(fh)

        def release(self, path, fh):
            os.close(fh)

    return Passthrough
