"""The safetensors format: the bytes ``safetensors.torch.save_file`` writes
for a dict of tensors, laid out for a buffer, and a strict reader of such
bytes in any buffer, whose tensors view the buffer.

A file is an 8-byte little-endian header length ``n``, ``n`` bytes of JSON
(padded with spaces to a multiple of 8), then the data area: each tensor's
bytes, C order, little endian, back to back. The JSON maps each name to
``{"dtype", "shape", "data_offsets": [start, end]}`` (offsets into the data
area), and ``"__metadata__"`` (optional) to string pairs. The writer sorts
the tensors by dtype, widest alignment first, then by name, so every
tensor's bytes are aligned to their element size.

Trust: a header is hostile input. :func:`read_header` checks every field
against the buffer before anything is viewed, and refuses what it cannot
vouch for with ``CorruptCheckpointError`` naming the file and the fault.
The writer trusts its caller's tensors (it reads them, as safetensors does).
Pure: no server, no files; any thread.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any, Iterable, Iterator, NamedTuple

import torch

from tce.errors import CorruptCheckpointError

# The largest header safetensors reads (its own limit, in bytes).
MAX_HEADER = 100_000_000
METADATA_KEY = "__metadata__"

# Every dtype both sides know, in safetensors' order (its Dtype enum, by
# increasing alignment): the writer sorts by it. F4 and F6 (sub-byte) are
# not here: safetensors.torch cannot read them back either.
_ORDER = [
    ("BOOL", "bool"), ("U8", "uint8"), ("I8", "int8"),
    ("F8_E5M2", "float8_e5m2"), ("F8_E4M3", "float8_e4m3fn"), ("F8_E8M0", "float8_e8m0fnu"),
    ("F8_E4M3FNUZ", "float8_e4m3fnuz"), ("F8_E5M2FNUZ", "float8_e5m2fnuz"),
    ("I16", "int16"), ("U16", "uint16"), ("F16", "float16"), ("BF16", "bfloat16"),
    ("I32", "int32"), ("U32", "uint32"), ("F32", "float32"), ("C64", "complex64"),
    ("F64", "float64"), ("I64", "int64"), ("U64", "uint64"),
]
# name -> torch dtype, and back (dtypes this torch lacks are left out)
DTYPES: dict[str, torch.dtype] = {
    code: getattr(torch, attr) for code, attr in _ORDER if hasattr(torch, attr)}
_CODES: dict[torch.dtype, str] = {dtype: code for code, dtype in DTYPES.items()}
_RANK: dict[torch.dtype, int] = {dtype: i for i, dtype in enumerate(DTYPES.values())}


class TensorInfo(NamedTuple):
    """One tensor of a file: its dtype, shape, and its bytes
    ``[start, end)`` as offsets from the start of the file."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int


class Header(NamedTuple):
    """A checked header: the tensors by name, in file order; the metadata
    (None when the file has none); where the data area starts; the size of
    the whole file it describes."""

    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] | None
    data_start: int
    file_size: int


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


def header_size(first: Any, file_size: int, *, source: str = "buffer") -> int:
    """How many bytes the header takes, length field included (``8 + n``),
    from the file's first 8 bytes (``first``) and its size.

    Raises:
        CorruptCheckpointError: a file shorter than 8 bytes, a header length
            over safetensors' limit or past the end of the file.
    """
    if file_size < 8 or len(first) < 8:
        raise CorruptCheckpointError(
            f"{source}: not a safetensors file: {file_size} bytes, shorter than the 8-byte "
            "header length")
    (n,) = struct.unpack_from("<Q", first)
    if n > MAX_HEADER:
        raise CorruptCheckpointError(
            f"{source}: header length {n} is over the {MAX_HEADER}-byte limit")
    if 8 + n > file_size:
        raise CorruptCheckpointError(
            f"{source}: header length {n} runs past the end of the file ({file_size} bytes)")
    return 8 + n


def _refuse_duplicates(source: str):
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise CorruptCheckpointError(f"{source}: header names {key!r} twice")
            out[key] = value
        return out
    return pairs


def _not_json(source: str):
    def constant(word: str) -> Any:
        raise CorruptCheckpointError(f"{source}: header is not JSON ({word})")
    return constant


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def read_header(buf: Any, *, file_size: int | None = None, source: str = "buffer") -> Header:
    """Parse and check the header at the start of ``buf`` (bytes, a
    memoryview, an mmap). ``buf`` holds the whole file, or at least its
    header when ``file_size`` says how long the file is.

    Checked: the length field, UTF-8, JSON (an object, no name twice), each
    tensor's dtype, shape (counts) and offsets (two counts, in order), that
    its byte count is its elements times the element size, that the
    tensors tile the data area exactly (no overlap, no hole) and that it
    ends at the end of the file; the metadata maps strings to strings.

    Raises:
        CorruptCheckpointError: with ``source`` (the file) and the fault.
    """
    view = memoryview(buf).cast("B")
    file_size = view.nbytes if file_size is None else file_size
    try:
        data_start = header_size(view[:8], file_size, source=source)
        if len(view) < data_start:
            raise ValueError(f"read_header: {source}: the buffer holds {len(view)} bytes, "
                             f"not the whole {data_start}-byte header")
        try:
            text = str(view[8:data_start], "utf-8")
        except UnicodeDecodeError as e:
            raise CorruptCheckpointError(f"{source}: header is not UTF-8 ({e.reason} at byte "
                                         f"{8 + e.start})") from None
    finally:
        view.release()
    try:
        raw = json.loads(text, object_pairs_hook=_refuse_duplicates(source),
                         parse_constant=_not_json(source))
    except json.JSONDecodeError as e:
        raise CorruptCheckpointError(f"{source}: header is not JSON ({e.msg} at byte "
                                     f"{8 + len(text[:e.pos].encode())})") from None
    except RecursionError:
        raise CorruptCheckpointError(f"{source}: header is not JSON (nested too deep)") from None
    if not isinstance(raw, dict):
        raise CorruptCheckpointError(
            f"{source}: header is a JSON {type(raw).__name__}, not an object")
    metadata = raw.pop(METADATA_KEY, None)
    if metadata is not None and not (
            isinstance(metadata, dict)
            and all(isinstance(v, str) for v in metadata.values())):
        raise CorruptCheckpointError(
            f"{source}: {METADATA_KEY} is not a map of strings to strings")
    entries = [(name, _entry(name, info, source)) for name, info in raw.items()]
    entries.sort(key=lambda e: (e[1].start, e[1].end))
    data_size = file_size - data_start
    at = 0
    for name, info in entries:
        if info.start < at:
            raise CorruptCheckpointError(
                f"{source}: tensor {name!r} at [{info.start}, {info.end}) overlaps the bytes "
                f"before it (which end at {at})")
        if info.start > at:
            raise CorruptCheckpointError(
                f"{source}: tensor {name!r} starts at {info.start}, leaving a hole of "
                f"{info.start - at} bytes after {at}")
        if info.end > data_size:
            raise CorruptCheckpointError(
                f"{source}: tensor {name!r} ends at {info.end}, past the data area "
                f"({data_size} bytes)")
        at = info.end
    if at != data_size:
        raise CorruptCheckpointError(
            f"{source}: {data_size - at} bytes after the last tensor (the data area is "
            f"{data_size} bytes, the tensors cover {at})")
    tensors = {name: TensorInfo(i.dtype, i.shape, data_start + i.start, data_start + i.end)
               for name, i in entries}
    return Header(tensors, metadata, data_start, file_size)


def _entry(name: str, info: Any, source: str) -> TensorInfo:
    """One tensor's header entry, checked (offsets relative to the data area)."""
    where = f"{source}: tensor {name!r}"
    if not isinstance(info, dict):
        raise CorruptCheckpointError(f"{where}: its entry is not a JSON object")
    for key in ("dtype", "shape", "data_offsets"):
        if key not in info:
            raise CorruptCheckpointError(f"{where}: no {key!r}")
    code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(code, str) or code not in DTYPES:
        raise CorruptCheckpointError(f"{where}: unknown dtype {code!r}")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise CorruptCheckpointError(f"{where}: shape {shape!r} is not a list of counts")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_count, offsets))):
        raise CorruptCheckpointError(
            f"{where}: data_offsets {offsets!r} is not two counts")
    start, end = offsets
    if end < start:
        raise CorruptCheckpointError(
            f"{where}: data_offsets [{start}, {end}] end before they start")
    dtype = DTYPES[code]
    nbytes = math.prod(shape) * dtype.itemsize
    if end - start != nbytes:
        raise CorruptCheckpointError(
            f"{where}: {end - start} bytes for shape {shape} of {code} ({nbytes} bytes)")
    return TensorInfo(dtype, tuple(shape), start, end)


def iter_safetensors(buf: Any, *, names: Iterable[str] | None = None,
                     source: str = "buffer") -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of the safetensors file in ``buf``, in file order, as
    (name, tensor), each tensor viewing ``buf`` (no copy; a writable buffer
    gives writable tensors, and they keep it alive). The header is checked
    first (:func:`read_header`), so nothing is viewed from a corrupt file.

    Args:
        buf: the whole file (an mmap, a memoryview, a bytearray; tensors
            over a read-only one, such as bytes, must not be written).
        names: only these tensors (the others are not viewed).
        source: the file's name, for errors.

    Raises (at the call, before any tensor is viewed):
        CorruptCheckpointError: the bytes are not a safetensors file.
        KeyError: a name in ``names`` that the file lacks.
    """
    header = read_header(buf, source=source)
    wanted = None if names is None else set(names)
    if wanted is not None and not wanted <= header.tensors.keys():
        missing = sorted(wanted - header.tensors.keys())
        raise KeyError(f"{source} has no tensor named {', '.join(map(repr, missing))}")
    return ((name, view_tensor(buf, info)) for name, info in header.tensors.items()
            if wanted is None or name in wanted)


def view_tensor(buf: Any, info: TensorInfo) -> torch.Tensor:
    """The tensor ``info`` describes, viewing ``buf`` (a checked header's
    entry: its bytes lie inside ``buf``)."""
    count = math.prod(info.shape)
    if count == 0:
        return torch.empty(info.shape, dtype=info.dtype)
    return torch.frombuffer(buf, dtype=info.dtype, count=count,
                            offset=info.start).view(info.shape)


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------


class Layout:
    """A safetensors file for a dict of tensors, laid out: ``size`` bytes,
    written into a buffer by :meth:`write`."""

    def __init__(self, header: bytes, entries: list[tuple[torch.Tensor, int, int]]) -> None:
        self.header = header                 # length field + padded JSON
        self.entries = entries               # (tensor, start, end), file offsets
        self.size = entries[-1][2] if entries else len(header)

    def write(self, dest: torch.Tensor) -> None:
        """Write the file into ``dest`` (uint8, CPU, ``size`` bytes). Each
        tensor is copied straight into its place, a GPU one device-to-host
        (into pageable memory, so each copy is synchronous)."""
        if dest.numel() != self.size:
            raise ValueError(f"a {self.size}-byte safetensors file, into {dest.numel()} bytes")
        dest[:len(self.header)].copy_(torch.frombuffer(bytearray(self.header), dtype=torch.uint8))
        with torch.no_grad():
            for t, start, end in self.entries:
                if end > start:
                    dest[start:end].copy_(t.detach().reshape(-1).view(torch.uint8))


def layout(tensors: Any, metadata: Any = None) -> Layout:
    """Lay out the file ``safetensors.torch.save_file(tensors, f,
    metadata)`` writes: the same bytes, where metadata has at most one
    entry (safetensors orders several by a hash; here they keep the dict's
    order, and the file is an equally valid one).

    Raises what safetensors raises for the same input: ``ValueError`` (not
    a dict; a value not a tensor; a sparse or non-contiguous tensor),
    ``RuntimeError`` (tensors sharing memory), ``TypeError`` (a name or
    metadata that is not a string). Also ``ValueError`` for a dtype the
    format has no name for here, and for a tensor named ``__metadata__``
    (safetensors would write a file it cannot read back).
    """
    _check(tensors)
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise TypeError(f"metadata: {type(metadata).__name__!r} object is not a dict")
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                bad = k if not isinstance(k, str) else v
                raise TypeError(f"metadata: {type(bad).__name__!r} object is not a str")
    order = sorted(tensors.items(), key=lambda kv: (-_RANK[kv[1].dtype], kv[0]))
    head: dict[str, Any] = {} if metadata is None else {METADATA_KEY: dict(metadata)}
    spans, at = [], 0
    for name, t in order:
        n = t.numel() * t.element_size()
        head[name] = {"dtype": _CODES[t.dtype], "shape": list(t.shape),
                      "data_offsets": [at, at + n]}
        spans.append((t, at, at + n))
        at += n
    text = json.dumps(head, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    data_start = 8 + len(text)
    header = struct.pack("<Q", len(text)) + text
    return Layout(header, [(t, data_start + s, data_start + e) for t, s, e in spans])


def _check(tensors: Any) -> None:
    """safetensors' refusals, in its order."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(
                f"Key `{name}` is invalid, expected torch.Tensor but received {type(t)}")
    sparse = [name for name, t in tensors.items() if t.layout != torch.strided]
    if sparse:
        raise ValueError(f"sparse tensors {sparse} cannot be saved as safetensors "
                         "(.to_dense() them first)")
    shared = _sharing(tensors)
    if shared:
        raise RuntimeError(f"Some tensors share memory, which safetensors refuses to save: "
                           f"{shared} (safetensors.torch.save_model drops the duplicates)")
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(f"You are trying to save a non contiguous tensor: `{name}`, which "
                             "safetensors refuses: call .contiguous() on it first")
        if t.dtype not in _CODES:
            raise ValueError(f"tensor `{name}`: dtype {t.dtype} has no safetensors name here")
        if t.is_meta:  # (the exception type safetensors itself raises for a meta tensor)
            raise NotImplementedError(f"tensor `{name}` is on the meta device: no data to save")
    for name in tensors:
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, not {type(name).__name__!r}")
    if METADATA_KEY in tensors:
        raise ValueError(f"a tensor may not be named {METADATA_KEY!r}: that name holds the "
                         "file's metadata")


def _sharing(tensors: dict[str, torch.Tensor]) -> list[set[str]]:
    """Groups of names whose bytes overlap in one storage, as safetensors
    finds them: by storage (device, address, size), then by address range."""
    by_storage: dict[tuple[Any, int, int], list[str]] = {}
    for name, t in tensors.items():
        if t.is_meta:
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() == 0 or storage.nbytes() == 0:
            continue
        by_storage.setdefault((t.device, storage.data_ptr(), storage.nbytes()), []).append(name)
    groups = []
    for names in by_storage.values():
        if len(names) < 2:
            continue
        spans = sorted((tensors[n].data_ptr(),
                        tensors[n].data_ptr() + tensors[n].numel() * tensors[n].element_size(), n)
                       for n in names)
        group, stop = {spans[0][2]}, spans[0][1]
        for start, end, name in spans[1:]:
            if start < stop:
                group.add(name)
            else:
                if len(group) > 1:
                    groups.append(group)
                group = {name}
            stop = max(stop, end)
        if len(group) > 1:
            groups.append(group)
    return groups
