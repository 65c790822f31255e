"""tce.weights across nodes: an inference node follows a trainer's job and
brings each version's weight files from the nodes that hold them.

Every "node" is a network namespace with its own tce-server (a ring server:
peer port and cluster token); the servers talk only over their namespace
addresses. The trainer saves and publishes on node 0.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch

import tce
from tce import weights
from tce.core import _knobs
from tce.errors import PermissionDeniedError
from tce.integrations import safetensors as st

from helpers import until

from test_ring import _node_server, _status, _stop

pytestmark = pytest.mark.multinode

JOB = "rl-run"


# A reader process on a node: waits for the version after 1 there.
WAITER = '''
import sys
from tce import weights
from tce.core._session import client
c = client()
print("waiting", flush=True)
print(c.get_version(sys.argv[1], after=1, timeout=120).version, flush=True)
'''


# A reader process on a node: loads the newest version, saves it for the test.
LOADER = '''
import os, sys, tempfile, torch
from tce import weights
with weights.open(sys.argv[1]) as w:
    sd = {n: t.clone() for n, t in w.tensors()}
path = os.path.join(tempfile.mkdtemp(), "got.pt")
torch.save(sd, path)
print(path)
'''


def _on(server, job=JOB):
    return _knobs.override(socket=server.socket, job=job, on_unavailable="raise")


def _publish(server, directory, step: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(step)
    sd = {f"layer{i}.weight": torch.randn(256, 256) for i in range(4)}
    with _on(server):
        st.save_file(sd, directory / "model.safetensors", tag=f"step{step}")
        weights.publish(f"step{step}", [directory])
        tce.close()
    return sd


def _read(server, version=0) -> tuple[int, dict[str, torch.Tensor]]:
    with _on(server):
        with weights.open(version=version) as w:
            model = {n: torch.zeros_like(t) for n, t in w.tensors()}
            w.load_into(model)
            v = w.version
        tce.close()
    return v, model


def test_inference_nodes_follow_the_trainer_and_bring_each_version_once(tmp_path, nodes3):
    trainer = _node_server(tmp_path, "tcp", nodes3, 0, "trainer")
    infer1 = _node_server(tmp_path, "tcp", nodes3, 1, "infer1")
    infer2 = _node_server(tmp_path, "tcp", nodes3, 2, "infer2")
    try:
        src, e1 = _status(trainer)["peer_endpoint"], _status(infer1)["peer_endpoint"]
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir()
        v1 = _publish(trainer, ckpt, 1)
        with _on(infer1):
            newest = weights.follow(sources=[src])
            tce.close()
        assert (newest.version, newest.tag) == (1, "step1")
        # Node 2 follows node 1 first, then the trainer's node.
        with _on(infer2):
            assert weights.follow(sources=[e1, src]).version == 1
            tce.close()
        version, got = _read(infer1)
        assert version == 1 and all(torch.equal(got[n], v1[n]) for n in v1)
        assert int(_status(infer1)["replica_files"]) == 1
        served = int(_status(trainer)["version_ranges_served"])
        assert served >= 1
        version, got = _read(infer2)
        assert version == 1 and all(torch.equal(got[n], v1[n]) for n in v1)
        # Node 2's bytes came from node 1 (its replica), not the trainer's node.
        assert int(_status(trainer)["version_ranges_served"]) == served
        assert int(_status(infer1)["version_ranges_served"]) >= 1
        # A reader waiting on node 1 is answered when node 0 publishes.
        reader = subprocess.Popen(
            [sys.executable, "-c", WAITER, JOB], stdout=subprocess.PIPE, text=True,
            env=dict(os.environ, TCE_SOCKET=infer1.socket))
        assert reader.stdout.readline().strip() == "waiting"
        v2 = _publish(trainer, ckpt, 2)
        assert reader.stdout.readline().strip() == "2"  # answered when node 0 published
        assert reader.wait(timeout=60) == 0
        version, got = _read(infer2, 2)
        assert version == 2 and all(torch.equal(got[n], v2[n]) for n in v2)
        # A second reader on node 2 brings nothing again: the replica is there.
        before = _status(infer2)
        version, got = _read(infer2, 2)
        assert int(_status(infer2)["buffers"]) == int(before["buffers"])
    finally:
        _stop(infer2, infer1, trainer)


def test_a_lost_node_in_the_chain_leaves_the_next_one_to_the_trainers_node(tmp_path, nodes3):
    trainer = _node_server(tmp_path, "tcp", nodes3, 0, "trainer")
    infer1 = _node_server(tmp_path, "tcp", nodes3, 1, "infer1")
    infer2 = _node_server(tmp_path, "tcp", nodes3, 2, "infer2")
    try:
        src, e1 = _status(trainer)["peer_endpoint"], _status(infer1)["peer_endpoint"]
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir()
        _publish(trainer, ckpt, 1)
        with _on(infer1):
            weights.follow(sources=[src])
            tce.close()
        with _on(infer2):
            weights.follow(sources=[e1, src])
            tce.close()
        v2 = _publish(trainer, ckpt, 2)
        os.kill(infer1.proc.pid, signal.SIGKILL)  # node 1 is lost
        infer1.proc.wait()
        version, got = _read(infer2, 2)
        assert version == 2 and all(torch.equal(got[n], v2[n]) for n in v2)
    finally:
        _stop(infer2, trainer)
        infer1.cleanup()


def test_a_middle_node_pulls_a_version_through_as_it_lands(tmp_path, nodes3):
    trainer = _node_server(tmp_path, "tcp", nodes3, 0, "trainer")
    infer1 = _node_server(tmp_path, "tcp", nodes3, 1, "infer1")
    infer2 = _node_server(tmp_path, "tcp", nodes3, 2, "infer2")
    try:
        src, e1 = _status(trainer)["peer_endpoint"], _status(infer1)["peer_endpoint"]
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir()
        torch.manual_seed(3)
        sd = {"big": torch.randn(10 << 20)}  # 40 MiB: three ranges of at most 16 MiB
        with _on(trainer):
            st.save_file(sd, ckpt / "model.safetensors", tag="step1")
            weights.publish("step1", [ckpt])
            tce.close()
        with _on(infer1):
            weights.follow(sources=[src])  # no reader on node 1 ever opens it
            tce.close()
        with _on(infer2):
            weights.follow(sources=[e1, src])
            tce.close()
        version, got = _read(infer2)
        assert version == 1 and torch.equal(got["big"], sd["big"])
        # Node 1 brought the file from node 0 for node 2 and served it on:
        # the trainer's node sent each range once, to node 1 only.
        served = [int(_status(n).get("version_ranges_served", 0)) for n in (trainer, infer1, infer2)]
        assert served == [3, 3, 0]
        assert int(_status(infer1)["replica_files"]) == 1
        assert int(_status(infer2)["replica_files"]) == 1
    finally:
        _stop(infer2, infer1, trainer)


def test_a_node_lost_while_a_version_spreads_leaves_the_rest_to_the_next_source(tmp_path, nodes3):
    from tce.tools._weightsnodes import limit_link
    trainer = _node_server(tmp_path, "tcp", nodes3, 0, "trainer")
    infer1 = _node_server(tmp_path, "tcp", nodes3, 1, "infer1")
    infer2 = _node_server(tmp_path, "tcp", nodes3, 2, "infer2")
    try:
        src, e1 = _status(trainer)["peer_endpoint"], _status(infer1)["peer_endpoint"]
        limit_link(nodes3, 1, "50mbit")  # node 1's transfer takes seconds: it is lost in the middle
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir()
        torch.manual_seed(4)
        sd = {"big": torch.randn(10 << 20)}  # 40 MiB: three ranges
        with _on(trainer):
            st.save_file(sd, ckpt / "model.safetensors", tag="step1")
            weights.publish("step1", [ckpt])
            tce.close()
        with _on(infer1):
            weights.follow(sources=[src])
            tce.close()
        with _on(infer2):
            weights.follow(sources=[e1, src])
            tce.close()
        reader = subprocess.Popen([sys.executable, "-c", LOADER, JOB], stdout=subprocess.PIPE, text=True,
                                  env=dict(os.environ, TCE_SOCKET=infer2.socket))
        # Node 1 has the first range from node 0 and passes it on: lose it now.
        until(lambda: int(_status(trainer).get("version_ranges_served", 0)) >= 1, what="node 1's first range")
        os.kill(infer1.proc.pid, signal.SIGKILL)
        infer1.proc.wait()
        out, _ = reader.communicate(timeout=300)
        assert reader.returncode == 0, out
        got = torch.load(out.strip(), weights_only=True)
        assert torch.equal(got["big"], sd["big"])
        # Node 2 had some of the file from node 1, and the rest from node 0.
        stopped = [ln for ln in infer2.log().splitlines() if " stopped at byte " in ln]
        assert stopped and f"the rest from {src}" in stopped[0], infer2.log()
    finally:
        _stop(infer2, trainer)
        infer1.cleanup()
