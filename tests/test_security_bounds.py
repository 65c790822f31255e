"""What one allowed user can make the server hold beyond its buffers, with
real users against a real server: records (tags, job names, read grants,
version leases) within metadata_budget and their per-job and per-uid
bounds, blocked calls shared per uid and ended when their client goes, a
revoked grant ending the reader's lease, and the server's own files
readable by the server alone."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys

import pytest

from helpers import until
from test_security_local import AS_USER, USERS, Node, users  # noqa: F401  (users: a fixture)

pytestmark = pytest.mark.timeout(600)  # a hang bound only

SETUP = """
s = Session(SOCK)
def tag(name, files, world=1):
    t = pb.TagInfo(job=JOB, tag=name, world_size=world,
                   files=[pb.TagFile(rank=r, path=p, size=n) for r, p, n in files])
    return s.call("CommitTag", pb.CommitTagRequest(session=s.id, tag=t))
def status():
    return s.call("Status", pb.StatusRequest(session=s.id))[2]
"""


def test_one_users_records_stay_within_its_share_and_others_still_save(users):
    """The audit's flood: tags naming thousands of files, grants claiming new
    job names with a thousand uids, leases on a version not in memory. Each
    is refused or bounded, the server's records stay within its share of
    metadata_budget, and another user saves, tags and reads as before."""
    node = Node(users, extra_args=["--metadata-budget", "4MiB", "--metadata-share-per-uid", "50",
                                   "--max-tags-per-job", "16", "--max-jobs-per-uid", "20",
                                   "--max-grants-per-job", "64", "--max-leases-per-session", "100"])
    try:
        a, b = users["a"], users["b"]
        mine = node.path("a", "m.pt")
        r = node.run("a", f"JOB = 'ja'\n" + SETUP + f"""
forged = [(0, "/forged/%d" % i, 1) for i in range(30000)]
result["forged"] = tag("t0", forged)[:2]
result["save"] = s.save(JOB, {mine!r}, b"m" * 4096, tag="t")["code"]
# Every tag names the saved file, and 3000 of another node's rank.
codes, most = {{}}, 0
for i in range(200):
    files = [(0, {mine!r}, 4096)] + [(1, "/c/other/%d/%s" % (i, "x" * 100 + str(j)), 1) for j in range(3000)]
    code, msg, _ = tag("step%d" % i, files, world=2)
    codes[code] = codes.get(code, 0) + 1
    most = max(most, int(status().metadata_bytes))
result["tags"] = codes
result["most"] = most
code, msg, r = s.call("ListTags", pb.ListTagsRequest(session=s.id, job=JOB))
result["listed"] = [t.tag for t in r.tags]
# Grants: a thousand uids at once, then new job names.
code, msg, _ = s.call("GrantRead", pb.GrantReadRequest(session=s.id, job=JOB, uids=list(range(5000, 6024))))
result["big_grant"] = [code, msg]
grants = []
for i in range(40):
    code, msg, _ = s.call("GrantRead", pb.GrantReadRequest(session=s.id, job="g%d" % i, uids=list(range(5000, 5060))))
    grants.append([code, msg])
result["grants"] = grants
# Leases on the newest version, whose second file is on another node.
code, msg, g = s.call("AcquireVersion", pb.AcquireVersionRequest(session=s.id, job=JOB))
leases = 1 if code == "OK" else 0
for i in range(5000):
    code, msg, g = s.call("AcquireVersion", pb.AcquireVersionRequest(session=s.id, job=JOB))
    if code != "OK":
        result["lease_refused"] = [code, msg]
        break
    leases += 1
result["leases"] = leases
st = status()
result["end"] = [int(st.metadata_bytes), int(st.metadata_budget)]
""", timeout=300)
        assert r["forged"] == ["NOT_FOUND", "tag 't0' names no file job 'ja' holds on this server: a tag is "
                               "recorded on a node that saved files of it"]
        assert r["save"] == "OK"
        # Every tag was recorded, the oldest forgotten to keep within the bounds.
        assert r["tags"] == {"OK": 200}
        assert len(r["listed"]) <= 16 and r["listed"][-1] == "step199"
        share = 2 << 20
        assert 0 < r["most"] <= share, r["most"]
        assert r["big_grant"] == ["RESOURCE_EXHAUSTED",
                                  "job 'ja' may hold at most 64 granted or revoked uids, gids and nodes "
                                  "(max_grants_per_job); it holds 0 and this call names 1024 more"]
        refused = [g for g in r["grants"] if g[0] != "OK"]
        assert refused, r["grants"]
        assert all(g[0] == "RESOURCE_EXHAUSTED" for g in refused), refused
        assert any("max_jobs_per_uid" in g[1] or "metadata_share_per_uid" in g[1] for g in refused), refused
        assert r["lease_refused"][0] == "RESOURCE_EXHAUSTED"
        assert r["leases"] == 50  # each: the version, and its one file here: 2 of the session's 100
        assert r["end"][0] <= share and r["end"][1] == 4 << 20

        # Another user is not starved of anything.
        theirs = node.path("b", "m.pt")
        r = node.run("b", "JOB = 'jb'\n" + SETUP + f"""
result["save"] = s.save(JOB, {theirs!r}, b"b" * 4096, tag="s1")["code"]
result["tag"] = tag("s1", [(0, {theirs!r}, 4096)])[:2]
result["acquire"] = s.call("AcquireVersion", pb.AcquireVersionRequest(session=s.id, job=JOB))[:2]
code, msg, data = s.read(JOB, {theirs!r})
result["read"] = [code, data == b"b" * 4096]
""")
        assert r == {"uid": b, "save": "OK", "tag": ["OK", ""], "acquire": ["OK", ""], "read": ["OK", True]}
    finally:
        node.close()


def test_a_revoked_grant_ends_the_readers_lease(users):
    node = Node(users)
    try:
        a, b = users["a"], users["b"]
        path = node.path("a", "policy.pt")
        r = node.run("a", "JOB = 'ja'\n" + SETUP + f"""
result["save"] = s.save(JOB, {path!r}, b"p" * 4096, tag="s1")["code"]
result["tag"] = tag("s1", [(0, {path!r}, 4096)])[0]
result["grant"] = s.call("GrantRead", pb.GrantReadRequest(session=s.id, job=JOB, uids=[{b}]))[0]
""")
        assert r == {"uid": a, "save": "OK", "tag": "OK", "grant": "OK"}
        reader = _Background("b", node, """
s = Session(SOCK)
code, msg, g = s.call("AcquireVersion", pb.AcquireVersionRequest(session=s.id, job="ja", lease_s=60))
renewed = s.call("RenewVersion", pb.RenewVersionRequest(session=s.id, lease_id=g.lease_id, lease_s=60))[:2]
say({"acquire": code, "renewed": renewed})
input()  # the owner revokes now
say({"after": s.call("RenewVersion", pb.RenewVersionRequest(session=s.id, lease_id=g.lease_id, lease_s=60))[:2],
     "lease": g.lease_id,
     "again": s.call("AcquireVersion", pb.AcquireVersionRequest(session=s.id, job="ja"))[:2]})
""")
        try:
            assert reader.read() == {"acquire": "OK", "renewed": ["OK", ""]}
            r = node.run("a", f"""
s = Session(SOCK)
result["revoke"] = s.call("GrantRead", pb.GrantReadRequest(session=s.id, job="ja", uids=[{b}], revoke=True))[0]
result["leases"] = int(s.call("Status", pb.StatusRequest(session=s.id))[2].version_leases)
""")
            assert r["revoke"] == "OK"
            assert r["leases"] == 0  # the reader's lease ended with the grant
            reader.send("")
            r = reader.read()
            assert r["after"] == ["NOT_FOUND", f"no version lease {r['lease']} in this session (released, "
                                  "expired, revoked, or never granted)"]
            assert r["again"] == ["PERMISSION_DENIED", f"uid {b} may not read the published versions of job "
                                  f"'ja' (it belongs to uid {a}): the owner revoked the read grant of uid {b}"]
        finally:
            reader.kill()
    finally:
        node.close()


def test_blocked_calls_are_shared_per_uid_and_end_when_their_client_goes(users):
    """One user parks its share of waits on jobs nobody owns: its next is
    refused, another user's still waits; the places come back when the
    parking process dies, and when its calls are cancelled with the
    session still open."""
    node = Node(users, extra_args=["--max-waits", "4", "--max-waits-per-uid", "2"])
    # Parks two waits, again while one is refused (the places of a process
    # that just died may not be given back yet), until both wait: then a
    # third is refused.
    park = """
import time
s = Session(SOCK)
def park(job):
    return s.stub.GetVersion.future(pb.GetVersionRequest(session=s.id, job=job, timeout_s=600), timeout=600)
futures = [None, None]
deadline = time.monotonic() + 60  # a hang bound only
while time.monotonic() < deadline:
    for i, f in enumerate(futures):
        if f is None or f.done():
            futures[i] = park("nobody%d" % i)
    third = s.call("GetVersion", pb.GetVersionRequest(session=s.id, job="nobody9", timeout_s=0.001))[:2]
    if third[0] == "RESOURCE_EXHAUSTED" and not any(f.done() for f in futures):
        break
    time.sleep(0.02)
say({"third": third, "parked": not any(f.done() for f in futures)})
if input() == "cancel":
    for f in futures:
        f.cancel()
    say({"cancelled": True})
    input()
"""
    try:
        a = users["a"]
        parked = _Background("a", node, park)
        try:
            assert parked.read() == {"third": ["RESOURCE_EXHAUSTED", "this user already runs 2 blocked calls "
                                               "(max_waits_per_uid=2): try again later"], "parked": True}
            # Another uid still waits (and is answered at its timeout).
            r = node.run("b", """
s = Session(SOCK)
result["wait"] = s.call("GetVersion", pb.GetVersionRequest(session=s.id, job="jb", timeout_s=0.2))[0]
""")
            assert r["wait"] == "DEADLINE_EXCEEDED"
        finally:
            parked.kill()  # SIGKILL: its session and channel close
        # Its places came back: two more park.
        again = _Background("a", node, park)
        try:
            assert again.read()["parked"]
            again.send("cancel")  # the calls cancelled, the session kept open
            assert again.read() == {"cancelled": True}
            third = _Background("a", node, park)  # a new process of the same uid gets both places
            try:
                assert third.read()["parked"]
            finally:
                third.kill()
        finally:
            again.kill()
        assert a
    finally:
        node.close()


def test_the_state_dir_and_its_database_are_the_servers_alone(users, tmp_path):
    node = Node(users)
    try:
        state = os.path.join(node.base, "state")
        until(lambda: os.path.exists(os.path.join(state, "tce.db")), what="the metadata database")
        assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
        for name in os.listdir(state):
            if name.startswith("tce.db"):
                mode = stat.S_IMODE(os.stat(os.path.join(state, name)).st_mode)
                assert mode & 0o077 == 0, (name, oct(mode))
    finally:
        node.close()
    # A database an earlier server left readable is the server's alone again.
    node = Node(users)
    try:
        state = os.path.join(node.base, "state")
        db = os.path.join(state, "tce.db")
        until(lambda: os.path.exists(db), what="the metadata database")
        node.server.stop()
        os.chmod(db, 0o644)
        os.chmod(state, 0o755)
        node.server.start()
        assert stat.S_IMODE(os.stat(db).st_mode) == 0o600
    finally:
        node.close()


class _Background:
    """A snippet run as `user` in its own process (tests/as_user.py), which
    says JSON lines (``say``) and reads lines from the test (``input``)."""

    def __init__(self, user: str, node: Node, code: str) -> None:
        prelude = ("import json, sys\n"
                   "def say(obj):\n    print(json.dumps(obj), flush=True)\n"
                   f"SOCK = {node.socket!r}\n")
        # as_user.py reads the whole snippet first: the test's lines come
        # through a pipe the snippet opens itself.
        self.to_r, self.to_w = os.pipe()
        self.proc = subprocess.Popen([sys.executable, AS_USER, USERS[user]], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     pass_fds=(self.to_r,))
        self.proc.stdin.write(prelude + f"sys.stdin = open({self.to_r}, closefd=False)\n" + code)
        self.proc.stdin.close()

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        assert line, f"the snippet ended: {self.proc.stderr.read()}"
        return json.loads(line)

    def send(self, line: str) -> None:
        os.write(self.to_w, (line + "\n").encode())

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for fd in (self.to_r, self.to_w):
            try:
                os.close(fd)
            except OSError:
                pass
