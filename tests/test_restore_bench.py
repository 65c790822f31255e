"""`tce bench --restore` and its paced filesystem (tce/tools/_pacedfs.py).

The paced filesystem stands for shared storage: the bench's figure of
bytes read from storage is its counter, so it must count every read, the
second read of a file too (no page cache answers in its place), and serve
the file's bytes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tce.tools._netns import Nodes


def _needs_fuse():
    if os.geteuid() != 0:
        pytest.skip("the paced filesystem mounts with allow_other (root)")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse")
    pytest.importorskip("fuse", reason="needs fusepy")


def _our_mounts() -> list[str]:
    with open("/proc/self/mounts") as f:
        return [line for line in f if "tce-restorebench-" in line]


def test_paced_fs_counts_every_read_and_paces_them(tmp_path):
    _needs_fuse()
    from tce.tools._pacedfs import STATS, PacedMount

    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    data = os.urandom(1 << 20)
    (backing / "f.bin").write_bytes(data)
    rate, burst = 2 << 20, 256 << 10
    with PacedMount(str(backing), str(mnt), rate=rate, burst=burst) as m:
        assert os.path.ismount(mnt)
        assert m.stats()["bytes_read"] == 0
        t0 = time.monotonic()
        for n in (1, 2):  # the second read is served by the filesystem again, not the page cache
            assert (mnt / "f.bin").read_bytes() == data
            st = m.stats()
            assert st["bytes_read"] == n * len(data) and st["reads"] >= n
        elapsed = time.monotonic() - t0
        # The bucket lets `burst` bytes through at once, the rest at `rate`.
        assert elapsed >= (2 * len(data) - burst) / rate * 0.95
        assert STATS not in os.listdir(mnt)  # the counters are not a file of the storage
        # Written through the mount, it lands in the backing directory.
        (mnt / "d").mkdir()
        (mnt / "d" / "g.bin").write_bytes(b"x" * 1000)
        os.rename(mnt / "d" / "g.bin", mnt / "d" / "h.bin")
        assert (backing / "d" / "h.bin").read_bytes() == b"x" * 1000
        assert m.stats()["bytes_written"] == 1000
        assert m.stats()["bytes_read"] == 2 * len(data)  # reading the counters is not counted
    assert not os.path.ismount(mnt)
    assert m.proc.returncode == 0


@pytest.mark.multinode
def test_restore_bench_json(tmp_path):
    _needs_fuse()
    mounts = _our_mounts()
    p = subprocess.Popen([sys.executable, "-m", "tce.cli", "bench", "--restore", "--nodes", "3",
                          "--size", "16MiB", "--repeats", "1", "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=280)
    finally:
        p.kill()
    assert p.returncode == 0, out + err
    res = json.loads(out)
    assert (res["nodes"], res["ranks_per_node"], res["ranks"], res["files"]) == (3, 2, 6, 7)
    assert res["unique_bytes"] == res["model_states_bytes"] + 6 * res["optim_shard_bytes"]
    assert res["unique_bytes"] >= 16 << 20
    assert res["rank_bytes"] == res["model_states_bytes"] * 6 + res["optim_shard_bytes"] * 6
    assert res["floor_s"] == pytest.approx(res["unique_bytes"] / res["storage_rate_Bps"])
    for mode in ("independent", "cooperative"):
        r = res[mode]
        # The storage served each byte at least once, and the ranks every byte they loaded.
        assert r["bytes_read"] >= res["unique_bytes"], mode
        assert r["read_ratio"] == pytest.approx(r["bytes_read"] / res["unique_bytes"])
        for key in ("load_s", "plain_load_s", "load_vs_floor", "reads"):
            assert r[key] > 0, (mode, key)
    # Each node reading for itself reads the model states once per rank.
    assert res["independent"]["bytes_read"] >= res["unique_bytes"] + 5 * res["model_states_bytes"]
    assert res["paced_speedup"] > 0 and res["plain_speedup"] > 0
    # Its mount, namespaces and bridge are gone (named after its pid; others'
    # may come and go meanwhile).
    assert _our_mounts() == mounts
    mine = Nodes.prefix(p.pid)
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert [n for n in ns if n.startswith(f"tce{mine}")] == []
    assert f"tcebr{mine}" not in links
