"""One rank of a job that restarts on empty nodes, for the cooperative
restore tests: connects to its node's server (TCE_SOCKET, TCE_JOB), says
"ready", then for each line on stdin (a JSON list of paths) loads those files
with tce.load and answers a JSON line: a SHA-256 of each file's tensors and
where this session's loads found their bytes (the node's memory, another
node's, storage), or the error a load raised. An empty line ends it."""

import json
import sys

import tce
from tce import _service

from helpers import state_digest as digest


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
