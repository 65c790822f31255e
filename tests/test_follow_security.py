"""Following a job's published versions (docs/weights.md#other-nodes)
against other token holders and other local users: who is given a
version's files, and what a follower takes from its sources.

The trainer's server listens on 127.0.0.2, the granted inference node's on
127.0.0.3; a token holder on 127.0.0.1 stands for any other host that has
the cluster token. Every loop is bounded.
"""

from __future__ import annotations

import socket

import torch

import tce
from tce import weights
from tce.core import _knobs
from tce.integrations import safetensors as st

from hostile_peer import AlteringChainNode, connect_with_token, frame, recv_msg
from tce.v1 import tce_pb2 as pb
from test_ring import TOKEN, _ring_server, _status, _stop

JOB = "rl-run"


def _on(server):
    return _knobs.override(socket=server.socket, job=JOB, on_unavailable="raise")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    """One protobuf field, varint or length-delimited: a request as any
    sender may write it, fields its schema no longer has included."""
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _ask(sock: socket.socket, body: int, fields: bytes, reply_cls):
    """Sends a PeerRequest whose `body` field holds `fields`; the reply."""
    request = _field(body, fields)
    sock.sendall(len(request).to_bytes(4, "little") + request)
    return recv_msg(sock, reply_cls)


def _trainer_and_node(tmp_path):
    """The trainer (127.0.0.2) publishes step1; the job's owner grants the
    inference node (127.0.0.3) only."""
    trainer = _ring_server(tmp_path, "tcp", "trainer", listen="127.0.0.2:0")
    node = _ring_server(tmp_path, "tcp", "node", listen="127.0.0.3:0")
    src, me = _status(trainer)["peer_endpoint"], _status(node)["peer_endpoint"]
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    torch.manual_seed(1)
    sd = {"w": torch.randn(64, 64)}
    with _on(trainer):
        weights.grant(nodes=[me])
        st.save_file(sd, ckpt / "model.safetensors", tag="step1")
        weights.publish("step1", [ckpt])
        tce.close()
    return trainer, node, src, me, sd, str(ckpt / "model.safetensors")


def test_a_token_holder_from_an_address_not_granted_is_given_no_version(tmp_path):
    """The job's owner granted the inference node. A token holder on
    another address asks the trainer's node for the job's version and for
    its file's bytes, naming the owner's uid as its reader (what the peer
    protocol once let a follower say): both are refused, naming neither
    the owner nor its uid, and nothing of the file is sent. The granted
    node follows and reads the version."""
    trainer, node, src, me, sd, path = _trainer_and_node(tmp_path)
    try:
        owner = 0  # the trainer's user (the tests run as root)
        holder = connect_with_token(src, TOKEN, "127.0.0.1:7999")
        try:
            # PeerVersion{job, after, wait_ms, reader_uid = the owner's}
            version = _field(1, JOB.encode()) + _field(2, 0) + _field(3, 0) + _field(4, owner)
            reply = _ask(holder, 11, version, pb.PeerVersionReply)
            assert reply.code == 7, reply  # PERMISSION_DENIED
            assert reply.message == (f"node 127.0.0.1:7999 may not follow job '{JOB}' here: "
                                     "no read grant for node 127.0.0.1:7999")
            assert not reply.HasField("tag")
            # PeerReadRange{job, path, offset, length, raw, reader_uid = the owner's, version_tag}
            read = (_field(1, JOB.encode()) + _field(2, path.encode()) + _field(3, 0) + _field(4, 4096)
                    + _field(5, 1) + _field(7, owner) + _field(9, b"step1"))
            got = _ask(holder, 8, read, pb.PeerRangeReply)
            assert got.code == 7 and got.raw_length == 0 and not got.data, got
            assert "no read grant for node 127.0.0.1:7999" in got.message
            assert "belongs to" not in reply.message + got.message
        finally:
            holder.close()
        assert int(_status(trainer).get("version_ranges_served", 0)) == 0
        # The granted node follows; a reader there reads the version.
        with _on(node):
            assert weights.follow(sources=[src]).version == 1
            with weights.open() as w:
                assert torch.equal(dict(w.tensors())["w"], sd["w"])
            tce.close()
        assert int(_status(trainer)["version_ranges_served"]) >= 1
    finally:
        _stop(node, trainer)


def test_a_token_holder_cannot_announce_a_granted_node_from_its_own_address(tmp_path):
    """The grant names the node as the ring's handshake authenticates it:
    announcing the granted node's endpoint from another address is refused
    before any question."""
    trainer, node, src, me, _, _ = _trainer_and_node(tmp_path)
    try:
        try:
            connect_with_token(src, TOKEN, me, source="127.0.0.1")
            raise AssertionError("the trainer's node let 127.0.0.1 speak as " + me)
        except PermissionError:
            pass
    finally:
        _stop(node, trainer)


def test_a_granted_node_is_given_a_versions_weight_files_never_its_optimizer_states(tmp_path):
    """A version of model states and DeepSpeed-named optimizer states: the
    node the owner granted is told of the model file only, and its ask for
    the optimizer's bytes is refused (no byte sent)."""
    trainer = _ring_server(tmp_path, "tcp", "trainer", listen="127.0.0.2:0")
    try:
        src = _status(trainer)["peer_endpoint"]
        step = tmp_path / "ckpt" / "global_step1"
        step.mkdir(parents=True)
        model, optim = step / "mp_rank_00_model_states.pt", step / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
        with _on(trainer):
            weights.grant(nodes=["127.0.0.1:7999"])
            tce.save({"module": {"w": torch.ones(256)}}, model, tag="global_step1")
            tce.save({"exp_avg": torch.ones(1024)}, optim, tag="global_step1")
            assert len(weights.publish("global_step1", [step]).files) == 2
            tce.close()
        node = connect_with_token(src, TOKEN, "127.0.0.1:7999")
        try:
            node.sendall(frame(pb.PeerRequest(version=pb.PeerVersion(job=JOB))))
            reply = recv_msg(node, pb.PeerVersionReply)
            assert reply.code == 0, reply
            assert [f.path for f in reply.tag.files] == [str(model)]
            read = {}
            for path in (optim, model):
                node.sendall(frame(pb.PeerRequest(read_range=pb.PeerReadRange(
                    job=JOB, path=str(path), offset=0, length=64, version_tag="global_step1"))))
                read[path] = recv_msg(node, pb.PeerRangeReply)
            assert read[optim].code == 7 and not read[optim].data, read[optim]  # PERMISSION_DENIED
            assert read[optim].message == (f"{optim} is no weight file of job '{JOB}': optimizer, scheduler "
                                           "and RNG states are not given to following nodes")
            assert read[model].code == 0 and len(read[model].data) == 64
        finally:
            node.close()
    finally:
        _stop(trainer)


def test_a_chain_node_that_changes_the_bytes_it_passes_on_is_caught_by_the_publishers_digest(tmp_path):
    """A node the owner granted, first in the inference node's sources,
    passes on the trainer's version as it is but changes one byte of the
    file's bytes, each range with a CRC of the changed bytes. The inference
    node checks what it was brought against the digest the trainer's node
    computed, brings the file again from the trainer's node, and its reader
    reads the trainer's bytes."""
    trainer = _ring_server(tmp_path, "tcp", "trainer", listen="127.0.0.2:0")
    node = _ring_server(tmp_path, "tcp", "node", listen="127.0.0.3:0")
    src, me = _status(trainer)["peer_endpoint"], _status(node)["peer_endpoint"]
    chain = AlteringChainNode(TOKEN, src)
    try:
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir()
        torch.manual_seed(2)
        sd = {"w": torch.randn(256, 256)}
        with _on(trainer):
            weights.grant(nodes=[me, chain.endpoint])
            st.save_file(sd, ckpt / "model.safetensors", tag="step1")
            weights.publish("step1", [ckpt])
            tce.close()
        with _on(node):
            assert weights.follow(sources=[chain.endpoint, src]).version == 1
            with weights.open() as w:
                got = dict(w.tensors())["w"].clone()
            tce.close()
        assert chain.altered >= 1, chain.errors
        assert torch.equal(got, sd["w"])
        assert (f"from {chain.endpoint} are not those the node that published version 1 digested" in node.log()
                and f"brought again from {src}" in node.log()), node.log()
    finally:
        chain.close()
        _stop(node, trainer)
