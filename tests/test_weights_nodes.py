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


def _publish(server, directory, step: int, sd: dict[str, torch.Tensor] | None = None
             ) -> dict[str, torch.Tensor]:
    """Saves `sd` (default: four 256x256 layers seeded by `step`) as
    model.safetensors and publishes it as tag step<step>."""
    if sd is None:
        torch.manual_seed(step)
        sd = {f"layer{i}.weight": torch.randn(256, 256) for i in range(4)}
    with _on(server):
        st.save_file(sd, directory / "model.safetensors", tag=f"step{step}")
        weights.publish(f"step{step}", [directory])
        tce.close()
    return sd


def _big(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {"big": torch.randn(10 << 20)}  # 40 MiB: three ranges of at most 16 MiB


def _follow(server, sources: list[str]):
    with _on(server):
        newest = weights.follow(sources=sources)
        tce.close()
    return newest


def _read(server, version=0) -> tuple[int, dict[str, torch.Tensor]]:
    with _on(server):
        with weights.open(version=version) as w:
            model = {n: torch.zeros_like(t) for n, t in w.tensors()}
            w.load_into(model)
            v = w.version
        tce.close()
    return v, model


class Chain:
    """Node 0 the trainer's, nodes 1 and 2 inference nodes; node 2 follows
    node 1, then node 0 (`follow`)."""

    def __init__(self, tmp_path, nodes) -> None:
        self.nodes = nodes
        self.trainer = _node_server(tmp_path, "tcp", nodes, 0, "trainer")
        self.infer1 = _node_server(tmp_path, "tcp", nodes, 1, "infer1")
        self.infer2 = _node_server(tmp_path, "tcp", nodes, 2, "infer2")
        self.src = _status(self.trainer)["peer_endpoint"]
        self.e1 = _status(self.infer1)["peer_endpoint"]
        self.e2 = _status(self.infer2)["peer_endpoint"]
        self.ckpt = tmp_path / "ckpt"
        self.ckpt.mkdir()
        self.lost: list = []
        with _on(self.trainer):  # the trainer's user lets the inference nodes follow its job
            assert weights.grant(nodes=[self.e1, self.e2]).nodes == sorted([self.e1, self.e2])
            tce.close()

    def follow(self):
        """Node 1 follows node 0, node 2 follows node 1 then node 0; node 1's newest."""
        newest = _follow(self.infer1, [self.src])
        _follow(self.infer2, [self.e1, self.src])
        return newest

    def lose(self, server) -> None:
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
        self.lost.append(server)

    def close(self) -> None:
        _stop(*[s for s in (self.infer2, self.infer1, self.trainer) if s not in self.lost])
        for s in self.lost:
            s.cleanup()


@pytest.fixture
def chain(tmp_path, nodes3):
    c = Chain(tmp_path, nodes3)
    yield c
    c.close()


def test_inference_nodes_follow_the_trainer_and_bring_each_version_once(chain):
    trainer, infer1, infer2, src = chain.trainer, chain.infer1, chain.infer2, chain.src
    v1 = _publish(trainer, chain.ckpt, 1)
    newest = _follow(infer1, [src])
    assert (newest.version, newest.tag) == (1, "step1")
    # Node 2 follows node 1 first, then the trainer's node.
    assert _follow(infer2, [chain.e1, src]).version == 1
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
    v2 = _publish(trainer, chain.ckpt, 2)
    assert reader.stdout.readline().strip() == "2"  # answered when node 0 published
    assert reader.wait(timeout=60) == 0
    version, got = _read(infer2, 2)
    assert version == 2 and all(torch.equal(got[n], v2[n]) for n in v2)
    # A second reader on node 2 brings nothing again: the replica is there.
    before = _status(infer2)
    version, got = _read(infer2, 2)
    assert int(_status(infer2)["buffers"]) == int(before["buffers"])


def test_a_lost_node_in_the_chain_leaves_the_next_one_to_the_trainers_node(chain):
    _publish(chain.trainer, chain.ckpt, 1)
    chain.follow()
    v2 = _publish(chain.trainer, chain.ckpt, 2)
    chain.lose(chain.infer1)  # node 1 is lost
    version, got = _read(chain.infer2, 2)
    assert version == 2 and all(torch.equal(got[n], v2[n]) for n in v2)


def test_a_middle_node_pulls_a_version_through_as_it_lands(chain):
    sd = _publish(chain.trainer, chain.ckpt, 1, _big(3))
    chain.follow()  # no reader on node 1 ever opens it
    version, got = _read(chain.infer2)
    assert version == 1 and torch.equal(got["big"], sd["big"])
    # Node 1 brought the file from node 0 for node 2 and served it on:
    # the trainer's node sent each range once, to node 1 only.
    served = [int(_status(n).get("version_ranges_served", 0))
              for n in (chain.trainer, chain.infer1, chain.infer2)]
    assert served == [3, 3, 0]
    assert int(_status(chain.infer1)["replica_files"]) == 1
    assert int(_status(chain.infer2)["replica_files"]) == 1


def test_a_node_lost_while_a_version_spreads_leaves_the_rest_to_the_next_source(chain):
    from tce.tools._weightsnodes import limit_link
    limit_link(chain.nodes, 1, "50mbit")  # node 1's transfer takes seconds: it is lost in the middle
    sd = _publish(chain.trainer, chain.ckpt, 1, _big(4))
    chain.follow()
    reader = subprocess.Popen([sys.executable, "-c", LOADER, JOB], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, TCE_SOCKET=chain.infer2.socket))
    # Node 1 has the first range from node 0 and passes it on: lose it now.
    until(lambda: int(_status(chain.trainer).get("version_ranges_served", 0)) >= 1,
          what="node 1's first range")
    chain.lose(chain.infer1)
    out, _ = reader.communicate(timeout=300)
    assert reader.returncode == 0, out
    got = torch.load(out.strip(), weights_only=True)
    assert torch.equal(got["big"], sd["big"])
    # Node 2 had some of the file from node 1, and the rest from node 0.
    stopped = [ln for ln in chain.infer2.log().splitlines() if " stopped at byte " in ln]
    assert stopped and f"the rest from {chain.src}" in stopped[0], chain.infer2.log()


def test_a_trainer_node_replaced_with_empty_state_numbers_anew_and_followers_take_it(tmp_path, nodes2):
    """The trainer's node publishes versions 1 and 2; an inference node
    follows, and a reader there waits for a version above 2. The trainer's
    node is replaced by one with empty state on the same endpoint: it
    numbers from 1 again, in a new epoch. Its version 1 reaches the waiting
    reader, and its bytes are read there."""
    trainer = _node_server(tmp_path, "tcp", nodes2, 0, "trainer")
    infer = _node_server(tmp_path, "tcp", nodes2, 1, "infer")
    replaced = None
    try:
        src, me = _status(trainer)["peer_endpoint"], _status(infer)["peer_endpoint"]
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir()
        with _on(trainer):
            weights.grant(nodes=[me])
            tce.close()
        _publish(trainer, ckpt, 1)
        _publish(trainer, ckpt, 2)
        assert _follow(infer, [src]).version == 2
        reader = subprocess.Popen(
            [sys.executable, "-c", WAITER_ABOVE, JOB, "2"], stdout=subprocess.PIPE, text=True,
            env=dict(os.environ, TCE_SOCKET=infer.socket))
        assert reader.stdout.readline().strip() == "waiting"
        _stop(trainer)
        trainer = None
        replaced = _node_server(tmp_path, "tcp", nodes2, 0, "replaced")
        with _on(replaced):
            weights.grant(nodes=[me])
            tce.close()
        sd = _publish(replaced, ckpt, 3)
        assert reader.stdout.readline().strip() == "1 step3"
        assert reader.wait(timeout=60) == 0
        version, got = _read(infer)
        assert version == 1 and all(torch.equal(got[n], sd[n]) for n in sd)
    finally:
        _stop(*[s for s in (infer, trainer, replaced) if s is not None])


# A reader process on a node: waits for a version above argv[2] there.
WAITER_ABOVE = '''
import sys
from tce.core._session import client
c = client()
print("waiting", flush=True)
v = c.get_version(sys.argv[1], after=int(sys.argv[2]), timeout=90)
print(v.version, v.tag, flush=True)
'''
