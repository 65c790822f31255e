"""Object storage and local users: each object is its owner's.

Real users (tests/test_security_local.py's), real credentials (each client
drops to its user before it connects, tests/as_user.py), a real tce-server
started here as root with an object root on moto's S3 server. Under a
directory root the kernel keeps bob out of alice's 0700 directory; under an
object root the server does, from the owner each object records.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from tce.tools._moto import credentials_env
from tce.tools._server import LocalServer
from test_security_local import GROUP, as_user, users  # noqa: F401 (users: the fixture)

pytestmark = [pytest.mark.s3, pytest.mark.security]

ROOT = "/ckpt"  # never created: an object root has no directory


class Node:
    """A root server whose /ckpt is s3://bucket/run1 on moto; alice (a) and
    bob (b) are allowed. Restartable on a new, empty state dir: what it
    knows of owners then comes from the bucket alone."""

    def __init__(self, users: dict, moto, bucket: str, *extra: str) -> None:
        self.users, self.moto, self.bucket, self.extra = users, moto, bucket, list(extra)
        self.base = tempfile.mkdtemp(prefix="tce-s3u-")
        os.chmod(self.base, 0o755)  # users traverse it; the socket dir inside is the gate
        self.socket = os.path.join(self.base, "run", "tce.sock")
        self.starts = 0
        self.server: LocalServer | None = None

    def start(self) -> "Node":
        self.starts += 1
        allowed = f"{self.users['a']},{self.users['b']},0"
        self.server = LocalServer(
            socket_path=self.socket, memory_budget="256MiB",
            storage_roots=[f"{ROOT}=s3://{self.bucket}/run1"],
            state_dir=os.path.join(self.base, f"state{self.starts}"),
            log_path=os.path.join(self.base, f"tce-server{self.starts}.log"),
            extra_args=["--allowed-uids", allowed, "--socket-group", GROUP,
                        "--s3-endpoint", self.moto.endpoint, "--s3-path-style", "true", *self.extra],
            env={**os.environ, **credentials_env()}).start()
        return self

    def stop(self) -> None:
        code = self.server.stop()
        assert code == 0, f"tce-server exited with {code}:\n{self.server.log()}"

    def run(self, user: str, code: str) -> dict:
        return as_user(user, f"SOCK = {self.socket!r}\n" + code)

    def close(self) -> None:
        if self.server.proc.poll() is None:
            self.stop()
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture
def node(users, moto, s3_bucket):  # noqa: F811 (users: the fixture)
    n = Node(users, moto, s3_bucket).start()
    yield n
    n.close()


ALICE = bytes(range(256)) * 64  # what alice saves: 16 KiB
BOB = b"B" * 4096


def _bobs_tries(path: str, etag: str) -> str:
    """A snippet: bob, with a job of his own, lists alice's directory, loads
    her file (and reads a range of it on her object's ETag, as a DCP load
    that pinned it would, into his range buffer), removes it from the bucket
    and saves his bytes at her path."""
    return f"""
s = Session(SOCK)
code, msg, listing = s.call("List", pb.ListRequest(session=s.id, job="jb", storage_dir={os.path.dirname(path)!r}))
result["list"] = [code, msg, [f.path for f in listing.files] if listing else None]
code, msg, data = s.read("jb", {path!r})
result["load"] = [code, msg, len(data)]
fd, size = s.range_buffer()
code, msg, _ = s.call("ReadRange", pb.ReadRangeRequest(
    session=s.id, job="jb", path={path!r}, offset=0, length=4096, into_buffer=True, buffer_offset=0,
    expect_etag={etag!r}, expect_size={len(ALICE)}))
with mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) as m:
    result["range_buffer_has_hers"] = bytes(m[:4096]) == {ALICE[:4096]!r}
os.close(fd)
result["range"] = [code, msg]
code, msg, _ = s.call("Remove", pb.RemoveRequest(session=s.id, job="jb", path={path!r}, from_storage=True))
result["remove"] = [code, msg]
saved = s.save("jb", {path!r}, {BOB!r})
result["overwrite"] = [saved["code"], saved["message"]]
"""


def test_another_uid_cannot_list_load_remove_or_replace_a_users_objects(node, users, moto, s3_bucket):
    path = f"{ROOT}/a/model.pt"
    key = "run1/a/model.pt"
    url = f"s3://{s3_bucket}/{key}"
    r = node.run("a", f"""
s = Session(SOCK)
result["save"] = s.save("ja", {path!r}, {ALICE!r})["code"]
result["wait"] = s.call("Wait", pb.WaitRequest(session=s.id, job="ja", paths=[{path!r}], timeout_s=60))[0]
""")
    assert r == {"uid": users["a"], "save": "OK", "wait": "OK"}
    s3 = moto.boto3()
    head = s3.head_object(Bucket=s3_bucket, Key=key)
    assert head["Metadata"]["tce-uid"] == str(users["a"])  # recorded with the object
    a, b = users["a"], users["b"]
    denied = f"uid {b} may not %s {url}: it belongs to uid {a}"
    for start in range(2):  # then on a restarted server with no state: the owner comes from the bucket
        if start:
            node.stop()
            node.start()
        r = node.run("b", _bobs_tries(path, head["ETag"].strip('"')))
        assert r["list"] == ["OK", "", []], r
        assert r["load"] == ["PERMISSION_DENIED", denied % "read", 0]
        assert r["range"] == ["PERMISSION_DENIED", denied % "read"]
        assert not r["range_buffer_has_hers"]
        assert r["remove"] == ["PERMISSION_DENIED", denied % "delete"]
        assert r["overwrite"] == ["PERMISSION_DENIED", denied % "replace"]
        # Alice's next load (from the bucket: not in the cache) is hers.
        r = node.run("a", f"""
s = Session(SOCK)
s.call("Remove", pb.RemoveRequest(session=s.id, job="ja", path={path!r}))
code, msg, data = s.read("ja", {path!r})
result["load"] = [code, msg, data == {ALICE!r}]
code, msg, listing = s.call("List", pb.ListRequest(session=s.id, job="ja", storage_dir="{ROOT}/a"))
result["list"] = [code, [f.path for f in listing.files]]
""")
        assert r["load"] == ["OK", "", True], r
        assert r["list"] == ["OK", [path]]
        assert s3.get_object(Bucket=s3_bucket, Key=key)["Body"].read() == ALICE


def test_an_object_with_no_owner_recorded_is_every_users(node, users, moto, s3_bucket):
    """Written by an earlier server or another tool with the bucket's keys
    (no tce-uid): every allowed uid may load and list it, and a save over it
    records its saver, whose it is from then on."""
    s3 = moto.boto3()
    s3.put_object(Bucket=s3_bucket, Key="run1/old/w.pt", Body=ALICE)
    path = f"{ROOT}/old/w.pt"
    for user in ("a", "b"):
        r = node.run(user, f"""
s = Session(SOCK)
code, msg, data = s.read("j{user}", {path!r})
result["load"] = [code, msg, data == {ALICE!r}]
code, msg, listing = s.call("List", pb.ListRequest(session=s.id, job="j{user}", storage_dir="{ROOT}/old"))
result["list"] = [code, [f.path for f in listing.files]]
""")
        assert r["load"] == ["OK", "", True] and r["list"] == ["OK", [path]], (user, r)
    r = node.run("b", f"""
s = Session(SOCK)
s.call("Remove", pb.RemoveRequest(session=s.id, job="jb", path={path!r}))
result["save"] = s.save("jb", {path!r}, {BOB!r})["code"]
result["wait"] = s.call("Wait", pb.WaitRequest(session=s.id, job="jb", paths=[{path!r}], timeout_s=60))[0]
""")
    assert r["save"] == "OK" and r["wait"] == "OK", r
    assert s3.head_object(Bucket=s3_bucket, Key="run1/old/w.pt")["Metadata"]["tce-uid"] == str(users["b"])
    r = node.run("a", f"""
s = Session(SOCK)
s.call("Remove", pb.RemoveRequest(session=s.id, job="ja", path={path!r}))
result["load"] = list(s.read("ja", {path!r})[:2])
""")
    url = f"s3://{s3_bucket}/run1/old/w.pt"
    assert r["load"] == ["PERMISSION_DENIED", f"uid {users['a']} may not read {url}: it belongs to uid {users['b']}"]


def test_a_tag_naming_another_users_object_does_not_get_it_deleted(users, moto, s3_bucket):  # noqa: F811
    """storage_keep_last deletes an old tag's objects as the tag's job's
    owner: bob's tag that names alice's object leaves it where it is."""
    node = Node(users, moto, s3_bucket, "--storage-keep-last", "1").start()
    try:
        hers, his = f"{ROOT}/a/model.pt", f"{ROOT}/b/own.pt"
        r = node.run("a", f"""
s = Session(SOCK)
result["save"] = s.save("ja", {hers!r}, {ALICE!r})["code"]
result["wait"] = s.call("Wait", pb.WaitRequest(session=s.id, job="ja", paths=[{hers!r}], timeout_s=60))[0]
""")
        assert r["save"] == "OK" and r["wait"] == "OK", r
        r = node.run("b", f"""
import time
s = Session(SOCK)
result["save"] = s.save("jb", {his!r}, {BOB!r})["code"]
result["wait"] = s.call("Wait", pb.WaitRequest(session=s.id, job="jb", paths=[{his!r}], timeout_s=60))[0]
# t1 names his file and hers as another node's rank 1 (a tag names files its job holds here)
for tag, files in (("t1", [(0, {his!r}, {len(BOB)}), (1, {hers!r}, {len(ALICE)})]), ("t2", [(0, {his!r}, {len(BOB)})])):
    info = pb.TagInfo(job="jb", tag=tag, world_size=2, files=[pb.TagFile(rank=r, path=p, size=n) for r, p, n in files])
    result[tag] = s.call("CommitTag", pb.CommitTagRequest(session=s.id, tag=info))[0]
for _ in range(3000):  # retention runs on a thread of its own: until it forgot t1
    code, _, tags = s.call("ListTags", pb.ListTagsRequest(session=s.id, job="jb"))
    result["tags"] = [t.tag for t in tags.tags] if tags else code
    if result["tags"] == ["t2"]:
        break
    time.sleep(0.02)
""")
        assert r == {"uid": users["b"], "save": "OK", "wait": "OK", "t1": "OK", "t2": "OK", "tags": ["t2"]}, r
        s3 = moto.boto3()
        assert s3.get_object(Bucket=s3_bucket, Key="run1/a/model.pt")["Body"].read() == ALICE
        assert "left s3://" in node.server.log() and f"it belongs to uid {users['a']}" in node.server.log()
    finally:
        node.close()
