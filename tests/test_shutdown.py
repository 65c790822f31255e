"""SIGTERM drains: the server finishes persisting, refuses new saves
meanwhile, and a deadline or a second signal ends the drain."""

from __future__ import annotations

import concurrent.futures
import signal
import time
from pathlib import Path

import pytest
import torch

import tce
from tce import _service, api
from tce.core import _client, _knobs
from tce.tools._server import LocalServer
from tce.errors import ServerUnavailableError, TCEError
from helpers import Blocker, SilentPeer, until


def _server_with_a_stuck_path(tmp_path: Path, drain_timeout_ms: int) -> tuple[LocalServer, Path]:
    """A started server and its storage root, where ``blocked/x.pt`` is a
    Blocker: a save to it is cached, and persisting it keeps failing (100
    retries, 50 ms apart) for longer than any test waits."""
    storage = tmp_path / "s"
    storage.mkdir()
    Blocker(storage / "blocked" / "x.pt")
    s = LocalServer(memory_budget="256MiB", storage_roots=[str(storage)],
                    drain_timeout_ms=drain_timeout_ms,
                    extra_args=["--persist-retries", "100", "--persist-backoff-ms", "50"])
    return s.start(), storage


def test_sigterm_persists_everything_cached_then_exits_0(tmp_path):
    storage = tmp_path / "s"
    storage.mkdir()
    s = LocalServer(memory_budget="1GiB", storage_roots=[str(storage)], drain_timeout_ms=120000,
                    extra_args=["--persist-threads", "1"])
    s.start()
    sds = [{"w": torch.full((16 << 20,), float(i))} for i in range(4)]  # 64 MiB each
    try:
        with _knobs.override(socket=s.socket, on_unavailable="raise"):
            for i, sd in enumerate(sds):
                tce.save(sd, storage / f"f{i}.pt")
            api.close()
        # At once: most of the files are still waiting for the one persist worker.
        assert s.stop(timeout=120) == 0
        for i, sd in enumerate(sds):
            assert torch.equal(torch.load(storage / f"f{i}.pt", weights_only=True)["w"], sd["w"])
        log = s.log()
        assert "draining (at most 120000 ms" in log and "drained: 0 file(s) unfinished" in log, log
    finally:
        s.cleanup()


def test_a_drain_refuses_saves_serves_loads_and_ends_at_its_deadline(tmp_path):
    s, storage = _server_with_a_stuck_path(tmp_path, drain_timeout_ms=1500)
    stuck = storage / "blocked" / "x.pt"
    try:
        with _knobs.override(socket=s.socket, on_unavailable="raise"):
            tce.save({"w": torch.ones(10)}, stuck)  # cached; its persistence keeps failing
            t0 = time.monotonic()
            s.proc.send_signal(signal.SIGTERM)
            until(lambda: "draining" in s.log(), what="the drain")
            with pytest.raises(ServerUnavailableError, match="shutting down"):
                tce.save({"w": torch.ones(10)}, storage / "y.pt")
            assert torch.equal(tce.load(stuck, weights_only=True)["w"], torch.ones(10))
            api.close()
        assert s.proc.wait(60) == 0  # bounds a hang only
        assert time.monotonic() - t0 >= 1.5  # not before its deadline
        log = s.log()
        assert "drain deadline passed: 1 file(s) unfinished" in log, log  # the deadline ended it
        assert f"unfinished at shutdown: job=default path={stuck}: not persisted" in log, log
    finally:
        s.cleanup()


def test_a_second_signal_ends_the_drain_at_once(tmp_path):
    s, storage = _server_with_a_stuck_path(tmp_path, drain_timeout_ms=600000)
    try:
        with _knobs.override(socket=s.socket, on_unavailable="raise"):
            tce.save({"w": torch.ones(10)}, storage / "blocked" / "x.pt")
            api.close()
        s.proc.send_signal(signal.SIGTERM)
        until(lambda: "draining" in s.log(), what="the drain")
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(60) == 0  # a hang bound, far below the drain's 10 minutes
        assert "second signal: 1 file(s) unfinished" in s.log()
    finally:
        s.cleanup()


def test_sigterm_ends_the_waits_on_a_peer_that_never_answers(tmp_path):
    """A ring member that accepts and never answers, with peer timeouts of
    10 minutes: the server's restore from it, a ranged read asked of it and a
    load waiting for the restore would each hold the shutdown that long.
    SIGTERM breaks those links: the waits end at once, the callers hear why,
    and the server exits 0 (the 60 s bound only catches a hang)."""
    silent = SilentPeer()
    s = LocalServer(memory_budget="64MiB", extra_args=[
        "--peer-listen", "127.0.0.1:0", "--peer-token", "t", "--peer-timeout-ms", "600000",
        "--ring-restore-wait-ms", "600000", "--log-level", "debug"]).start()
    pool = concurrent.futures.ThreadPoolExecutor(2)
    c = None
    try:
        with _knobs.override(socket=s.socket):
            endpoint = api.status()["peer_endpoint"]
            _service.client().set_ring("j", 0, [endpoint, silent.endpoint])
            api.close()
        c = _client.Client(s.socket, rpc_timeout=600)

        def outcome(call) -> str:
            try:
                call()
                return "OK"
            except TCEError as e:
                return f"{e.code}: {e.message}"

        read = pool.submit(outcome, lambda: c.read_range("j", "/ckpt/other.pt", 0, 10))
        load = pool.submit(outcome, lambda: c.open("j", "/ckpt/restored.pt"))
        # The restore's link, the read's and (while it waits) nothing for the load.
        until(lambda: len(silent.conns) >= 2, what="the restore and the read to reach the peer")
        until(lambda: "path=/ckpt/restored.pt waits for the ring restore" in s.log(),
              what="the load to wait for the restore")
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(timeout=60) == 0, s.log()
        log = s.log()
        assert "stopping: broke " in log and "link(s) to peers" in log, log
        assert read.result(timeout=60).startswith("NOT_FOUND"), read.result()
        assert load.result(timeout=60) == ("UNAVAILABLE: the server is stopping: no longer waiting "
                                           "for the ring restore of job j"), load.result()
    finally:
        pool.shutdown(wait=False)
        if c is not None:
            c.close()
        silent.close()
        s.cleanup()
