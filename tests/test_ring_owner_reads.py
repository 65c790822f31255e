"""What the servers read from storage for a job on their own, with no client
of the job asking (the cooperative restore's reads for another node, a
ranged read's staging, prefetches), they read as the job's owner, whoever
set the job's ring: root setting user a's ring must not make the ring read
for a what only root may. Real users (tests/as_user.py), two real servers
started as root on one shared storage directory, in one ring."""

from __future__ import annotations

import os

import pytest

from helpers import until
from test_security_local import Node, _peer_endpoint, users  # noqa: F401  (users: a fixture)

pytestmark = pytest.mark.security

PEER = ["--peer-listen", "127.0.0.1:0", "--peer-token", "t", "--peer-timeout-ms", "5000"]
JOB = "ja"


def _file(path: str, owner: int, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
    os.chown(path, owner, -1)
    os.chmod(path, 0o600)


def _set_ring_as_root(nodes: list[Node], ring: list[str]) -> None:
    for i, node in enumerate(nodes):
        r = node.run("root", f"""
s = Session(SOCK)
result["ring"] = s.call("SetRing", pb.SetRingRequest(session=s.id, job={JOB!r}, node_rank={i},
                                                     endpoints={ring!r}))[:2]
""")
        assert r["ring"] == ["OK", ""], r


_READ = """
s = Session(SOCK)
got = {}
for name, path in PATHS.items():
    code, msg, r = s.call("ReadRange", pb.ReadRangeRequest(session=s.id, job=JOB, path=path, offset=0,
                                                           length=LENGTH))
    got[name + " range"] = r.data.hex() if r else code
    code, msg, data = s.read(JOB, path)
    got[name + " load"] = data.hex() if code == "OK" else code
result["got"] = got
"""


@pytest.fixture
def ring(users):  # noqa: F811
    """Nodes A and B (shared storage) in the ring of user a's job `ja`, set
    by root on both after a saved into the job there; b's 0600 file and
    a's own 0600 file on storage, neither in any node's memory."""
    a = Node(users, extra_args=PEER)
    b = None
    try:
        b = Node(users, extra_args=PEER, ckpt=a.ckpt)  # shared storage, as a cluster's
        nodes = [a, b]
        _file(a.path("b", "secret.bin"), users["b"], b"B-SECRET" * 512)
        _file(a.path("a", "mine.bin"), users["a"], b"A-OWN..." * 512)
        for i, node in enumerate(nodes):  # a's job on both nodes
            saved = node.run("a", f"""
s = Session(SOCK)
result["save"] = s.save({JOB!r}, {a.path("a", f"claim{i}.bin")!r}, b"x" * 64)["code"]
""")
            assert saved["save"] == "OK", saved
        _set_ring_as_root(nodes, [_peer_endpoint(a), _peer_endpoint(b)])
        yield nodes
    finally:
        if b is not None:
            b.close()
        a.close()


def test_root_setting_a_users_ring_gives_it_no_range_and_no_load_it_may_not_read(ring):
    """a's ranged reads and loads of b's 0600 file, which no node holds,
    have the ring read it from storage: as a, so they get no byte of it
    (each is left to a, who cannot read it either); a's own 0600 file the
    ring reads for it."""
    a, _ = ring
    paths = {"secret": a.path("b", "secret.bin"), "mine": a.path("a", "mine.bin")}
    got = a.run("a", f"JOB = {JOB!r}\nPATHS = {paths!r}\nLENGTH = 4096\n" + _READ)["got"]
    assert got["mine range"] == (b"A-OWN..." * 512).hex(), got  # the ring reads for a
    assert got["mine load"] == (b"A-OWN..." * 512).hex(), got
    assert not any(b"B-SECRET".hex() in v for v in got.values()), got
    assert got["secret range"] in ("NOT_FOUND", "PERMISSION_DENIED"), got
    assert got["secret load"] in ("NOT_FOUND", "PERMISSION_DENIED"), got


def test_root_setting_a_users_ring_prefetches_nothing_for_it_that_it_may_not_read(ring):
    """A prefetch a queues of b's directory, or of b's file by name, on
    both nodes, reads nothing of b's into a's job; a prefetch of a's own
    directory reads a's file."""
    nodes = ring
    secret, mine = nodes[0].path("b", "secret.bin"), nodes[0].path("a", "mine.bin")
    for node in nodes:
        queued = node.run("a", f"""
s = Session(SOCK)
for key, req in (("dir", dict(dir={os.path.dirname(secret)!r})), ("paths", dict(paths=[{secret!r}])),
                 ("mine", dict(dir={os.path.dirname(mine)!r}))):
    result[key] = s.call("Prefetch", pb.PrefetchRequest(session=s.id, job={JOB!r}, **req))[2].queued
""")
        assert queued == {"uid": queued["uid"], "dir": True, "paths": True, "mine": True}, queued
    for node in nodes:  # the three prefetches ran
        until(lambda node=node: _prefetches_done(node.server.log()) >= 3, what="the prefetches")
    cached = {}
    for i, node in enumerate(nodes):
        r = node.run("a", f"""
s = Session(SOCK)
for name, path in (("secret", {secret!r}), ("mine", {mine!r})):
    code, msg, r = s.call("Lookup", pb.LookupRequest(session=s.id, job={JOB!r}, path=path, lease=True,
                                                     local_only=True))
    result[name] = code
""")
        cached[i] = (r["secret"], r["mine"])
    assert sorted(cached.values()) == [("NOT_FOUND", "NOT_FOUND"), ("NOT_FOUND", "OK")], cached


def _prefetches_done(log: str) -> int:
    """Prefetches of job `ja` that ended (read what they could, or failed)."""
    return sum(1 for line in log.splitlines()
               if f"job={JOB}" in line and ("prefetched " in line or "prefetch of " in line))
