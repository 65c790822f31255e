"""Rank and world size, the one place the client works them out.

With an initialised ``torch.distributed`` process group they come from it;
otherwise from the launcher's ``RANK`` / ``WORLD_SIZE`` (0 and 1 when unset).
The collectives are no-ops in a single process.
"""

from __future__ import annotations

import os
from typing import Any

import torch


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
