"""Following a job across nodes, as real local users (tests/as_user.py).

Two servers as deployed (tests/test_security_local.py's Node), ring servers
on 127.0.0.2 (the trainer's node) and 127.0.0.3 (an inference node). On
the trainer's node `tce-test-a` owns job "ja"; the inference node's users
follow it. A uid number means nothing across nodes: `tce-test-a` on the
inference node is not the job's owner there.
"""

from __future__ import annotations

import pytest

from test_ring import TOKEN
from test_security_local import Node, users  # noqa: F401  (the fixture)

pytestmark = pytest.mark.security

JOB = "ja"
DATA = bytes(range(256)) * 64

GET = """
s = Session(SOCK)
code, msg, v = s.call("GetVersion", pb.GetVersionRequest(session=s.id, job="ja", after={after},
                                                         timeout_s={timeout}))
result["get"] = [code, msg, v.tag.version if v else 0]
"""

FOLLOW = """
s = Session(SOCK)
code, msg, r = s.call("Follow", pb.FollowRequest(session=s.id, job="ja", sources=[{src!r}]))
result["follow"] = [code, msg, r.newest.version if r else 0]
"""


def _ring_node(users, host: str) -> tuple[Node, str]:
    node = Node(users, extra_args=["--peer-listen", f"{host}:0", "--peer-token", TOKEN])
    code, _, st = _status(node)
    assert code == "OK"
    return node, st


def _status(node: Node) -> tuple[str, str, str]:
    r = node.run("root", """
s = Session(SOCK)
code, msg, st = s.call("Status", pb.StatusRequest(session=s.id))
result["status"] = [code, msg, st.peer_endpoint if st else ""]
""")
    return tuple(r["status"])


def _publish(trainer: Node, step: int, *, grant: dict | None = None) -> dict:
    """User a saves and publishes step<step> of "ja" on the trainer's node,
    first granting `grant` (GrantRead's fields)."""
    path = trainer.path("a", "policy.pt")
    return trainer.run("a", f"""
s = Session(SOCK)
if {grant!r} is not None:
    code, msg, _ = s.call("GrantRead", pb.GrantReadRequest(session=s.id, job="ja", **{grant!r}))
    result["grant"] = [code, msg]
result["save"] = s.save("ja", {path!r}, {DATA!r}, tag="step{step}")["code"]
tag = pb.TagInfo(job="ja", tag="step{step}", world_size=1,
                 files=[pb.TagFile(rank=0, path={path!r}, size={len(DATA)})])
code, msg, t = s.call("CommitTag", pb.CommitTagRequest(session=s.id, tag=tag))
result["publish"] = [code, msg, t.tag.version if t else 0]
""")


@pytest.fixture
def nodes(users):  # noqa: F811
    trainer, src = _ring_node(users, "127.0.0.2")
    try:
        follower, me = _ring_node(users, "127.0.0.3")
    except BaseException:
        trainer.close()
        raise
    yield trainer, follower, src, me
    follower.close()
    trainer.close()


def test_the_sources_owner_uid_owns_nothing_on_the_follower(nodes, users):
    """User b follows "ja" and reads it. User a of the inference node has
    the uid that owns the job on the trainer's node, and nothing of it
    here: it may not read the versions (it does not follow them), publish
    a version of its own into the job, or save into it."""
    trainer, follower, src, me = nodes
    r = _publish(trainer, 1, grant={"nodes": [me], "uids": [users["b"]]})
    assert r["grant"] == ["OK", ""] and r["publish"] == ["OK", "", 1], r
    assert follower.run("b", FOLLOW.format(src=src))["follow"] == ["OK", "", 1]
    assert follower.run("b", GET.format(after=0, timeout=0))["get"] == ["OK", "", 1]
    a = users["a"]
    path = follower.path("a", "forged.pt")
    r = follower.run("a", GET.format(after=0, timeout=0) + f"""
result["save"] = s.save("ja", {path!r}, b"forged")["code"]
tag = pb.TagInfo(job="ja", tag="forged", world_size=1, files=[pb.TagFile(rank=0, path={path!r}, size=6)])
code, msg, t = s.call("CommitTag", pb.CommitTagRequest(session=s.id, tag=tag))
result["publish"] = [code, msg]
""")
    assert r["get"][0] == "PERMISSION_DENIED", r
    assert r["get"][1].startswith(f"uid {a} may not read the published versions of job 'ja' (it belongs to uid 0)")
    assert r["save"] == "PERMISSION_DENIED"
    assert r["publish"] == ["PERMISSION_DENIED",
                            f"uid {a} may not commit tag 'forged' into job 'ja': job 'ja' belongs to uid 0"]


def test_each_user_that_follows_a_job_reads_its_new_versions(nodes, users):
    """Users b and a of the inference node both follow "ja" (b first). The
    job's owner takes back the uid grant it gave b on its own node: the node
    it granted still follows, so a's wait is answered with version 2 (the
    node asks as itself, not as the user that followed first)."""
    trainer, follower, src, me = nodes
    b = users["b"]
    assert _publish(trainer, 1, grant={"nodes": [me], "uids": [b]})["publish"][0] == "OK"
    assert follower.run("b", FOLLOW.format(src=src))["follow"] == ["OK", "", 1]
    assert follower.run("a", FOLLOW.format(src=src))["follow"] == ["OK", "", 1]
    r = _publish(trainer, 2, grant={"uids": [b], "revoke": True})
    assert r["publish"] == ["OK", "", 2], r
    assert follower.run("a", GET.format(after=1, timeout=20))["get"] == ["OK", "", 2]
    assert follower.run("b", GET.format(after=1, timeout=20))["get"] == ["OK", "", 2]


PER_UID = 8  # max_follows_per_uid's default


def test_one_user_cannot_take_every_follow_of_the_node(nodes, users):
    """User a follows as many jobs as one user may (max_follows_per_uid);
    one more is refused, naming the setting, while user b still follows
    that job, and a job a follows already is followed again."""
    trainer, follower, src, me = nodes
    jobs = [f"j{i}" for i in range(PER_UID + 1)]
    paths = [trainer.path("a", f"{j}.pt") for j in jobs]
    r = trainer.run("a", f"""
s = Session(SOCK)
for job, path in zip({jobs!r}, {paths!r}):
    s.call("GrantRead", pb.GrantReadRequest(session=s.id, job=job, nodes=[{me!r}]))
    s.save(job, path, b"w" * 64, tag="step1")
    tag = pb.TagInfo(job=job, tag="step1", world_size=1, files=[pb.TagFile(rank=0, path=path, size=64)])
    result[job] = s.call("CommitTag", pb.CommitTagRequest(session=s.id, tag=tag))[0]
""")
    assert all(r[j] == "OK" for j in jobs), r
    follow = """
s = Session(SOCK)
for job in {jobs!r}:
    code, msg, _ = s.call("Follow", pb.FollowRequest(session=s.id, job=job, sources=[{src!r}]))
    result[job] = [code, msg]
"""
    r = follower.run("a", follow.format(jobs=jobs + jobs[:1], src=src))
    assert all(r[j] == ["OK", ""] for j in jobs[:PER_UID]), r
    assert r[jobs[-1]] == ["RESOURCE_EXHAUSTED",
                           f"uid {users['a']} follows {PER_UID} jobs already (max_follows_per_uid)"]
    r = follower.run("b", follow.format(jobs=jobs[-1:], src=src))
    assert r[jobs[-1]] == ["OK", ""]
