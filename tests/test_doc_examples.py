"""Docs that run: every ```python block of README.md and docs/*.md is executed.

Each block runs as a script of its own (``python example.py``) in a fresh
temporary working directory, against a private tce-server started for it, as
a user's script on a node runs: it finds the node's server through
``TCE_SOCKET`` (README's Quickstart) and, like one process started by the
``deepspeed`` or ``torchrun`` launcher, finds ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` set for a world of one.
The docs' storage root is ``/ckpt`` (the server started with
``--storage-roots /ckpt``): the private server's storage root is a directory
``ckpt`` in the block's working directory, and ``/ckpt`` in the block stands
for it. A block passes when it exits 0.

A block that cannot run on one machine says why in an HTML comment on the
line just before its fence, and is skipped for that reason only::

    <!-- example: needs gpu -->            a CUDA device
    <!-- example: needs cluster -->        several nodes (a ring, DeepSpeed across nodes, following a job,
                                           engines on other hosts)
    <!-- example: fragment -->             a piece of a larger program (keep these few)

``needs`` takes one or more of the words above, comma-separated. A block
marked ``<!-- example: vllm -->`` runs too, with the vLLM environment's
python (build/vllm-venv, which ``make test`` makes) and ``/models/base``
standing for a small Qwen2 model written for it. Any other marker fails its
block, and so does a block with no marker that does not run.
Each case is named ``FILE:LINE`` of the block's opening fence.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tce.tools._server import LocalServer

ROOT = Path(__file__).resolve().parent.parent
NEEDS = {
    "gpu": "needs a CUDA device",
    "cluster": "needs several nodes",
}
VLLM = "vllm"  # the marker of a block run in the vLLM environment
_MODEL = re.compile(r"(?<![\w./-])/models/base(?=[/\"'\s]|$)", re.M)
_MARKER = re.compile(r"<!--\s*example:\s*(.*?)\s*-->\s*$")
_CKPT = re.compile(r"(?<![\w./-])/ckpt(?=[/\"'\s\]]|$)", re.M)
TIMEOUT_S = 240  # within pytest's 300 s: the first DeepSpeed run builds an extension (~45 s)


@dataclass(frozen=True)
class Block:
    """One ```python block: where it starts, its marker (or ""), its code."""

    where: str
    marker: str
    code: str


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """The ```python blocks of a Markdown file, with the marker before each."""
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
            assert end is not None, f"{path.name}:{start + 1}: the ```python block never closes"
            prev = lines[start - 1] if start else ""
            m = _MARKER.match(prev.strip())
            found.append(Block(f"{path.relative_to(ROOT)}:{start + 1}", m.group(1) if m else "",
                               "\n".join(lines[start + 1:end]) + "\n"))
            i = end
        i += 1
    return found


ALL = [b for p in doc_files() for b in blocks(p)]


def skip_reason(marker: str) -> str | None:
    """Why a marked block is skipped; None for an unmarked one. An unknown
    marker fails the test: the vocabulary is the module docstring's."""
    if not marker or marker == VLLM:
        return None
    if marker == "fragment":
        return "a fragment of a larger program (marked <!-- example: fragment -->)"
    words = [w.strip() for w in marker.removeprefix("needs ").split(",")] if marker.startswith("needs ") else []
    unknown = [w for w in words if w not in NEEDS]
    if not words or unknown:
        pytest.fail(f"unknown example marker <!-- example: {marker} --> "
                    f"(known: fragment, needs {', '.join(NEEDS)})")
    return "; ".join(NEEDS[w] for w in words)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_docs_have_examples():
    """The extraction finds the blocks (a changed fence must not silently
    make this file test nothing)."""
    assert len(ALL) >= 10, [b.where for b in ALL]
    assert any(b.where.startswith("README.md:") for b in ALL)


def test_markers():
    assert skip_reason("") is None
    assert skip_reason("needs gpu, cluster") == "needs a CUDA device; needs several nodes"
    assert skip_reason(VLLM) is None  # it runs, in the vLLM environment
    assert "fragment" in skip_reason("fragment")
    for unknown in ("needs tpu", "skip", "needs", "needs vllm"):
        with pytest.raises(pytest.fail.Exception, match="unknown example marker"):
            skip_reason(unknown)


@pytest.mark.parametrize("block", ALL, ids=[b.where for b in ALL])
def test_example_runs(block: Block, tmp_path: Path):
    reason = skip_reason(block.marker)
    if reason:
        pytest.skip(f"{block.where}: {reason}")
    work = tmp_path / "work"
    (work / "ckpt").mkdir(parents=True)
    script = work / "example.py"
    code = _CKPT.sub(str(work / "ckpt"), block.code)
    python, extra_env = sys.executable, {}
    if block.marker == VLLM:  # vLLM's own environment, on a small model of the docs' /models/base
        from tce.tools import _vllm_env
        from tce.tools._vllm_model import build

        python = str(_vllm_env.ensure(say=print))
        build(work / "models" / "base")
        code = _MODEL.sub(str(work / "models" / "base"), code)
        extra_env = dict(VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="2", TOKENIZERS_PARALLELISM="false",
                         HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    script.write_text(code)
    server = LocalServer(socket_path=str(tmp_path / "tce.sock"), memory_budget="1GiB",
                         storage_roots=[str(work / "ckpt")],
                         extra_args=["--memory-backing", "4k"]).start()
    try:
        own = python == sys.executable  # the vLLM environment has TCE installed: no PYTHONPATH of ours
        env = {k: v for k, v in os.environ.items()
               if (not k.startswith("TCE_") or k.endswith("_BIN")) and (own or k != "PYTHONPATH")}
        env.update(extra_env)
        env.update(TCE_SOCKET=server.socket, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                   LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
        p = subprocess.run([python, script.name], cwd=work, env=env, capture_output=True,
                           text=True, timeout=TIMEOUT_S)
    finally:
        code = server.stop()
    assert p.returncode == 0, (f"{block.where}: the example exits {p.returncode}\n--- code\n{block.code}"
                               f"--- stdout\n{p.stdout[-4000:]}\n--- stderr\n{p.stderr[-6000:]}")
    assert code == 0, f"tce-server exited with {code}:\n{server.log()}"
