"""``tce.core.dist``: rank, world size, the collectives and the ring.

This module is for TCE's integrations and tools (the DeepSpeed engine, the
DCP writer, the benchmarks), not a user's API: a training script calls
``tce.join_ring()`` and nothing else here.

Rank and world size come from an initialised ``torch.distributed`` process
group; otherwise from the launcher's ``RANK`` / ``WORLD_SIZE`` (0 and 1
when unset). The collectives are no-ops in a single process.

Each node's server backs up what it caches to the server of the next node
rank. The servers learn the ring from the job (:func:`join_ring`): local
rank 0 of every node reports its server's peer endpoint, the endpoints are
gathered with ``torch.distributed``, and each local rank 0 tells its server
its node rank and the whole list (:func:`set_ring`). The DeepSpeed engine
does this when it is created; plain PyTorch jobs call ``tce.join_ring()``
once on every rank after ``init_process_group``.

Example::

    from tce.core import dist

    everyone = dist.all_gather(mine)                  # also a barrier
    if dist.rank() == 0:
        print(f"{dist.world_size()} ranks: {everyone}")
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from tce.core import _knobs, _session
from tce.errors import TCEError

__all__ = ["all_gather", "broadcast", "initialized", "join_ring", "node_rank", "rank",
           "set_ring", "world_size"]

log = logging.getLogger("tce.ring")

# ---------------------------------------------------------------------------
# Rank, world size and the collectives
# ---------------------------------------------------------------------------


def initialized() -> bool:
    """Whether a torch.distributed process group is up."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def rank() -> int:
    """This process's global rank: the process group's, else $RANK, else 0."""
    if initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """The number of ranks: the process group's, else $WORLD_SIZE, else 1."""
    if initialized():
        return torch.distributed.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, by rank (collective; ``[obj]`` in one process)."""
    if not initialized():
        return [obj]
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` (collective; ``obj`` itself in one process)."""
    if not initialized():
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


# ---------------------------------------------------------------------------
# The ring
# ---------------------------------------------------------------------------


def node_rank() -> int:
    """This process's node rank: the launcher's GROUP_RANK / NODE_RANK, else
    rank // local world size."""
    for name in ("GROUP_RANK", "NODE_RANK"):
        value = os.environ.get(name)
        if value not in (None, ""):
            return int(value)
    rank_ = rank()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
    if local <= 0:
        local = torch.cuda.device_count() if torch.cuda.is_available() else 1
    return rank_ // max(local, 1)


def set_ring(job: str, node_rank: int, endpoints: list[str]) -> str:
    """Tell the server the job's ring (every node's peer endpoint, by node
    rank) and its place in it; returns its successor ("" with one node).
    :func:`join_ring` does this for a torch.distributed job."""
    return _session.with_client(lambda c: c.set_ring(job, node_rank, endpoints))


def join_ring(job: str | None = None) -> list[str]:
    """Collective (every rank calls it): set the job's ring on every node's
    server. Returns the endpoints by node rank ([] when there is no ring: one
    node, no process group, or servers started without ``peer_listen``)."""
    if not initialized():
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
    gathered = all_gather((node, endpoint))
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
        successor = set_ring(job, node, endpoints)
        log.info("TCE: job %s, node %d of %d, backing up to %s", job, node, len(endpoints), successor)
    # No rank goes on (to a load that asks another node) before every node's
    # server knows the ring.
    all_gather(None)
    return endpoints
