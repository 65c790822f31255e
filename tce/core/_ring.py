"""``tce.join_ring``: tell every node's server the job's ring.

Each node's server backs up what it caches to the server of the next node
rank. The servers learn the ring from the job: local rank 0 of every node
reports its server's peer endpoint, the endpoints are gathered with
``torch.distributed``, and each local rank 0 tells its server its node rank
and the whole list. The DeepSpeed engine does this when it is created; plain
PyTorch jobs call ``tce.join_ring()`` once on every rank after
``init_process_group``.
"""

from __future__ import annotations

import logging
import os

import torch

from tce.core import _dist, _knobs, _session
from tce.errors import TCEError

log = logging.getLogger("tce.ring")


def node_rank() -> int:
    """This process's node rank: the launcher's GROUP_RANK / NODE_RANK, else
    rank // local world size."""
    for name in ("GROUP_RANK", "NODE_RANK"):
        value = os.environ.get(name)
        if value not in (None, ""):
            return int(value)
    rank = _dist.rank()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
    if local <= 0:
        local = torch.cuda.device_count() if torch.cuda.is_available() else 1
    return rank // max(local, 1)


def join_ring(job: str | None = None) -> list[str]:
    """Collective (every rank calls it): set the job's ring on every node's
    server. Returns the endpoints by node rank ([] when there is no ring: one
    node, no process group, or servers started without ``peer_listen``)."""
    if not _dist.initialized():
        return []
    job = job if job is not None else _knobs.get("job")
    local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    node = node_rank()
    endpoint = None
    if local_rank == 0:
        try:
            endpoint = _session.with_client(lambda c: c.status()).peer_endpoint
        except TCEError as e:
            log.warning("TCE: no ring for job %s: the server is unreachable (%s)", job, e)
            endpoint = ""
    gathered = _dist.all_gather((node, endpoint))
    by_node: dict[int, str] = {}
    for n, e in gathered:
        if e is not None:
            if n in by_node and by_node[n] != e:
                raise TCEError(f"node rank {n} has two local rank 0 processes ({by_node[n]}, {e}): "
                               "set GROUP_RANK/NODE_RANK or LOCAL_WORLD_SIZE consistently")
            by_node[n] = e
    nodes = sorted(by_node)
    if nodes != list(range(len(nodes))):
        raise TCEError(f"node ranks {nodes} are not 0..{len(nodes) - 1}: check GROUP_RANK/NODE_RANK")
    endpoints = [by_node[n] for n in nodes]
    if len(endpoints) < 2:
        return []
    if not all(endpoints):
        missing = [n for n, e in enumerate(endpoints) if not e]
        if local_rank == 0 and node == 0:
            log.warning("TCE: no ring for job %s: the servers of node(s) %s take part in no ring "
                        "(start them with peer_listen and a peer token)", job, missing)
        return []
    if local_rank == 0:
        successor = _session.with_client(lambda c: c.set_ring(job, node, endpoints))
        log.info("TCE: job %s, node %d of %d, backing up to %s", job, node, len(endpoints), successor)
    # No rank goes on (to a load that asks another node) before every node's
    # server knows the ring.
    _dist.all_gather(None)
    return endpoints
