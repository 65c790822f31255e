"""The cache's memory as a user meets it: buffers on 2 MiB huge pages
(memory_backing = hugetlb, with the huge pages reserved by the test and put
back after) and the pool pre-faulted at start (prealloc). Real servers, real
saves and loads, compared bit for bit; the server's status says what backs
its buffers."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest
import torch

import tce
from tce import api
from tce import _service
from tce.core import _knobs, _session
from tce.core._client import Client
from tce.tools._server import LocalServer, server_binary

from conftest import SHMEM_THP, run_python
from helpers import until

MiB = 1 << 20


def _status(server: LocalServer) -> dict:
    with _knobs.override(socket=server.socket):
        return api.status()


def _state(seed: int, nbytes: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    n = nbytes // 4
    return {"w": torch.randn(n, generator=g), "b": torch.randn(1000 + seed, generator=g),
            "step": seed}


def _private_memfd_mappings() -> int:
    """This process's private (copy-on-write) mappings of cache buffers."""
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "memfd:tce" in line and line.split()[1].endswith("p"))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


def test_a_hugetlb_server_saves_and_loads_bitwise_on_huge_pages(huge_pages, tmp_path):
    huge_pages(160)  # 320 MiB: the pool, the buffers and the loads' copy-on-write reserve
    s = LocalServer(memory_budget="256MiB",
                    extra_args=["--memory-backing", "hugetlb", "--prealloc", "64MiB"]).start()
    try:
        assert "memory_backing=hugetlb" in s.log()
        until(lambda: int(_status(s)["pool_bytes"]) == 64 * MiB, what="the pool to fill")
        with _knobs.override(socket=s.socket, job="huge"):
            saved = {}
            # The first is large enough that a 4 KiB buffer would be written
            # with pwrite: a hugetlb one is mapped (hugetlbfs has no write()).
            for i, size in enumerate([70 * MiB + 12345, 5 * MiB, 1000]):
                path = str(tmp_path / f"r{i}.pt")
                saved[path] = _state(i, size)
                tce.save(saved[path], path)
            assert _session.client().pwrite_saves == 0
            st = api.status()
            assert st["memory_backing"] == "hugetlb"
            assert int(st["huge_page_buffers"]) == 3
            assert int(st["hugetlb_fallbacks"]) == 0
            assert int(st["pool_taken"]) >= 1
            for path, want in saved.items():
                got = tce.load(path, weights_only=True)
                assert _same(got, want), path
                got["w"].add_(1)  # copy-on-write: the cache keeps its bytes
                del got
            gc.collect()
            api.close()
            # A load's mapping is unmapped whole (an unaligned munmap of a
            # hugetlb mapping fails and would leak it).
            assert _private_memfd_mappings() == 0
            for path, want in saved.items():
                assert _same(tce.load(path, weights_only=True), want), path
            api.close()
        # A new process (what a restarted job does) maps and reads them too.
        code = (
            "import torch, tce, sys\n"
            f"d = tce.load({str(tmp_path / 'r0.pt')!r}, weights_only=True)\n"
            "print(d['step'], float(d['w'].double().sum()))\n"
        )
        out = run_python(code, env={"TCE_SOCKET": s.socket, "TCE_JOB": "huge",
                                    "TCE_ON_UNAVAILABLE": "raise"})
        want = saved[str(tmp_path / "r0.pt")]
        assert out.split() == ["0", str(float(want["w"].double().sum()))]
    finally:
        assert s.stop() == 0, s.log()
        s.cleanup()


def test_a_file_read_from_storage_lands_in_a_huge_page_buffer(huge_pages, tmp_path):
    """A load that misses the cache has the server read the file from
    storage into a buffer: on a hugetlb server that buffer is on huge pages
    and is filled through a mapping (a 4 KiB one is written with pwrite,
    which hugetlbfs lacks); the rank maps the server's copy."""
    huge_pages(32)
    store = tmp_path / "store"
    store.mkdir()
    want = _state(7, 9 * MiB + 4321)
    path = str(store / "w.pt")
    torch.save(want, path)
    s = LocalServer(memory_budget="48MiB", storage_roots=[str(store)],
                    extra_args=["--memory-backing", "hugetlb", "--metadata-url", "none"]).start()
    try:
        with _knobs.override(socket=s.socket, job="huge-read", on_unavailable="raise"):
            got = tce.load(path, weights_only=True)
            assert _same(got, want)
            from tce import client
            assert client.loaded_bytes() == {"storage": os.path.getsize(path)}
            st = api.status()
            assert int(st["huge_page_buffers"]) == 1
            assert int(st["hugetlb_fallbacks"]) == 0
            del got
            api.close()
    finally:
        assert s.stop() == 0, s.log()
        s.cleanup()


def test_without_free_huge_pages_saves_use_4k_pages_and_loads_copy(huge_pages, tmp_path):
    huge_pages(12)  # 24 MiB: one 22 MiB buffer, nothing left for a second or for copy-on-write
    s = LocalServer(memory_budget="256MiB", extra_args=["--memory-backing", "auto"]).start()
    try:
        assert "memory_backing=auto chose hugetlb" in s.log()
        with _knobs.override(socket=s.socket, job="few"):
            a, b = str(tmp_path / "a.pt"), str(tmp_path / "b.pt")
            sa, sb = _state(1, 20 * MiB), _state(2, 20 * MiB)
            tce.save(sa, a)
            tce.save(sb, b)  # no huge page left: 4 KiB pages, and said so
            st = api.status()
            assert int(st["huge_page_buffers"]) == 1
            assert int(st["hugetlb_fallbacks"]) == 1
            assert "no free huge page" in s.log()
            # a's copy-on-write mapping needs 11 free huge pages: it is read into
            # private memory instead, and behaves the same.
            got = tce.load(a, weights_only=True)
            assert _same(got, sa)
            got["w"].zero_()
            assert _same(tce.load(a, weights_only=True), sa)
            assert _same(tce.load(b, weights_only=True), sb)
            api.close()
    finally:
        assert s.stop() == 0, s.log()
        s.cleanup()


def test_hugetlb_without_reserved_pages_is_refused_at_start(huge_pages, tmp_path):
    huge_pages(0)
    p = subprocess.run([server_binary(), "--socket", str(tmp_path / "t.sock"), "--state-dir",
                        str(tmp_path), "--memory-backing", "hugetlb"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2
    assert "no huge page is reserved" in p.stderr + p.stdout
    assert "/proc/sys/vm/nr_hugepages" in p.stderr + p.stdout


def test_the_pool_fills_in_the_background_and_serves_the_first_save(tmp_path):
    s = LocalServer(memory_budget="256MiB",
                    extra_args=["--memory-backing", "4k", "--prealloc", "96MiB"]).start()
    try:
        st = until(lambda: (lambda st: int(st["pool_bytes"]) == 96 * MiB and st)(_status(s)),
                   what="the pool to fill")
        assert int(st["pool_target_bytes"]) == 96 * MiB
        assert st["memory_backing"] == "4k"
        assert int(st["used_bytes"]) == 0  # pooled memory is not a buffer
        with _knobs.override(socket=s.socket, job="pool"):
            path = str(tmp_path / "first.pt")
            want = _state(3, 30 * MiB)
            tce.save(want, path)
            st = api.status()
            assert int(st["pool_taken"]) == 1
            assert int(st["pool_missed"]) == 0
            assert int(st["used_bytes"]) + int(st["pool_bytes"]) <= int(st["budget_bytes"])
            assert _same(tce.load(path, weights_only=True), want)
            api.close()
        out = subprocess.run([sys.executable, "-m", "tce.cli", "--socket", s.socket, "status"],
                             capture_output=True, text=True, timeout=60)
        assert "pool" in out.stdout and "1 new buffer(s) from it" in out.stdout, out.stdout + out.stderr
    finally:
        assert s.stop() == 0, s.log()
        s.cleanup()


@pytest.mark.parametrize("value, why", [("1TiB", "exceeds the memory budget"),
                                        ("lots", "a size like 4GiB, 0 (none), or auto")])
def test_a_prealloc_the_server_cannot_honour_is_refused(tmp_path, value, why):
    p = subprocess.run([server_binary(), "--socket", str(tmp_path / "t.sock"), "--state-dir",
                        str(tmp_path), "--memory-budget", "1GiB", "--prealloc", value],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2
    assert why in p.stderr + p.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_saves_register_and_load_huge_page_buffers(huge_pages, tmp_path):
    """cudaHostRegister of a hugetlb mapping, the device-to-host copies into
    it, and loads back to the GPU, bit for bit."""
    huge_pages(256)
    s = LocalServer(memory_budget="256MiB", extra_args=["--memory-backing", "hugetlb"]).start()
    try:
        with _knobs.override(socket=s.socket, job="gpu-huge"):
            sd = {"w": torch.randn(16 << 20, device="cuda"), "b": torch.randn(7, device="cuda")}
            p = str(tmp_path / "g.pt")
            tce.save(sd, p)
            c = _session.client()
            m = c.registered_mapping(c.lookup("gpu-huge", p).buffer_id)
            assert m is not None and m.cuda_registered
            assert int(api.status()["huge_page_buffers"]) == 1
            for where in ("cuda", "cpu"):
                got = tce.load(p, map_location=where, weights_only=True)
                assert all(torch.equal(got[k].cpu(), sd[k].cpu()) for k in sd)
            api.close()
    finally:
        assert s.stop() == 0, s.log()
        s.cleanup()


def _shmem_huge_kib() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("ShmemHugePages:"))


def test_a_thp_server_puts_buffers_on_shmem_huge_pages(shmem_thp, tmp_path):
    """memory_backing = thp with shmem THP on 'advise' (set by the test as
    root, put back after): the buffers are huge folios, saves and loads
    bitwise."""
    before = _shmem_huge_kib()
    s = LocalServer(memory_budget="256MiB", extra_args=["--memory-backing", "thp"]).start()
    try:
        assert "memory_backing=thp" in s.log()
        with _knobs.override(socket=s.socket, job="thp"):
            path = str(tmp_path / "t.pt")
            want = _state(5, 24 * MiB)
            tce.save(want, path)
            st = api.status()
            assert st["memory_backing"] == "thp" and int(st["huge_page_buffers"]) == 1
            assert _shmem_huge_kib() - before >= 20 * 1024  # the buffer is huge folios
            assert _same(tce.load(path, weights_only=True), want)
            api.close()
    finally:
        assert s.stop() == 0, s.log()
        s.cleanup()
    # With shmem THP off, asking for it is refused at start with the reason.
    if shmem_thp in ("never", "deny"):
        with open(SHMEM_THP, "w") as f:  # as the machine had it (the fixture writes it again after)
            f.write(shmem_thp)
        p = subprocess.run([server_binary(), "--socket", str(tmp_path / "x.sock"), "--state-dir",
                            str(tmp_path), "--memory-backing", "thp"],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and "shmem_enabled" in p.stderr + p.stdout


def test_a_range_buffer_counts_against_the_budget_and_without_one_ranges_come_in_the_reply(tmp_path):
    """A range buffer's 64 MiB come out of memory_budget: a server whose
    budget has no room for one refuses it, and the ranged read still
    returns the right bytes, inside the ReadRange reply."""
    s = LocalServer(memory_budget="48MiB").start()
    try:
        with _knobs.override(socket=s.socket, job="ranged"):
            c = _session.client()
            data = os.urandom(5 * MiB)
            path = str(tmp_path / "r.bin")
            alloc = c.allocate(job="ranged", tag="t", rank=0, path=path, size=len(data))
            alloc.view[:] = data
            alloc.commit()
            with pytest.raises(tce.TCEError) as refused:
                c._request_fd(0, range_buffer=True)
            assert refused.value.code == "RESOURCE_EXHAUSTED"
            assert refused.value.message == ("no room in the memory budget (memory_budget) for a "
                                             "range buffer of 64.0 MiB")
            assert c.range_buffer() is None
            got = _service.read_range_piece(path, 1000, 2 * MiB, buffer_offset=0)
            assert got is not None and bytes(got[0]) == data[1000:1000 + 2 * MiB] and got[1] == "local"
            api.close()
    finally:
        assert s.stop() == 0, s.log()
        s.cleanup()


def test_memory_the_server_lets_go_of_is_freed_though_a_client_keeps_its_fd(tmp_path):
    """A client that keeps the fd of an allocation it aborted, or of its
    range buffer, after its session ends holds no page: the server frees
    its memory (punches it out) when it lets go, whoever holds the memfd."""
    # 100 MiB: the allocation (32.5) and the range buffer (64) fit together
    s = LocalServer(memory_budget="100MiB", extra_args=["--memory-backing", "4k"]).start()
    try:
        c = Client(s.socket, rpc_timeout=30)
        resp = c._allocate(job="kept", tag="t", rank=0, path=str(tmp_path / "a.pt"), size=32 * MiB)
        kept = c._request_fd(resp.buffer_id)
        os.pwrite(kept, b"x" * (32 * MiB), 0)
        rb, size = c.range_buffer()
        ranged = os.dup(rb)
        assert os.fstat(kept).st_blocks * 512 >= 32 * MiB and os.fstat(ranged).st_blocks * 512 >= size
        c._abort(resp.allocation_id)
        c.close()  # the session ends: its range buffer goes
        until(lambda: os.fstat(ranged).st_blocks == 0, what="the range buffer's pages freed")
        with _knobs.override(socket=s.socket, job="other"):
            # The aborted buffer waits for reuse until a save needs its room.
            tce.save({"w": torch.zeros(18 * MiB)}, str(tmp_path / "b.pt"))  # 72 MiB: 32 + 72 > 100
            api.close()
        until(lambda: os.fstat(kept).st_blocks == 0, what="the aborted allocation's pages freed")
        os.close(kept)
        os.close(ranged)
    finally:
        assert s.stop() == 0, s.log()
        s.cleanup()
