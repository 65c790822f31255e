"""``tce doctor``: the fabric devices the ring would use, by the rules
tce-server applies (TCE_RDMA_DEVICES, else NCCL_IB_HCA, else all, divided
among local ranks). Run against this machine's real libfabric, whose tcp
provider offers one device per network interface (lo at least)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.rdma  # the fabric listing needs a server built with libfabric


def _doctor(*args, **env):
    base = {k: v for k, v in os.environ.items() if k not in ("TCE_RDMA_DEVICES", "NCCL_IB_HCA")}
    p = subprocess.run([sys.executable, "-m", "tce.cli", "doctor", "--provider", "tcp", *args],
                       capture_output=True, text=True, env=dict(base, **env), timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_doctor_lists_the_fabric_and_applies_the_device_rules():
    info = json.loads(_doctor("--json", "--local-ranks", "2"))
    assert info["filter"] == {"variable": "", "spec": ""}
    assert "lo" in info["devices"]
    assert any(p["provider"] == "tcp;ofi_rxm" and p["device"] == "lo" and p["ring"] for p in info["providers"])
    assert info["selected"] == info["devices"]  # no filter: every device
    flat = [d for rank in info["local_ranks"] for d in rank]
    assert len(info["local_ranks"]) == 2 and sorted(flat) == sorted(info["selected"])  # divided, not shared
    assert info["verbs"] is None  # pyverbs is optional and not installed here

    exact = json.loads(_doctor("--json", "--local-ranks", "3", TCE_RDMA_DEVICES="=lo"))
    assert exact["filter"] == {"variable": "TCE_RDMA_DEVICES", "spec": "=lo"}
    assert exact["selected"] == ["lo"] and exact["local_ranks"] == [["lo"], ["lo"], ["lo"]]

    excluded = json.loads(_doctor("--json", NCCL_IB_HCA="^=lo:1"))
    assert excluded["filter"]["variable"] == "NCCL_IB_HCA"
    assert excluded["selected"] == [d for d in excluded["devices"] if d != "lo"]

    both = json.loads(_doctor("--json", TCE_RDMA_DEVICES="lo", NCCL_IB_HCA="^lo"))
    assert both["filter"]["variable"] == "TCE_RDMA_DEVICES" and both["selected"] == ["lo"]


def test_doctor_prints_a_readable_report():
    out = _doctor("--local-ranks", "2", NCCL_IB_HCA="=lo")
    assert out.startswith("libfabric ")
    assert "tcp;ofi_rxm" in out
    assert "device filter: NCCL_IB_HCA==lo" in out
    assert "selected: lo" in out
    assert "  local rank 0: lo\n  local rank 1: lo" in out
    assert "verbs: pyverbs not installed" in out
