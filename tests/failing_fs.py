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

from tce.tools._passthrough import fuse, passthrough_class

FUSE, FuseOSError, _ = fuse()


class FailingPassthrough(passthrough_class()):
    def __init__(self, backing: str, switch: str) -> None:
        super().__init__(backing)
        self.switch = switch

    def _real(self, path: str) -> str:  # every operation resolves its path first
        if os.path.exists(self.switch):
            raise FuseOSError(errno.EIO)
        return super()._real(path)


if __name__ == "__main__":
    backing, mountpoint, switch = sys.argv[1:4]
    FUSE(FailingPassthrough(backing, switch), mountpoint, foreground=True, nothreads=False,
         default_permissions=True, allow_other=True)
