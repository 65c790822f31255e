"""The trainer of tests/test_vllm.py's grant test, as another local user.

    python vllm_owner.py USER SOCKET JOB publish BASE DIR TAG SEED
    python vllm_owner.py USER SOCKET JOB grant|revoke UID

``publish``: the base model's weights (BASE/model.safetensors) moved by a
seeded step, saved through the cache as DIR/model.safetensors and published
as TAG. Every module is imported first, as root (the interpreter may live
where USER cannot read), then the process drops to USER for good
(tests/as_user.py), so the server sees USER's credentials.
"""

from __future__ import annotations

import json
import os
import sys

import torch

import tce
from tce import weights
from tce.core import _client, _session, _staging  # noqa: F401  (nothing may load after the drop)
from tce.integrations import safetensors as st
from tce.integrations import _patch  # noqa: F401
import grpc  # noqa: F401
from grpc import _channel  # noqa: F401
import safetensors.torch  # noqa: F401

from as_user import drop_to


def main() -> None:
    user, socket, job, what, *rest = sys.argv[1:]
    if what == "publish":
        base = st.load_file(os.path.join(rest[0], "model.safetensors"))  # read as root: any mode
    drop_to(user)
    tce.configure(socket=socket, job=job, on_unavailable="raise")
    if what == "publish":
        directory, tag, seed = rest[1], rest[2], int(rest[3])
        g = torch.Generator().manual_seed(seed)
        sd = {n: t + 0.01 * torch.randn(t.shape, generator=g) for n, t in base.items()}
        os.makedirs(directory, exist_ok=True)
        st.save_file(sd, os.path.join(directory, "model.safetensors"), tag=tag)
        print(json.dumps({"version": weights.publish(tag, [directory]).version}))
    elif what in ("grant", "revoke"):
        call = weights.grant if what == "grant" else weights.revoke
        print(json.dumps({"uids": call(uids=[int(rest[0])]).uids}))
    tce.close()


if __name__ == "__main__":
    main()
