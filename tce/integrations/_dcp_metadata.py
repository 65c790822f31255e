"""A DCP checkpoint's ``.metadata``, read as data: unpickled with an allow
list of what DCP's metadata is made of, then checked.

``.metadata`` is a pickle, and the reader takes it from this node's cache,
from another node's file through the ring, or from storage. ``pickle.loads``
would call whatever global the pickle names, so whoever could write the file
would run code in every process that loads the checkpoint. Here the pickle
may name only what a ``Metadata`` holds, whatever the state dict saved:
DCP's metadata classes and ``_StorageInfo``, ``torch.Size``, torch's dtypes
and layouts, ``OrderedDict``, sets and paths (``StorageMeta.checkpoint_id``).
Any other global is refused by name, before it is looked up, so it is never
called.

The unpickler is pickle's Python one, because it can also refuse to set the
state of anything but an instance of DCP's metadata classes: the C one lets
a pickle set attributes of a class it names, for the whole process.
"""

from __future__ import annotations

import collections
import functools
import io
import pathlib
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint import filesystem as _filesystem
from torch.distributed.checkpoint import metadata as _metadata

from tce.errors import CorruptCheckpointError

__all__ = ["check_storage_data", "load_metadata"]

# The classes whose instances the pickle may build and set the state of.
_BUILT = (_metadata.Metadata, _metadata.TensorStorageMetadata, _metadata.ChunkStorageMetadata,
          _metadata.TensorProperties, _metadata.BytesStorageMetadata, _metadata.StorageMeta,
          _metadata.MetadataIndex, _filesystem._StorageInfo)
# The largest byte count an item may name (a file offset is a signed 64-bit number).
_MAX_BYTES = (1 << 63) - 1


@functools.cache
def _layouts() -> dict[str, torch.layout]:
    return {str(v): v for v in vars(torch).values() if isinstance(v, torch.layout)}


def _layout(name: Any) -> torch.layout:
    """``torch.serialization._get_layout`` (how a layout is pickled), for
    torch's layouts only."""
    layout = _layouts().get(name) if isinstance(name, str) else None
    if layout is None:
        raise pickle.UnpicklingError(f"{name!r} is not a torch layout")
    return layout


@functools.cache
def _allowed() -> dict[tuple[str, str], Any]:
    """(module, name) -> the object, for every global a DCP ``.metadata`` names."""
    allowed: dict[tuple[str, str], Any] = {
        (cls.__module__, cls.__qualname__): cls
        for cls in (*_BUILT, _metadata._MEM_FORMAT_ENCODING)}
    allowed.update({
        ("torch", "Size"): torch.Size,
        ("torch.serialization", "_get_layout"): _layout,
        ("collections", "OrderedDict"): collections.OrderedDict,
    })
    # Sets pickle as their class below protocol 4 (__builtin__ below 3).
    for module in ("builtins", "__builtin__"):
        allowed.update({(module, "set"): set, (module, "frozenset"): frozenset})
    allowed.update({("torch", name): value for name, value in vars(torch).items()
                    if isinstance(value, torch.dtype)})
    # Paths pickle as their class and parts; pathlib's module is
    # pathlib._local from Python 3.13. A Windows path is kept pure here.
    for module in ("pathlib", "pathlib._local"):
        allowed.update({
            (module, "PurePosixPath"): pathlib.PurePosixPath,
            (module, "PosixPath"): pathlib.PosixPath,
            (module, "PureWindowsPath"): pathlib.PureWindowsPath,
            (module, "WindowsPath"): pathlib.PureWindowsPath,
        })
    return allowed


class _Unpickler(pickle._Unpickler):
    """Unpickles DCP metadata; any other global, and setting the state of
    anything but DCP's metadata objects, is refused."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _allowed()[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"it names the global {module}.{name}, which DCP metadata never holds "
                "(refused, never looked up or called)") from None

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError(f"it refers to a persistent object {pid!r}")

    def load_build(self) -> None:
        """BUILD (set the state of the object under it), for DCP's metadata
        objects only."""
        if len(self.stack) < 2 or type(self.stack[-2]) not in _BUILT:
            target = type(self.stack[-2]).__name__ if len(self.stack) >= 2 else "nothing"
            raise pickle.UnpicklingError(f"it sets the state of a {target}, which is no "
                                         "DCP metadata object (refused)")
        super().load_build()

    dispatch[pickle.BUILD[0]] = load_build


def _corrupt(path: str, reason: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"{path} is not a DCP checkpoint's metadata: {reason}")


def load_metadata(data: Any, path: str) -> _metadata.Metadata:
    """The ``Metadata`` pickled in ``data`` (the bytes of the ``.metadata``
    at ``path``), unpickled with the allow list.

    Raises:
        CorruptCheckpointError: ``data`` is not a pickled ``Metadata``, or
            names a global or builds an object DCP's metadata never holds
            (the message names it); nothing it names outside the allow list
            was called.
    """
    try:
        metadata = _Unpickler(io.BytesIO(data)).load()
    except EOFError:
        raise _corrupt(path, "it ends before its pickle does") from None
    except Exception as e:  # noqa: BLE001 (any failure to unpickle means the same)
        raise _corrupt(path, str(e) or type(e).__name__) from None
    if not isinstance(metadata, _metadata.Metadata):
        raise _corrupt(path, f"it holds a {type(metadata).__name__}")
    return metadata


def _file_name(name: Any) -> bool:
    """Whether ``name`` names a file in the checkpoint's directory itself."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name
            and "\0" not in name)


def _byte_count(n: Any) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= _MAX_BYTES


def check_storage_data(storage_data: Any, path: str) -> dict[Any, Any]:
    """``storage_data`` of the metadata at ``path``, checked: a dict whose
    every entry names a file of the checkpoint's directory and a byte range
    in it.

    Raises:
        CorruptCheckpointError: an entry names a path outside the directory,
            or an offset or a length that is not a byte count.
    """
    if not isinstance(storage_data, dict):
        raise _corrupt(path, f"its storage data is a {type(storage_data).__name__}, not a dict")
    for index, info in storage_data.items():
        item = getattr(index, "fqn", index)
        name = getattr(info, "relative_path", None)
        if not _file_name(name):
            raise _corrupt(path, f"item {item!r} lies in {name!r}, which is no file name in "
                           "the checkpoint's directory")
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if not (_byte_count(offset) and _byte_count(length) and offset + length <= _MAX_BYTES):
            raise _corrupt(path, f"item {item!r} has offset {offset!r} and length {length!r}, "
                           "which are no byte range of a file")
    return storage_data
