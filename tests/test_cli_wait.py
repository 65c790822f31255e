"""`tce wait` for files the cache no longer holds: storage says whether
they are durable, an object root's bucket as much as a directory."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
import torch

import tce
from tce import api
from tce.core import _knobs
from tce.tools._moto import credentials_env
from tce.tools._server import LocalServer


def _wait(socket: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tce.cli", "--socket", socket, "wait", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.s3
def test_a_file_only_the_bucket_holds_is_durable(tmp_path, s3_bucket, moto):
    root = str(tmp_path / "ckpt")  # an object root has no directory
    server = LocalServer(memory_budget="256MiB", storage_roots=[f"{root}=s3://{s3_bucket}/run1"],
                         extra_args=["--memory-backing", "4k", "--s3-endpoint", moto.endpoint,
                                     "--s3-path-style", "true"],
                         env={**os.environ, **credentials_env()}).start()
    job = f"wait-{uuid.uuid4().hex[:8]}"
    try:
        with _knobs.override(socket=server.socket, job=job, on_unavailable="raise"):
            path = f"{root}/step1/model.pt"
            tce.save({"w": torch.ones(8)}, path)
            tce.wait([path])
            api.remove(path)  # the cache lets go; the bucket keeps the object
            api.close()
        for args in (["--job", job], []):
            p = _wait(server.socket, *args, path)
            assert p.returncode == 0 and p.stdout == f"durable   {path} (not in the cache)\n", p
        p = _wait(server.socket, "--job", job, f"{root}/step1/none.pt")
        assert p.returncode == 1, p
        assert p.stderr == f"missing   {root}/step1/none.pt: neither in the cache nor on storage\n"
    finally:
        assert server.stop() == 0, server.log()
        server.cleanup()
