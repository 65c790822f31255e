"""tce.integrations._dcp_ranges: ranged reads through the server with
several calls in flight, each piece put in a slot of the session's range
buffer (or inside the reply where there is none), handed over in order.
Against one server and a file in its cache (the same ReadRange path as a
peer's file; tests/test_dcp_ring.py runs it across nodes)."""

from __future__ import annotations

import os
import re

import pytest
import torch

import tce
from tce import _service, buffers, objects
from tce.core import _client, _knobs
from tce.integrations import _dcp_ranges
from tce.errors import FailedPreconditionError, InvalidArgumentError
from tce.integrations._dcp_ranges import RingRanges

MIB = 1 << 20


@pytest.fixture
def cached(server, tmp_path):
    """A 40 MiB file in the cache (more than half a 64 MiB range buffer) and its bytes."""
    path = str(tmp_path / "f.bin")
    data = torch.randint(0, 256, (40 * MIB + 123,), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(3)).numpy().tobytes()
    alloc = _service.allocate_file(path, len(data))
    alloc.view[:] = data
    alloc.commit()
    return path, data


def read_all(path: str, ranges: list[tuple[int, int]]) -> list[bytes]:
    out = []
    with RingRanges(path, ranges, job=_knobs.get("job")) as rr:
        for offset, length in ranges:
            got = rr.next()
            assert got is not None
            source, kind = got
            assert kind == "local"
            buf = bytearray(length)
            # In two parts, as the reader's head and region reads do.
            half = length // 2
            source.readinto(memoryview(buf)[:half], offset)
            source.readinto(memoryview(buf)[half:], offset + half)
            out.append(bytes(buf))
    return out


# Small ranges, ranges of several calls (16 MiB each), one read when asked
# for (over half the slots), and ranges after it.
RANGES = [(0, 100), (5, 3 * MIB), (4 * MIB, 17 * MIB + 1), (1, 1), (3, 40 * MIB),
          (7 * MIB, 33), (40 * MIB + 100, 23), (12, 16 * MIB)]


@pytest.mark.parametrize("threads", [1, 4])
def test_ranges_come_back_in_order_through_the_range_buffer(cached, threads):
    path, data = cached
    buf = _service.range_buffer()
    assert buf is not None and buf[1] == 4 * _client.MAX_RANGE  # the server gives one
    with _knobs.override(dcp_read_threads=threads):
        got = read_all(path, RANGES)
    assert [g == data[o:o + n] for g, (o, n) in zip(got, RANGES)] == [True] * len(RANGES)


def test_without_a_range_buffer_the_bytes_come_inside_the_replies(cached, monkeypatch):
    path, data = cached
    monkeypatch.setattr(_service, "range_buffer", lambda: None)
    got = read_all(path, RANGES)
    assert [g == data[o:o + n] for g, (o, n) in zip(got, RANGES)] == [True] * len(RANGES)


def test_a_missing_file_and_a_range_past_the_end(cached, tmp_path):
    path, data = cached
    job = _knobs.get("job")
    with RingRanges(str(tmp_path / "none"), [(0, 10)], job=job) as rr:
        assert rr.next() is None  # the caller reads storage
    with RingRanges(path, [(0, 10), (len(data) - 5, 10)], job=job) as rr:
        assert rr.next() is not None
        with pytest.raises(ValueError, match="not inside the file"):
            rr.next()


def test_a_session_asking_for_bytes_past_its_range_buffer_is_refused(cached):
    path, _ = cached
    job = _knobs.get("job")
    _service.range_buffer()
    with pytest.raises(tce.TCEError) as e:
        _service.with_client(lambda c: c.read_range(job, os.path.abspath(path), 0, 100,
                                                    buffer_offset=4 * _client.MAX_RANGE - 99))
    assert e.value.code == "OUT_OF_RANGE" and "range buffer" in e.value.message


def test_the_read_threads_setting_is_checked():
    with pytest.raises(ValueError, match="integer > 0"):
        with _knobs.override(dcp_read_threads=0):
            pass
    assert _dcp_ranges._executor(3)._max_workers == 3


def test_a_pin_keeps_the_first_object_identity_and_refuses_another(cached):
    path, data = cached
    pin = objects.ObjectPin(path)
    # From the cache: no object's identity to pin (ranges from a bucket:
    # tests/test_s3.py).
    got = buffers.read_range(path, 0, 10, pin=pin)
    assert got is not None and bytes(got[0]) == data[:10] and pin.expected() == {}
    pin.seen("e1", 7)
    pin.seen("e1", 7)  # the same object again
    assert pin.expected() == {"etag": "e1", "size": 7}
    with pytest.raises(FailedPreconditionError, match=re.escape(
            f"{path} was replaced on object storage since this load began (it read ETag e1, 7 bytes; "
            "now ETag e2, 7 bytes)")):
        pin.seen("e2", 7)


@pytest.mark.parametrize("etag, size, why", [
    ('"e1', 7, "expect_etag: not an ETag"),
    ("e 1", 7, "expect_etag: not an ETag"),
    ("e" * 257, 7, "expect_etag: not an ETag"),
    ("", 7, "expect_size: given without expect_etag"),
])
def test_a_pinned_identity_that_is_no_etag_is_refused(cached, etag, size, why):
    path, _ = cached
    job = _knobs.get("job")
    with pytest.raises(InvalidArgumentError, match=why):
        _service.with_client(lambda c: c.read_range(job, os.path.abspath(path), 0, 10, etag=etag, size=size))
