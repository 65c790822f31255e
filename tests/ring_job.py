"""One "node" of a plain PyTorch job for the ring tests: init gloo, join the
ring, save a file through TCE, report. RANK/WORLD_SIZE/MASTER_*/NODE_RANK and
TCE_SOCKET come from the test."""

import json
import os

import torch

import tce

torch.distributed.init_process_group("gloo")
endpoints = tce.join_ring()
rank = torch.distributed.get_rank()
tce.save({"w": torch.full((1000,), float(rank))}, f"/ckpt/joined/rank{rank}.pt", tag="joined")
torch.distributed.barrier()
print(json.dumps({"rank": rank, "node": tce.core.dist.node_rank(), "endpoints": endpoints}), flush=True)
torch.distributed.destroy_process_group()
os._exit(0)  # skip interpreter teardown of gloo's threads (see dcp_job.py)
