"""The server image: hadolint passes on every Dockerfile, and `make image`
builds an image (podman, offline base) whose server serves a client on the
host through the bind-mounted socket directory, memfd and all."""

from __future__ import annotations

import glob
import os
import subprocess
import time
import uuid

import pytest
import torch

import tce
from tce import _api, _knobs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, CONTAINERS_CONF=os.path.join(REPO, "docker", "containers.conf"))
IMAGE = "localhost/tce-server:test"

pytestmark = pytest.mark.image


def _podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=ENV)
    if check:
        assert p.returncode == 0, f"podman {' '.join(args)}: {p.stderr}"
    return p


def test_hadolint_passes_on_every_dockerfile():
    files = glob.glob(os.path.join(REPO, "docker", "**", "*Dockerfile*"), recursive=True)
    assert files, "no Dockerfile under docker/"
    p = subprocess.run(["hadolint", "--config", os.path.join(REPO, ".hadolint.yaml"), *files],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.fixture(scope="module")
def image():
    t0 = time.monotonic()
    p = subprocess.run(["make", "image", f"IMAGE={IMAGE}"], cwd=REPO, capture_output=True, text=True,
                       timeout=1500, env=ENV)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    print(f"make image: {time.monotonic() - t0:.1f}s; {p.stdout.strip().splitlines()[-1]}")
    return IMAGE


@pytest.mark.timeout(1800)
def test_the_image_runs_unprivileged_with_the_server_as_entrypoint(image):
    cfg = _podman("image", "inspect", image, "--format", "{{.Config.User}} {{json .Config.Entrypoint}}")
    assert cfg.stdout.strip() == '10001:10001 ["/usr/local/bin/tce-server"]'
    p = _podman("run", "--rm", image, "--version")
    assert p.stdout.strip() == "tce-server 0.1.0"


@pytest.mark.timeout(1800)
def test_a_host_client_saves_and_loads_through_the_containers_socket(image, tmp_path):
    sockets = tmp_path / "run-tce"
    sockets.mkdir()
    os.chmod(sockets, 0o777)  # the container's user (uid 10001) creates its sockets here
    name = f"tce-smoke-{uuid.uuid4().hex[:8]}"
    _podman("run", "-d", "--name", name, "--init", "-v", f"{sockets}:/run/tce", image,
            "--memory-budget", "256MiB", "--metadata-url", "none", "--drain-timeout-ms", "5000")
    try:
        deadline = time.monotonic() + 60
        while not (sockets / "tce.sock.fd").exists():
            assert time.monotonic() < deadline, _podman("logs", name, check=False).stderr
            time.sleep(0.1)
        assert (sockets / "tce.sock").stat().st_uid == 10001
        sd = {"w": torch.randn(1 << 20), "b": torch.arange(1000, dtype=torch.int16), "step": 7}
        with _knobs.override(socket=str(sockets / "tce.sock"), job="image", on_unavailable="raise"):
            tce.save(sd, "/ckpt/rank0.pt", tag="t1")
            out = tce.load("/ckpt/rank0.pt", weights_only=True)
            st = tce.status()
            _api.close()
        assert torch.equal(out["w"], sd["w"]) and torch.equal(out["b"], sd["b"]) and out["step"] == 7
        # The bytes went through a memfd the server made in the container:
        # it knows the file, and its pid is the container's.
        assert int(st["files"]) == 1 and int(st["cached_bytes"]) > 4 << 20
        host_pid = int(_podman("inspect", name, "--format", "{{.State.Pid}}").stdout)
        assert int(st["pid"]) != host_pid
        _podman("stop", "-t", "30", name, timeout=60)
        assert _podman("inspect", name, "--format", "{{.State.ExitCode}}").stdout.strip() == "0"
        logs = _podman("logs", name).stderr + _podman("logs", name).stdout
        assert "committed job=image tag=t1 path=/ckpt/rank0.pt" in logs, logs
        assert "drained: 0 file(s) unfinished" in logs and "stopped" in logs, logs
    finally:
        _podman("rm", "-f", name, check=False)
