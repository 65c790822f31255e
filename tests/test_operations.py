"""What a cluster operator sees: the Prometheus endpoint, the gRPC health
service the probes use, and structured (JSON) logs. Real servers, real
scrapes parsed by the Prometheus client library, real gRPC health checks."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

import tce
from tce import _service, api
from tce.core import _client, _knobs
from tce.errors import TCEError
from tce.v1 import tce_pb2 as pb, tce_pb2_grpc as pb_grpc
from tce.tools._server import LocalServer

from helpers import Blocker, SilentPeer, until


def _status(server) -> dict:
    with _knobs.override(socket=server.socket):
        st = api.status()
        api.close()
    return st


def _scrape(endpoint: str) -> dict[tuple[str, tuple], float]:
    """Every sample of GET /metrics, parsed by the Prometheus client:
    (sample name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _raw(endpoint: str, request: bytes) -> bytes:
    host, port = endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as c:
        c.sendall(request)
        chunks = []
        while chunk := c.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_metrics_move_with_saves_persistence_and_failures(tmp_path):
    storage = tmp_path / "s"
    storage.mkdir()
    blocker = Blocker(storage / "blocked" / "x.pt")
    s = LocalServer(memory_budget="1GiB", storage_roots=[str(storage)],
                    extra_args=["--metrics-listen", "127.0.0.1:0", "--persist-threads", "1",
                                "--persist-retries", "2", "--persist-backoff-ms", "10"])
    s.start()
    try:
        endpoint = _status(s)["metrics_endpoint"]
        assert endpoint.startswith("127.0.0.1:") and not endpoint.endswith(":0")
        before = _scrape(endpoint)
        assert before[("tce_up", (("version", "0.1.0"),))] == 1
        assert before[("tce_accepting_saves", ())] == 1
        assert before[("tce_cached_bytes", ())] == 0
        assert before[("tce_persisted_bytes_total", ())] == 0
        assert before[("tce_persist_seconds_count", ())] == 0
        assert before[("tce_budget_bytes", ())] == 1 << 30

        sds = [{"w": torch.full((8 << 20,), float(i))} for i in range(4)]  # 32 MiB each
        paths = [storage / f"f{i}.pt" for i in range(4)]
        scrapes = []
        with _knobs.override(socket=s.socket, on_unavailable="raise"):
            for p, sd in zip(paths, sds):
                tce.save(sd, p)
                scrapes.append(_scrape(endpoint))  # during the saves: persistence runs behind
            sizes = [f.size for f in _service.client().list()]
            api.close()
        assert scrapes[0][("tce_cached_bytes", ())] > 0
        assert scrapes[-1][("tce_saves_total", ())] == 4
        assert max(m[("tce_persist_queue", ())] for m in scrapes) >= 1, "persistence never lagged a save"
        after = until(lambda: (m := _scrape(endpoint))[("tce_files", (("state", "persisted"),))] == 4 and m,
                       what="4 persisted files in the metrics")
        assert after[("tce_persisted_files_total", ())] == 4
        assert after[("tce_persisted_bytes_total", ())] == sum(sizes)
        assert after[("tce_persist_seconds_count", ())] == 4
        assert after[("tce_persist_seconds_bucket", (("le", "+Inf"),))] == 4
        assert after[("tce_persist_seconds_sum", ())] > 0
        assert after[("tce_persist_megabytes_per_second_count", ())] == 4
        assert after[("tce_persist_queue", ())] == 0
        assert after[("tce_files", (("state", "cached"),))] == 0
        assert after[("tce_failures_total", (("reason", "persist_write"),))] == 0

        # A file persistence cannot write: each failed attempt is counted,
        # and the file ends failed.
        with _knobs.override(socket=s.socket, on_unavailable="raise"):
            tce.save({"w": torch.ones(10)}, storage / "blocked" / "x.pt")
            api.close()
        failed = until(lambda: (m := _scrape(endpoint))[("tce_failed_files", ())] == 1 and m,
                        what="the failed file")
        assert failed[("tce_failures_total", (("reason", "persist_write"),))] == 3  # 1 + 2 retries
        assert failed[("tce_files", (("state", "failed"),))] == 1
        assert failed[("tce_metadata_healthy", ())] == 1
    finally:
        s.stop()
        s.cleanup()
        blocker.release()


def test_the_metrics_endpoint_answers_bad_requests_and_survives_them(tmp_path):
    s = LocalServer(memory_budget="64MiB", extra_args=["--metrics-listen", "127.0.0.1:0"])
    s.start()
    try:
        endpoint = _status(s)["metrics_endpoint"]
        p = subprocess.run([sys.executable, "-m", "tce.cli", "--socket", s.socket, "status"],
                           capture_output=True, text=True, timeout=60)
        assert f"ops       metrics http://{endpoint}/metrics\n" in p.stdout, p.stdout
        assert _raw(endpoint, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400 Bad Request\r\n")
        assert _raw(endpoint, b"GET /nope HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 404 Not Found\r\n")
        assert _raw(endpoint, b"POST /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405 ")
        assert _raw(endpoint, b"GET /metrics HTTP/1.1\r\n" + b"X: " + b"y" * 10000).startswith(b"HTTP/1.1 431 ")
        head = _raw(endpoint, b"HEAD /metrics HTTP/1.0\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
        # A scraper that connects and says nothing, and one that hangs up at
        # once: neither stops the next scrape.
        host, port = endpoint.rsplit(":", 1)
        silent = socket.create_connection((host, int(port)), timeout=10)
        socket.create_connection((host, int(port)), timeout=10).close()
        assert _scrape(endpoint)[("tce_up", (("version", "0.1.0"),))] == 1  # answered, not held
        silent.close()
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://{endpoint}/", timeout=10)
        assert e.value.code == 404
    finally:
        s.stop()
        s.cleanup()


def _read_to_eof(c: socket.socket) -> bytes:
    """What the server sends until it closes `c` (a reset ends it too)."""
    chunks = []
    try:
        while chunk := c.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


class _Slowloris:
    """Connections that send a request one byte a second and never finish
    it; `closed` counts those the server has hung up on."""

    def __init__(self, endpoint: str, n: int):
        host, port = endpoint.rsplit(":", 1)
        self.conns = [socket.create_connection((host, int(port)), timeout=10) for _ in range(n)]
        self.closed = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._trickle, args=(c,), daemon=True) for c in self.conns]
        for t in self._threads:
            t.start()

    def _trickle(self, c: socket.socket) -> None:
        request = b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"y" * 4096
        try:
            for byte in request:
                c.sendall(bytes([byte]))
                c.settimeout(1.0)  # the pace: a byte a second, unless the server hangs up
                try:
                    if c.recv(1) == b"":
                        break
                except socket.timeout:
                    pass
                if self._stop.is_set():
                    return
        except OSError:  # reset by the server
            pass
        with self._lock:
            self.closed += 1

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
        for c in self.conns:
            c.close()


def test_slow_clients_neither_stall_scrapes_nor_shutdown(tmp_path):
    s = LocalServer(memory_budget="64MiB", extra_args=["--metrics-listen", "127.0.0.1:0"])
    s.start()
    slow = None
    try:
        endpoint = _status(s)["metrics_endpoint"]
        # More trickling clients than the endpoint has workers: a scrape is
        # answered meanwhile, and each of them is hung up on at its deadline
        # however steadily it sends.
        slow = _Slowloris(endpoint, 6)
        assert _scrape(endpoint)[("tce_up", (("version", "0.1.0"),))] == 1
        until(lambda: slow.closed == 6, timeout=60, what="the server to hang up on every trickling client")
        slow.close()
        # A client that sends nothing at all is hung up on too.
        host, port = endpoint.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as quiet:
            assert _read_to_eof(quiet) == b""
        # And trickling clients keep no shutdown waiting.
        slow = _Slowloris(endpoint, 6)
        assert _scrape(endpoint)[("tce_up", (("version", "0.1.0"),))] == 1
        assert s.stop() == 0, s.log()
    finally:
        if slow:
            slow.close()
        s.stop()
        s.cleanup()


def _try_scrape(endpoint: str) -> dict | None:
    try:
        return _scrape(endpoint)
    except urllib.error.HTTPError as e:
        assert e.code == 503, e
        return None


def test_connections_past_the_metrics_pool_are_refused_at_once(tmp_path):
    s = LocalServer(memory_budget="64MiB", extra_args=["--metrics-listen", "127.0.0.1:0"])
    s.start()
    try:
        endpoint = _status(s)["metrics_endpoint"]
        host, port = endpoint.rsplit(":", 1)

        def extras_refused() -> bool:
            # 4 served and 8 waiting fill the endpoint; 3 more are refused,
            # unless the first have already met their deadline (then: again).
            held = [socket.create_connection((host, int(port)), timeout=10) for _ in range(12)]
            extras = [socket.create_connection((host, int(port)), timeout=10) for _ in range(3)]
            try:
                return all(_read_to_eof(c).startswith(b"HTTP/1.1 503 Service Unavailable\r\n") for c in extras)
            finally:
                for c in held + extras:
                    c.close()

        until(extras_refused, timeout=60, what="connections past the pool refused")
        until(lambda: "refused a connection" in s.log(), what="the warning")
        # The endpoint lets the closed ones go, and scrapes are answered.
        m = until(lambda: _try_scrape(endpoint), what="a scrape answered")
        assert m[("tce_up", (("version", "0.1.0"),))] == 1
    finally:
        s.stop()
        s.cleanup()


def test_a_busy_metrics_port_is_a_clear_startup_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        s = LocalServer(memory_budget="64MiB", extra_args=["--metrics-listen", f"127.0.0.1:{port}"])
        try:
            with pytest.raises(RuntimeError, match=r"tce-server exited with 1:[\s\S]*metrics_listen: .*"
                                                   r"listen on 127\.0\.0\.1:\d+.*Address already in use"):
                s.start()
        finally:
            s.cleanup()


def _check(channel, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def test_health_serves_until_the_drain_and_liveness_until_exit(tmp_path):
    storage = tmp_path / "s"
    storage.mkdir()
    blocker = Blocker(storage / "blocked" / "x.pt")
    s = LocalServer(memory_budget="64MiB", storage_roots=[str(storage)], drain_timeout_ms=3000,
                    extra_args=["--health-listen", "127.0.0.1:0", "--persist-retries", "100",
                                "--persist-backoff-ms", "50"])
    s.start()
    try:
        endpoint = _status(s)["health_endpoint"]
        assert endpoint.startswith("127.0.0.1:") and not endpoint.endswith(":0")
        SERVING, NOT_SERVING = (health_pb2.HealthCheckResponse.SERVING,
                                health_pb2.HealthCheckResponse.NOT_SERVING)
        with grpc.insecure_channel(endpoint) as ch:
            assert _check(ch, "") == SERVING
            assert _check(ch, "tce.v1.Cache") == SERVING
            assert _check(ch, "liveness") == SERVING
            with pytest.raises(grpc.RpcError) as e:
                _check(ch, "no.such.Service")
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
            # The health port serves nothing else: the cache service is not on it.
            with pytest.raises(grpc.RpcError) as e:
                ch.unary_unary("/tce.v1.Cache/Status")(b"", timeout=5)
            assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED

            with _knobs.override(socket=s.socket, on_unavailable="raise"):
                tce.save({"w": torch.ones(10)}, storage / "blocked" / "x.pt")  # keeps the drain busy
                api.close()
            s.proc.send_signal(signal.SIGTERM)
            until(lambda: _check(ch, "") == NOT_SERVING, what="readiness to drop")
            assert _check(ch, "tce.v1.Cache") == NOT_SERVING
            assert _check(ch, "liveness") == SERVING  # the kubelet must not kill a drain
            assert s.proc.wait(timeout=30) == 0
    finally:
        s.stop()
        s.cleanup()
        blocker.release()


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


@pytest.fixture
def pids_cgroup():
    """put(pid, extra): the process in a pids cgroup of its own (v1 or v2)
    whose pids.max leaves it `extra` threads more than it has; removed after."""
    if os.path.exists("/sys/fs/cgroup/pids/tasks"):  # cgroup v1
        root = "/sys/fs/cgroup/pids"
    else:  # cgroup v2: the controller enabled for the root's children
        root = "/sys/fs/cgroup"
        with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
            f.write("+pids")
    if os.geteuid() != 0:
        pytest.fail("this test needs root (a pids cgroup); CI runs as root")
    path = os.path.join(root, f"tce-test-{os.getpid()}")
    os.makedirs(path, exist_ok=True)

    def put(pid: int, extra: int) -> None:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(pid))
        with open(os.path.join(path, "pids.max"), "w") as f:
            f.write(str(_threads(pid) + extra))

    yield put
    with open(os.path.join(path, "cgroup.procs")) as f:
        left = [p for p in f.read().split() if p]
    for p in left:  # back to the root, so the directory can go
        with open(os.path.join(root, "cgroup.procs"), "w") as f:
            f.write(p)
    os.rmdir(path)


def test_unauthenticated_callers_cannot_take_every_thread(tmp_path, pids_cgroup):
    """Under a pids limit, as a pod has: Watch streams on the health port are
    capped (the rest RESOURCE_EXHAUSTED at once), liveness still answers, a
    flood of peer connections is refused rather than aborting the server,
    and saves go on."""
    s = LocalServer(memory_budget="64MiB", extra_args=[
        "--health-listen", "127.0.0.1:0", "--peer-listen", "127.0.0.1:0", "--peer-token", "t"]).start()
    streams, conns = [], []
    try:
        st = _status(s)
        pids_cgroup(s.proc.pid, 48)
        with grpc.insecure_channel(st["health_endpoint"]) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            codes = []
            for _ in range(40):
                call = stub.Watch(health_pb2.HealthCheckRequest(service="liveness"), timeout=60)
                try:
                    next(call)
                    streams.append(call)
                    codes.append("OK")
                except grpc.RpcError as e:
                    codes.append(e.code().name)
            assert codes.count("OK") == 8 and set(codes) == {"OK", "RESOURCE_EXHAUSTED"}, codes
            assert _check(ch, "liveness") == health_pb2.HealthCheckResponse.SERVING
            host, port = st["peer_endpoint"].rsplit(":", 1)
            settled = _threads(s.proc.pid)
            for _ in range(80):  # each handshake takes a thread while it lasts
                c = socket.create_connection((host, int(port)), timeout=10)
                conns.append(c)
            assert s.proc.poll() is None, s.log()
            for c in conns:
                c.close()
            conns.clear()
            until(lambda: _threads(s.proc.pid) <= settled + 8, timeout=60, what="the handshake threads to end")
            assert _check(ch, "liveness") == health_pb2.HealthCheckResponse.SERVING
            with _knobs.override(socket=s.socket, job="threads", on_unavailable="raise"):
                tce.save({"w": torch.ones(1000)}, tmp_path / "x.pt")
                assert torch.equal(tce.load(tmp_path / "x.pt")["w"], torch.ones(1000))
                api.close()
    finally:
        for c in streams:
            c.cancel()
        for c in conns:
            c.close()
        assert s.stop() == 0, s.log()
        s.cleanup()


def test_calls_waiting_on_a_silent_peer_are_capped(tmp_path, pids_cgroup):
    """Under a pids limit, as a pod has: ranged reads that a ring member
    which never answers would hold take at most max_peer_calls_per_uid (4)
    of max_peer_calls (8); the rest are RESOURCE_EXHAUSTED at once, naming
    the setting. The server's threads stay bounded, liveness and
    Status answer, and a save goes on while the held reads wait."""
    silent = SilentPeer()
    s = LocalServer(memory_budget="64MiB", extra_args=[
        "--health-listen", "127.0.0.1:0", "--peer-listen", "127.0.0.1:0", "--peer-token", "t",
        "--peer-timeout-ms", "600000", "--max-peer-calls", "8", "--max-peer-calls-per-uid", "4",
        "--max-waits", "8"]).start()
    reader = None
    pool = concurrent.futures.ThreadPoolExecutor(60)
    try:
        st = _status(s)
        with _knobs.override(socket=s.socket):  # this uid owns the job: it told the ring
            _service.client().set_ring("silent-job", 0, [st["peer_endpoint"], silent.endpoint])
            api.close()
        reader = _client.Client(s.socket, rpc_timeout=600)
        settled = _threads(s.proc.pid)
        pids_cgroup(s.proc.pid, 48)

        def read(i: int) -> str:
            try:
                reader.read_range("silent-job", f"/ckpt/other-node/{i}.pt", 0, 4096)
                return "OK"
            except TCEError as e:
                return f"{e.code}: {e.message}"

        calls = [pool.submit(read, i) for i in range(60)]
        until(lambda: sum(c.done() for c in calls) == 56, timeout=60,
              what="every read beyond the uid's share to be refused")
        refused = [c.result() for c in calls if c.done()]
        assert all(r.startswith("RESOURCE_EXHAUSTED") and "(max_peer_calls_per_uid=4)" in r
                   for r in refused), refused
        until(lambda: len(silent.conns) >= 4, what="the held reads to reach the silent peer")
        assert sum(not c.done() for c in calls) == 4  # still waiting on the peer
        assert _threads(s.proc.pid) <= settled + 16, _threads(s.proc.pid)
        with grpc.insecure_channel(st["health_endpoint"]) as ch:
            assert _check(ch, "liveness") == health_pb2.HealthCheckResponse.SERVING
        assert int(_status(s)["pid"]) == s.proc.pid
        with _knobs.override(socket=s.socket, job="other", on_unavailable="raise"):
            tce.save({"w": torch.ones(1000)}, tmp_path / "x.pt")
            assert torch.equal(tce.load(tmp_path / "x.pt")["w"], torch.ones(1000))
            api.close()
        silent.close()  # the held reads end: the file is in no member's memory
        results = [c.result(timeout=60) for c in calls]
        assert sum(r.startswith("NOT_FOUND") for r in results) == 4, results
    finally:
        silent.close()
        pool.shutdown(wait=False)
        if reader is not None:
            reader.close()
        assert s.stop() == 0, s.log()
        s.cleanup()


def test_a_flood_of_blocked_calls_is_refused_beyond_the_control_servers_threads(tmp_path, pids_cgroup):
    """Saves into a full cache wait for room, each on a thread of the
    control server: beyond its pool (rpc_threads 4 + max_waits 8 +
    max_peer_calls 8 + 64 = 84 threads) calls are RESOURCE_EXHAUSTED at
    once, under a pids limit that more threads would pass, and the server
    lives on: liveness answers, and its waiting saves end with the drain."""
    storage = tmp_path / "s"
    storage.mkdir()
    blocker = Blocker(storage / "blocked" / "x.pt")
    s = LocalServer(memory_budget="64MiB", storage_roots=[str(storage)], drain_timeout_ms=1000,
                    extra_args=["--health-listen", "127.0.0.1:0", "--persist-retries", "100",
                                "--persist-backoff-ms", "50", "--cache-full-timeout-ms", "600000",
                                "--max-waits", "8", "--max-peer-calls", "8"]).start()
    saver = None
    pool = concurrent.futures.ThreadPoolExecutor(150)
    try:
        with _knobs.override(socket=s.socket, job="flood", on_unavailable="raise"):
            tce.save({"w": torch.ones(12 << 20)}, storage / "blocked" / "x.pt")  # 48 MiB, held
            api.close()
        health = _status(s)["health_endpoint"]
        saver = _client.Client(s.socket, rpc_timeout=600)
        stub = pb_grpc.CacheStub(saver._channel)
        settled = _threads(s.proc.pid)
        pids_cgroup(s.proc.pid, 120)

        def allocate(i: int) -> str:
            try:
                stub.Allocate(pb.AllocateRequest(session=saver.session, job="flood",
                                                 path=str(storage / f"{i}.pt"), size=32 << 20),
                              timeout=600)
                return "OK"
            except grpc.RpcError as e:
                return e.code().name

        calls = [pool.submit(allocate, i) for i in range(150)]
        until(lambda: sum(c.done() for c in calls) >= 150 - 84, timeout=60,
              what="the calls beyond the pool to be refused")
        assert {c.result() for c in calls if c.done()} == {"RESOURCE_EXHAUSTED"}
        assert _threads(s.proc.pid) <= settled + 84 + 8, _threads(s.proc.pid)
        assert s.proc.poll() is None, s.log()
        with grpc.insecure_channel(health) as ch:
            assert _check(ch, "liveness") == health_pb2.HealthCheckResponse.SERVING
        assert s.stop(timeout=60) == 0, s.log()  # the waiting saves end with the drain
        assert all(c.result(timeout=60) in ("RESOURCE_EXHAUSTED", "UNAVAILABLE") for c in calls)
    finally:
        pool.shutdown(wait=False)
        if saver is not None:
            saver.close()
        s.stop()
        s.cleanup()
        blocker.release()


def test_json_logs_are_one_object_per_line_with_the_event_fields(tmp_path):
    s = LocalServer(memory_budget="64MiB", extra_args=["--log-format", "json", "--log-level", "debug"])
    s.start()
    path = tmp_path / "ckpt" / "x.pt"
    try:
        with _knobs.override(socket=s.socket, job="json-job", on_unavailable="raise"):
            tce.save({"w": torch.ones(10)}, path, tag="t1")
            api.close()
    finally:
        assert s.stop() == 0
    lines = [ln for ln in s.log().splitlines() if ln.strip()]
    s.cleanup()
    events = [json.loads(ln) for ln in lines]  # every line is one JSON object
    assert all({"ts", "level", "component", "msg"} <= e.keys() for e in events)
    assert {e["level"] for e in events} <= {"debug", "info", "warning", "error"}
    committed = [e for e in events if e["component"] == "cache" and e["msg"].startswith("committed ")]
    assert len(committed) == 1, events
    assert committed[0]["job"] == "json-job"
    assert committed[0]["tag"] == "t1"
    assert committed[0]["path"] == str(path)
    assert int(committed[0]["size"]) > 0
    assert events[-2]["msg"] == "stopped"
    assert events[-1]["msg"].startswith("exited ") and int(events[-1]["memory_bytes"]) > 0
