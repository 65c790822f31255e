"""A FUSE passthrough filesystem that fails on demand (test code only).

    python failing_fs.py BACKING MOUNTPOINT SWITCH

mounts BACKING at MOUNTPOINT and passes every operation through, until the
file SWITCH exists: from then on every operation fails with EIO, as a disk
or a network filesystem that has gone bad does, while the mount stays (so
the server sees EIO, not an unmounted directory). Removing SWITCH heals it.
Runs in the foreground until unmounted (``fusermount -u`` or ``umount``).
"""

from __future__ import annotations

import errno
import os
import sys

from fuse import FUSE, FuseOSError, Operations  # fusepy


class FailingPassthrough(Operations):
    def __init__(self, backing: str, switch: str) -> None:
        self.backing = os.path.realpath(backing)
        self.switch = switch

    def _real(self, path: str) -> str:
        if os.path.exists(self.switch):
            raise FuseOSError(errno.EIO)
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

    def fsync(self, path, datasync, fh):
        self._real(path)
        (os.fdatasync if datasync else os.fsync)(fh)

    def release(self, path, fh):
        os.close(fh)


if __name__ == "__main__":
    backing, mountpoint, switch = sys.argv[1:4]
    FUSE(FailingPassthrough(backing, switch), mountpoint, foreground=True, nothreads=False,
         default_permissions=True, allow_other=True)
