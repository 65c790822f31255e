"""vLLM processes for tests/test_vllm.py, run in the vLLM environment.

    python vllm_driver.py follow MODEL OUT LAST     an offline LLM on TCE's backend
    python vllm_driver.py reference OUT DIR...      a fresh LLM on each DIR's files
    python vllm_driver.py serve MODEL JOB           an offline LLM the test drives

``serve``: the engine answers commands on stdin, one per line (``update
N``, ``ask``, ``version``, ``fail-next-load``: tests/vllm_faults.py), with
one JSON line each on stdout, prefixed with ``@@ `` (vLLM logs there too).

``follow``: an offline ``vllm.LLM`` started on MODEL with
``weight_transfer_config={"backend": "tce"}`` (nothing else of TCE in its
engine) follows the job TCE_JOB on the server at TCE_SOCKET through
``tce.vllm``: for each version the trainer publishes it runs
the long prompt (so the prefix cache holds blocks computed with the weights
it serves), updates, and writes what ``ask`` answers to OUT/v<N>.json,
until version LAST. ``reference``: for each checkpoint directory, a fresh
engine started on its files writes OUT/<dirname>.json. The tests compare
the two bit for bit (the logprobs as JSON floats: float32 values print
exactly).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# the prompts: a short one, and one longer than a KV block of 32 tokens several times
SHORT = "The checkpoint engine"
LONG = " ".join(["Rollouts read each version from the cache of their node."] * 12)
ENGINE_ARGS = dict(dtype="float32", max_model_len=512, block_size=32, seed=0, enforce_eager=True,
                   enable_prefix_caching=True,
                   # TEST_TP=2: two workers, each binding its threads to a core of its own
                   tensor_parallel_size=int(os.environ.get("TEST_TP", "1")))
SERVER_ARGS = ("--dtype", "float32", "--max-model-len", "512", "--block-size", "32", "--seed", "0",
               "--enforce-eager", "--enable-prefix-caching")


def ask(llm) -> dict:
    """Greedy tokens and each one's logprob, for both prompts."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=0)
    out = {}
    for name, prompt in (("short", SHORT), ("long", LONG)):
        o = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
        out[name] = {"tokens": list(o.token_ids),
                     "logprobs": [lp[t].logprob for t, lp in zip(o.token_ids, o.logprobs)]}
    return out


def ask_http(url: str, model: str, prompts: tuple[str, ...] = ("short", "long")) -> dict:
    """``ask`` of a vLLM server, through its completions API."""
    import urllib.request

    out = {}
    for name in prompts:
        body = {"model": model, "prompt": SHORT if name == "short" else LONG, "max_tokens": 8,
                "temperature": 0.0, "logprobs": 0, "return_tokens_as_token_ids": True}
        req = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            lp = json.loads(r.read())["choices"][0]["logprobs"]
        out[name] = {"tokens": [int(t.split(":", 1)[1]) for t in lp["tokens"]],
                     "logprobs": lp["token_logprobs"]}
    return out


def follow(model: str, out: Path, last: int) -> None:
    from vllm import LLM

    from tce import weights
    from tce import vllm as tce_vllm

    job = os.environ["TCE_JOB"]
    llm = LLM(model=model, weight_transfer_config={"backend": "tce"}, **ENGINE_ARGS)
    [engine] = tce_vllm.connect([llm], job)
    (out / "ready").write_text(json.dumps(ask(llm)))
    version = 0
    while version < last:
        info = weights.wait_newer(job, after=version, timeout=300)
        llm.generate([LONG], use_tqdm=False)  # the prefix cache holds the old weights' blocks
        engine.update(info.version)
        assert engine.version() == info.version, (engine.version(), info.version)
        version = info.version
        (out / f"v{version}.json").write_text(json.dumps(ask(llm)))


def serve(model: str, job: str) -> None:
    from vllm import LLM

    from tce import vllm as tce_vllm

    llm = LLM(model=model, weight_transfer_config={"backend": "tce"},
              worker_extension_cls="vllm_faults.Faults", **ENGINE_ARGS)
    [engine] = tce_vllm.connect([llm], job)

    def reply(obj: dict) -> None:
        print("@@ " + json.dumps(obj), flush=True)

    reply({"ready": True})
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "update":
            try:
                engine.update(int(args[0]))
                reply({"ok": True})
            except Exception as e:
                reply({"error": str(e)})
        elif cmd == "ask":
            reply(ask(llm))
        elif cmd == "version":
            reply({"version": engine.version()})
        elif cmd == "fail-next-load":
            llm.collective_rpc("fail_next_load")
            reply({"ok": True})


def reference(out: Path, dirs: list[str]) -> None:
    from vllm import LLM

    for d in dirs:
        llm = LLM(model=d, **ENGINE_ARGS)
        (out / f"{Path(d).name}.json").write_text(json.dumps(ask(llm)))
        del llm


if __name__ == "__main__":
    what, rest = sys.argv[1], sys.argv[2:]
    if what == "follow":
        follow(rest[0], Path(rest[1]), int(rest[2]))
    elif what == "serve":
        serve(rest[0], rest[1])
    elif what == "reference":
        reference(Path(rest[0]), rest[1:])
    else:
        sys.exit(f"unknown command {what}")
