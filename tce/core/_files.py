"""Files as the client writes them itself: the saver's umask, and the
atomic direct write every fallback uses (docs/semantics.md)."""

from __future__ import annotations

import os
import secrets
from typing import Any, Callable

from tce.errors import MissingDirectoryError


def current_umask() -> int:
    """This process's umask, read without changing it (``os.umask`` can only
    be read by setting it, which races with other threads)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # no /proc: the racy way
    os.umask(mask)
    return mask


def atomic_write(path: str, write: Callable[[str], None]) -> None:
    """Write ``path`` by ``write(target)`` so that a crash at any moment
    leaves either the old file or the new one.

    ``target`` has the same file name as ``path``, inside a private hidden
    directory next to it (``.tce-save-HEX``, mode 0700): torch.save names
    the records of its archive after the file, so the bytes are exactly
    plain torch.save's. The file is fsynced, given the replaced file's mode
    (a new file: 0666 & ~umask), renamed over the path, and the directory
    fsynced. A missing directory raises FileNotFoundError (a
    :class:`~tce.errors.MissingDirectoryError`) and nothing is created.
    """
    directory, name = os.path.split(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise MissingDirectoryError(f"No such file or directory: {directory} (the directory of "
                                    f"{path}) does not exist", filename=path)
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666 & ~current_umask()
    for _ in range(8):
        temp_dir = os.path.join(directory, f".tce-save-{secrets.token_hex(8)}")
        try:
            os.mkdir(temp_dir, 0o700)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temp name next to {path}")
    target = os.path.join(temp_dir, name)
    try:
        write(target)
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(target, path)
    except BaseException:
        try:
            os.unlink(target)
        except OSError:
            pass
        raise
    finally:
        try:
            os.rmdir(temp_dir)
        except OSError:
            pass
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
