"""``tce demo --weights``: a trainer's new weights reach inference servers on
other nodes (a reinforcement learning loop's two halves).

Three "nodes" (network namespaces on a bridge; needs root), a ``tce-server``
on each. On node 0 a trainer trains a small GPT-2 (``transformers``, CPU)
and every ``--every`` steps saves it with ``save_pretrained`` (under
``tce.patch_torch``: a memory copy into the cache) and publishes it as a new
version. On nodes 1 and 2 an inference process serves the same model with
``generate()``: its node follows the trainer's job (node 2 through node 1,
a chain), and it swaps in each version between requests. For each version
the demo prints a timeline from the trainer's save start: saved and
published, each reader told, weights loaded, first generation with them;
and checks that every reader's logits equal the trainer's, bit for bit.
Last, the storage path for comparison: ``save_pretrained`` to a directory
and fsync, then the reader loads it from there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from tce.tools._netns import Nodes
from tce.tools._server import LocalServer

_TOKEN = "tce-demo-weights"
JOB = "rl-demo"

# An inference process: follows the job, then serves each version it learns.
_READER = r"""
import json, sys, time, torch, transformers
from tce import weights
job, sources, prompt = sys.argv[1], sys.argv[2].split(","), json.loads(sys.argv[3])
config = transformers.GPT2Config(**json.loads(sys.argv[4]))
model = transformers.GPT2LMHeadModel(config).eval()

def request():
    with torch.no_grad():
        ids = torch.tensor([prompt])
        logits = model(ids).logits
        out = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
    return logits, out

if job == "--storage":  # the storage path: told a directory, loads it from there
    import safetensors.torch
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        told = time.monotonic()
        model.load_state_dict(safetensors.torch.load_file(line.strip() + "/model.safetensors"), strict=False)
        loaded = time.monotonic()
        request()
        print(json.dumps({"told": told, "loaded": loaded, "generated": time.monotonic()}), flush=True)
    sys.exit(0)
weights.follow(job, sources=sources)
print(json.dumps({"ready": True}), flush=True)
version = 0
while True:
    info = weights.wait_newer(job, after=version, timeout=600)
    told = time.monotonic()
    with weights.open(job, info.version) as w:
        w.load_into(model, strict=False)
    loaded = time.monotonic()
    logits, out = request()
    generated = time.monotonic()
    print(json.dumps({"version": info.version, "told": told, "loaded": loaded, "generated": generated,
                      "logits": logits.flatten()[:64].tolist(), "digest": float(logits.double().sum()),
                      "tokens": out[0].tolist()}), flush=True)
    version = info.version
"""

def _config(args: argparse.Namespace) -> dict:
    """The model: --layers blocks --dim wide (--vocab tokens)."""
    heads = max(1, args.dim // 64)
    return {"n_layer": args.layers, "n_embd": args.dim, "n_head": heads, "vocab_size": args.vocab,
            "n_positions": 128, "bos_token_id": 0, "eos_token_id": 0}
_PROMPT = [11, 42, 7, 99, 3, 250, 17, 1]


def _servers(work: str, nodes: Nodes) -> list[LocalServer]:
    out = []
    for i in range(3):
        d = os.path.join(work, f"node{i}")
        os.makedirs(d)
        out.append(LocalServer(memory_budget="2GiB", socket_path=os.path.join(d, "tce.sock"),
                               netns=nodes.names[i],
                               extra_args=["--peer-listen", f"{nodes.addresses[i]}:7070", "--peer-token",
                                           _TOKEN, "--metadata-url", "none", "--log-level", "warning"]).start())
    return out


def main(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        raise SystemExit("tce demo --weights needs root (network namespaces)")
    import torch
    import transformers

    import tce
    from tce import client, weights

    work = tempfile.mkdtemp(prefix="tce-demo-weights-")
    nodes = Nodes(3)
    servers: list[LocalServer] = []
    readers: list[subprocess.Popen] = []
    try:
        servers = _servers(work, nodes)
        endpoints = [f"{a}:7070" for a in nodes.addresses]
        ckpt = os.path.join(work, "ckpt", "policy")  # one directory, saved over each time
        os.makedirs(ckpt)
        torch.manual_seed(0)
        config_kw = _config(args)
        config = transformers.GPT2Config(**config_kw)
        model = transformers.GPT2LMHeadModel(config)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        mib = sum(p.numel() * p.element_size() for p in model.parameters()) / (1 << 20)
        print(f"tce demo --weights: a {mib:.0f} MiB GPT-2 trained on node 0, served on nodes 1 and 2 "
              f"(node 2 follows node 1, then node 0)\n", flush=True)
        with client.override(socket=servers[0].socket, job=JOB, on_unavailable="raise"):
            tce.patch_torch([os.path.dirname(ckpt)])
            weights.grant(nodes=endpoints[1:])  # the inference nodes may follow the job
            model.save_pretrained(ckpt)
            weights.publish("step0", [ckpt])
            tce.api.close()
        sources = {1: [endpoints[0]], 2: [endpoints[1], endpoints[0]]}
        for i in (1, 2):
            p = subprocess.Popen([sys.executable, "-c", _READER, JOB, ",".join(sources[i]), json.dumps(_PROMPT),
                                  json.dumps(config_kw)], stdout=subprocess.PIPE, text=True,
                                 env=dict(os.environ, TCE_SOCKET=servers[i].socket))
            readers.append(p)
            if not json.loads(p.stdout.readline() or "{}").get("ready"):
                raise RuntimeError(f"the inference process on node {i} did not start")
        for r in readers:  # each serves version 1 (step 0) first
            json.loads(r.stdout.readline())
        equal = True
        print(f"{'version':>7}  {'saved+published':>15}  {'node 1: told / loaded / generated':>36}  "
              f"{'node 2: told / loaded / generated':>36}")
        step = 0
        with client.override(socket=servers[0].socket, job=JOB, on_unavailable="raise"):
            for v in range(2, args.versions + 2):
                for _ in range(args.every):
                    step += 1
                    ids = torch.randint(0, config.vocab_size, (4, 32))
                    loss = model(ids, labels=ids).loss
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                t0 = time.monotonic()
                model.save_pretrained(ckpt)
                info = weights.publish(f"step{step}", [ckpt])
                published = time.monotonic() - t0
                model.eval()  # (no dropout: what the readers compute)
                with torch.no_grad():
                    logits = model(torch.tensor([_PROMPT])).logits
                model.train()
                seen = [json.loads(r.stdout.readline()) for r in readers]
                cells = []
                for s in seen:
                    same = s["version"] == info.version and s["logits"] == logits.flatten()[:64].tolist() \
                        and s["digest"] == float(logits.double().sum())
                    equal = equal and same
                    cells.append(f"{(s['told'] - t0) * 1e3:8.1f} / {(s['loaded'] - t0) * 1e3:8.1f} / "
                                 f"{(s['generated'] - t0) * 1e3:8.1f} ms")
                print(f"{info.version:>7}  {published * 1e3:12.1f} ms  {cells[0]:>36}  {cells[1]:>36}",
                      flush=True)
            tce.unpatch_torch()
            tce.api.close()
        # The storage path: save_pretrained to a directory and fsync; a
        # reader process, told at once, loads it from there and generates.
        plain = os.path.join(work, "storage", "policy")
        p = subprocess.Popen([sys.executable, "-c", _READER, "--storage", "", json.dumps(_PROMPT),
                              json.dumps(config_kw)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        readers.append(p)
        json.loads(p.stdout.readline())
        t0 = time.monotonic()
        model.save_pretrained(plain)
        for name in os.listdir(plain):
            fd = os.open(os.path.join(plain, name), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        saved = time.monotonic() - t0
        p.stdin.write(plain + "\n")
        p.stdin.flush()
        s = json.loads(p.stdout.readline())
        print(f"{'storage':>7}  {saved * 1e3:12.1f} ms  {(s['told'] - t0) * 1e3:8.1f} / "
              f"{(s['loaded'] - t0) * 1e3:8.1f} / {(s['generated'] - t0) * 1e3:8.1f} ms  "
              "(save_pretrained + fsync; one reader loads the files)")
        print(f"every reader's logits equal the trainer's at every version, bit for bit: {'yes' if equal else 'NO'}")
        return 0 if equal else 1
    finally:
        for r in readers:
            r.kill()
            r.wait()
        for s in servers:
            s.stop()
            s.cleanup()
        nodes.close()
