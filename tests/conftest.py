"""Black-box fixtures: the real tce-server on a temp socket (Redis's habit)."""

from __future__ import annotations

import functools
import itertools
import os
import re
import subprocess
import sys

import pytest

import tce
from tce import api
from tce.core import _knobs
from tce.tools._netns import Nodes
from tce.tools._server import LocalServer, server_binary
from s3_helpers import FaultProxy, MotoServer
from tce.tools import _moto


@functools.lru_cache(maxsize=None)
def _server_lacks_libfabric() -> str:
    """Why the server cannot run rdma tests ("" when it can): a build
    without libfabric says so when asked for the fabric listing."""
    p = subprocess.run([server_binary(), "--fabric-info"], capture_output=True, text=True, timeout=60)
    return p.stderr.strip() if p.returncode != 0 and "built without it" in p.stderr else ""


def pytest_runtest_setup(item):
    if item.get_closest_marker("rdma") and _server_lacks_libfabric():
        pytest.skip(_server_lacks_libfabric())


NR_HUGEPAGES = "/proc/sys/vm/nr_hugepages"
SHMEM_THP = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"


@pytest.fixture
def huge_pages():
    """reserve(n): make n 2 MiB huge pages free for the test (root; CI runs
    as root), and put the old count back after."""
    try:
        with open(NR_HUGEPAGES) as f:
            old = int(f.read())
    except OSError as e:
        pytest.skip(f"no {NR_HUGEPAGES}: {e}")
    if os.geteuid() != 0:
        pytest.skip(f"reserving huge pages needs root ({NR_HUGEPAGES})")

    def free_pages() -> int:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("HugePages_Free:"))

    def reserve(n: int) -> None:
        # n pages free for the test, on top of those other processes use
        # (0 stays 0: "no huge page free").
        with open(NR_HUGEPAGES) as f:
            total = int(f.read())
        with open(NR_HUGEPAGES, "w") as f:
            f.write(str(total - free_pages() + n))
        got = free_pages()
        assert got >= n, f"the kernel made only {got} of {n} huge pages free"

    yield reserve
    with open(NR_HUGEPAGES, "w") as f:
        f.write(str(old))


@pytest.fixture
def shmem_thp():
    """Shmem THP on 'advise' for the test (root), put back after; yields the
    setting it found."""
    try:
        with open(SHMEM_THP) as f:
            old = f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        pytest.skip(f"no shmem THP on this kernel ({SHMEM_THP})")
    if os.geteuid() != 0:
        pytest.skip(f"setting {SHMEM_THP} needs root")
    with open(SHMEM_THP, "w") as f:
        f.write("advise")
    try:
        yield old
    finally:
        with open(SHMEM_THP, "w") as f:
            f.write(old)


def _start(budget: str) -> LocalServer:
    # 4 KiB pages whatever the machine has reserved: budgets here count
    # buffers in 4 KiB (hugetlb rounds each to 2 MiB; tests/test_memory.py
    # covers it).
    return LocalServer(memory_budget=budget, extra_args=["--memory-backing", "4k"]).start()


@pytest.fixture(scope="session")
def shared_server():
    """One server for the tests that do not care about budgets or restarts."""
    server = _start("3GiB")
    yield server
    code = server.stop()
    server.cleanup()
    assert code == 0, f"tce-server exited with {code}:\n{server.log()}"


@pytest.fixture
def server(shared_server):
    """The shared server, with this process's client pointed at it."""
    with _knobs.override(socket=shared_server.socket, job=f"test-{os.getpid()}"):
        yield shared_server
        api.close()


@pytest.fixture
def make_server():
    """Factory for private servers (own budget); stopped after the test."""
    started: list[LocalServer] = []

    def make(budget: str = "256MiB") -> LocalServer:
        s = _start(budget)
        started.append(s)
        return s

    yield make
    api.close()
    for s in started:
        code = s.stop()
        s.cleanup()
        assert code == 0, f"tce-server exited with {code}:\n{s.log()}"


def run_python(code: str, *, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    """Run code in a fresh interpreter; return stdout (raises on failure)."""
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
        env=dict(os.environ, **(env or {})),
    )
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p.stdout


def _nodes(n: int):
    """n "nodes": network namespaces on a bridge (tce.tools._netns)."""
    if os.geteuid() != 0:
        pytest.fail("the multinode tests need root (network namespaces); CI runs as root")
    nodes = Nodes(n)
    yield nodes
    nodes.close()


@pytest.fixture
def nodes2():
    yield from _nodes(2)


@pytest.fixture
def nodes3():
    yield from _nodes(3)


@pytest.fixture(scope="session")
def moto():
    """moto's S3 server on a loopback port (tests/s3_helpers.py), one for
    the session; killed at its end."""
    try:
        _moto.require("the s3 tests")
    except _moto.MissingDependency as e:
        pytest.skip(str(e))
    with MotoServer() as server:
        yield server


_buckets = itertools.count()


@pytest.fixture
def s3_bucket(moto, request):
    """A new, empty bucket on ``moto`` for the test; its name."""
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40]
    return moto.make_bucket(f"{stem}-{os.getpid()}-{next(_buckets)}".strip("-"))


@pytest.fixture
def fault_proxy(moto):
    """A FaultProxy in front of ``moto`` for the test; closed after it."""
    with FaultProxy(moto.endpoint) as proxy:
        yield proxy
