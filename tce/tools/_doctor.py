"""``tce doctor``: what fabric the ring would use on this node.

The device rules live in tce-server (``--fabric-info``), which applies them
to its own transfers, so what doctor prints is what the server does:

* the libfabric providers, fabrics and devices this node offers, and which
  of them can carry the ring (RMA over a reliable endpoint);
* the device filter in force: ``TCE_RDMA_DEVICES``, else ``NCCL_IB_HCA``
  (NCCL's syntax: comma list, ``^`` excludes, ``=`` exact names, otherwise
  prefixes, a ``:port`` suffix ignored);
* the devices each local rank would use (all selected devices divided
  among the local ranks);
* with the optional ``pyverbs`` package (the ``rdma`` extra), the verbs
  devices and the state of their ports.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from typing import Any

from tce.tools._server import server_binary


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--local-ranks", type=int, default=None,
                   help="ranks per node to divide the devices among "
                        "(default: $LOCAL_WORLD_SIZE, else 1)")
    p.add_argument("--provider", default=os.environ.get("TCE_OFI_PROVIDER", ""),
                   help="only this libfabric provider's devices count (default: "
                        "$TCE_OFI_PROVIDER, else any with RMA)")
    p.add_argument("--json", action="store_true")


def fabric_info(provider: str = "", local_ranks: int = 1) -> dict[str, Any]:
    env = dict(os.environ, LOCAL_WORLD_SIZE=str(local_ranks))
    args = [server_binary(), "--fabric-info"] + (["--ofi-provider", provider] if provider else [])
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"tce-server --fabric-info failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def verbs_devices() -> list[dict[str, Any]] | None:
    """The verbs devices and their ports, or None without pyverbs."""
    try:  # optional: the rdma extra
        import pyverbs.device as d
        from pyverbs.device import Context
    except ImportError:
        return None
    devices = []
    for dev in d.get_device_list():
        name = dev.name.decode()
        entry: dict[str, Any] = {"device": name, "ports": []}
        try:
            with Context(name=name) as ctx:
                for port in range(1, ctx.query_device().phys_port_cnt + 1):
                    attr = ctx.query_port(port)
                    entry["ports"].append({"port": port, "state": int(attr.state),
                                           "active": int(attr.state) == 4})
        except Exception as e:  # a device we may not open: say so, go on
            entry["error"] = str(e)
        devices.append(entry)
    return devices


def render(info: dict[str, Any], verbs: list[dict[str, Any]] | None) -> str:
    lines = [f"libfabric {info['libfabric']}"]
    if info.get("error"):
        lines.append(f"  no providers: {info['error']}")
    lines.append(f"{'PROVIDER':20s} {'FABRIC':22s} {'DEVICE':14s} RING")
    for p in info["providers"]:
        lines.append(f"{p['provider']:20s} {p['fabric']:22s} {p['device']:14s} "
                     f"{'yes' if p['ring'] else 'no'}")
    flt = info["filter"]
    lines.append("device filter: " + (f"{flt['variable']}={flt['spec']}" if flt["variable"]
                                      else "none (TCE_RDMA_DEVICES and NCCL_IB_HCA unset)"))
    prov = f" of provider {info['provider']}" if info["provider"] else ""
    lines.append(f"ring devices{prov}: {', '.join(info['devices']) or 'none'}")
    lines.append(f"selected: {', '.join(info['selected']) or 'none'}")
    for rank, devs in enumerate(info["local_ranks"]):
        lines.append(f"  local rank {rank}: {', '.join(devs) or 'none'}")
    if verbs is None:
        lines.append("verbs: pyverbs not installed (pip install 'tce[rdma]' to list verbs ports)")
    elif not verbs:
        lines.append("verbs: no devices")
    else:
        for v in verbs:
            ports = ", ".join(f"port {p['port']} {'ACTIVE' if p['active'] else 'state ' + str(p['state'])}"
                              for p in v["ports"]) or v.get("error", "no ports")
            lines.append(f"verbs: {v['device']}: {ports}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    ranks = args.local_ranks or int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    if ranks < 1:
        raise SystemExit("tce doctor: --local-ranks must be at least 1")
    info = fabric_info(args.provider, ranks)
    verbs = verbs_devices()
    if args.json:
        print(json.dumps(dict(info, verbs=verbs), indent=2))
    else:
        print(render(info, verbs))
    return 0
