"""``tce bench --weights --engine vllm`` (tce/tools/_vllmbench.py): a real
vLLM engine (the CPU build, in build/vllm-venv) takes each version four
ways, at a tiny size. What the run must show whatever the machine's speed:
every figure measured, each way's load checked by the bench (it fails when
an engine does not hold the version's bytes after it), the second engine
adding nothing to the server, both engines on the last version, and nothing
left running or on disk. No timing ratio is asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tce.tools import _vllm_env, _vllmbench

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TIMES = ("storage_s", "http_s", "http_worker_s", "floor_call_s", "floor_s", "tce_s", "tce_update_s",
         "second_engine_update_s", "tce_vs_floor", "storage_vs_tce", "http_vs_tce")


def _processes_naming(text: str) -> list[str]:
    """Command lines of the processes that name ``text`` (the engines name
    their model's directory, under the bench's temp dir)."""
    out = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd and pid != str(os.getpid()):
            out.append(f"{pid}: {cmd}")
    return out


def test_vllm_bench_json(tmp_path):
    _vllm_env.ensure(say=print)  # the environment made (once) outside the bench's time limit
    repeats = 2
    p = subprocess.run([sys.executable, "-m", "tce.cli", "bench", "--weights", "--engine", "vllm",
                        "--hidden", "64", "--layers", "2", "--repeats", str(repeats), "--json",
                        "--dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    res = json.loads(p.stdout)
    assert (res["engine"], res["hidden"], res["layers"], res["repeats"]) == ("vllm", 64, 2, repeats)
    assert res["size_bytes"] > 0 and res["tensors"] > 0
    for key in TIMES:
        assert res[key] > 0, key
    # The version was timed repeats times after a first one, each published once.
    assert res["last_version"] == repeats + 1
    # A second engine on the node updates without a byte more in the server.
    assert (res["second_engine_new_buffers"], res["second_engine_new_bytes"]) == (0, 0)
    assert res["served_versions"] == [res["last_version"]] * 2
    # The storage way read files whose pages the bench had dropped (a
    # filesystem on a disk: tmpfs keeps its pages).
    assert res["storage_resident_max"] == 0.0
    assert res["memory_backing"] in ("hugetlb", "thp", "4k")
    # Its temp dir is gone, and with it every engine that served from it.
    assert list(tmp_path.glob("tce-vbench-*")) == []
    assert _processes_naming(str(tmp_path)) == []
    # The table shows every figure.
    table = _vllmbench.render(res)
    for label in ("floor:", "TCE: publish", "TCE / floor", "storage: vLLM reload_weights",
                  "storage / TCE", "HTTP:", "HTTP / TCE", "a second engine: new server buffers"):
        assert label in table, label
