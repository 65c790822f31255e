"""``tce vllm follow``: keep vLLM servers on a job's newest version.

For asynchronous reinforcement learning, where rollouts should always
serve the newest weights: the controller waits for each version the
trainer publishes (on this node, or brought here by following the job from
``--sources``) and drives vLLM's update sequence on every engine that
serves an older one, printing one line per version with each engine's
version and lag.
"""

from __future__ import annotations

import argparse
import sys
import time

from tce import weights
from tce import vllm as tce_vllm


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="vllm_command", required=True)
    f = sub.add_parser("follow", help="bring vLLM servers to each new version of a job")
    f.add_argument("--job", required=True, help="the trainer's job")
    f.add_argument("--server", action="append", required=True, metavar="URL",
                   help="a vLLM server (http://host:port, started with VLLM_SERVER_DEV_MODE=1 and "
                        "--weight-transfer-config '{\"backend\": \"tce\"}'); repeat for several")
    f.add_argument("--sources", nargs="+", metavar="HOST:PORT",
                   help="the job is published on other nodes: follow it from these peer endpoints "
                        "(the previous node of the chain first, the trainer's last)")
    f.add_argument("--mode", choices=tce_vllm.PAUSE_MODES, default="keep",
                   help="requests in flight during an update: keep (frozen, resumed on the new "
                        "weights; default), wait (finish first), abort")
    f.add_argument("--until-version", type=int, default=0, metavar="N",
                   help="exit once every engine serves version N or newer (default: run for ever)")
    f.add_argument("--timeout", type=float, default=600.0,
                   help="seconds one HTTP call to an engine may take (default 600)")


def _line(info: weights.VersionInfo, results: list[tce_vllm.EngineUpdate]) -> str:
    parts = []
    for r in results:
        lag = info.version - r.version
        part = f"{r.engine} serves {r.version}"
        if r.seconds and not r.error:
            part += f" ({r.seconds:.2f} s)"
        if lag:
            part += f", lag {lag}"
        if r.error:
            part += f": {r.error}"
        parts.append(part)
    return f"version {info.version} ({info.tag}): " + "; ".join(parts)


def main(args: argparse.Namespace) -> int:
    if args.sources:
        weights.follow(args.job, sources=args.sources)
    engines = [tce_vllm.Engine(url, timeout=args.timeout) for url in args.server]
    for e in engines:
        try:
            e.init(args.job, sources=args.sources)
        except tce_vllm.UpdateFailedError as err:  # not up yet: initialised at its first update
            print(f"{e.name} not initialised yet: {err}", file=sys.stderr, flush=True)
    print(f"following job {args.job!r} for {len(engines)} engine(s)", flush=True)
    done: dict[str, int] = {}

    def report(info: weights.VersionInfo, results: list[tce_vllm.EngineUpdate]) -> None:
        print(_line(info, results), flush=True)
        done.update((r.engine, r.version) for r in results)

    def stop() -> bool:
        return bool(args.until_version) and len(done) == len(engines) and \
            min(done.values()) >= args.until_version

    start = time.monotonic()
    tce_vllm.follow(engines, args.job, mode=args.mode, stop=stop, report=report)
    print(f"every engine serves version {min(done.values())} ({time.monotonic() - start:.1f} s)",
          file=sys.stderr)
    return 0
