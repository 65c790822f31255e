"""One rank of a job that restarts on empty nodes, for the cooperative
restore tests: connects to its node's server (TCE_SOCKET, TCE_JOB), says
"ready", then for each line on stdin (a JSON list of paths) loads those files
with tce.load and answers a JSON line: a SHA-256 of each file's tensors and
where this session's loads found their bytes (the node's memory, another
node's, storage), or the error a load raised. An empty line ends it."""

import hashlib
import json
import sys

import torch

import tce
from tce import _service


def digest(state) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        value = state[name]
        h.update(name.encode())
        h.update(value.numpy().tobytes() if isinstance(value, torch.Tensor) else repr(value).encode())
    return h.hexdigest()


_service.with_client(lambda c: c.status())  # connected before the test says go
print("ready", flush=True)
for line in sys.stdin:
    if not line.strip():
        break
    try:
        digests = {p: digest(tce.load(p, weights_only=True)) for p in json.loads(line)}
    except Exception as e:  # the test checks what a failed load says
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        continue
    loaded = _service.with_client(lambda c: dict(c.loaded))
    print(json.dumps({"digests": digests, "loaded": loaded}), flush=True)
