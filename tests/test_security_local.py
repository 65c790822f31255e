"""Local users: what one uid on the node can do to another's checkpoints.

Real users (useradd), real credentials: each client runs in its own process
that drops to its user before it connects (tests/as_user.py), against a real
tce-server started here as root. `tce-test-a` and `tce-test-b` are allowed
(allowed_uids) and own separate jobs; `tce-test-c` may reach the sockets
(socket_group) but is not allowed; `tce-test-d` is in neither.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile

import pytest

from as_user import Session
from helpers import Blocker, until
from tce.tools._server import LocalServer
from tce.v1 import tce_pb2 as pb

pytestmark = pytest.mark.security

GROUP = "tce-test"
USERS = {"a": "tce-test-a", "b": "tce-test-b", "c": "tce-test-c", "d": "tce-test-d"}
AS_USER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "as_user.py")


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


@pytest.fixture(scope="session")
def users():
    """Throwaway users (idempotent); removed at the end. Needs root."""
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("needs root and useradd to create local users")
    subprocess.run(["groupadd", "-f", GROUP], check=True)
    made = []
    for key, name in USERS.items():
        try:
            pwd.getpwnam(name)
        except KeyError:
            group = [] if key == "d" else ["-g", GROUP]
            _run("useradd", "-M", "-N", "-s", "/usr/sbin/nologin", *group, name)
            made.append(name)
    yield {key: pwd.getpwnam(name).pw_uid for key, name in USERS.items()}
    for name in made:
        subprocess.run(["userdel", name], capture_output=True)
    subprocess.run(["groupdel", GROUP], capture_output=True)


def as_user(user: str, code: str, timeout: float = 60) -> dict:
    """Run `code` (see tests/as_user.py) as `user`; its `result` dict."""
    p = subprocess.run([sys.executable, AS_USER, USERS.get(user, user)], input=code,
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"as {user}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return json.loads(p.stdout.strip().splitlines()[-1])


class Node:
    """A server as deployed: its socket directory made by the server itself
    (0750, group tce-test), one 0700 checkpoint directory per user."""

    def __init__(self, users: dict, *, extra_args=(), prefix=(), budget="256MiB",
                 ckpt: str | None = None) -> None:
        self.base = tempfile.mkdtemp(prefix="tce-sec-")
        os.chmod(self.base, 0o755)  # users traverse it; the socket dir inside is the gate
        self.ckpt = ckpt or os.path.join(self.base, "ckpt")  # given: another node's (shared storage)
        if not ckpt:
            os.mkdir(self.ckpt)
            os.chmod(self.ckpt, 0o755)
            for key in ("a", "b"):
                d = os.path.join(self.ckpt, key)
                os.mkdir(d, 0o700)
                os.chown(d, users[key], -1)
        self.socket = os.path.join(self.base, "run", "tce.sock")
        allowed = ",".join(str(users[k]) for k in ("a", "b")) + ",0"
        self.server = LocalServer(
            socket_path=self.socket, memory_budget=budget, storage_roots=[self.ckpt],
            state_dir=os.path.join(self.base, "state"),
            log_path=os.path.join(self.base, "tce-server.log"),
            extra_args=["--allowed-uids", allowed, "--socket-group", GROUP, *extra_args])
        self.server.args = [*prefix, *self.server.args]
        try:
            self.server.start()
        except BaseException:
            shutil.rmtree(self.base, ignore_errors=True)
            raise

    def path(self, user: str, name: str) -> str:
        return os.path.join(self.ckpt, user, name)

    def run(self, user: str, code: str, **kw) -> dict:
        return as_user(user, f"SOCK = {self.socket!r}\n" + code, **kw)

    def close(self) -> None:
        code = self.server.stop()
        shutil.rmtree(self.base, ignore_errors=True)
        assert code == 0, f"tce-server exited with {code}:\n{self.server.log()}"


@pytest.fixture
def node(users):
    n = Node(users)
    yield n
    n.close()


def test_the_sockets_admit_the_group_only_and_sessions_the_allowed_uids_only(node, users):
    run_dir = os.path.dirname(node.socket)
    st = os.stat(run_dir)
    assert stat.S_IMODE(st.st_mode) == 0o750 and st.st_gid == _gid(GROUP)
    for path in (node.socket, node.socket + ".fd"):
        st = os.stat(path)
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == _gid(GROUP), path
    # Outside the group: the socket directory itself is closed.
    r = node.run("d", """
try:
    Session(SOCK)
except PermissionError as e:
    result["error"] = e.strerror
""")
    assert r["error"] == "Permission denied"
    # In the group, not allowed: refused at the handshake.
    r = node.run("c", """
try:
    Session(SOCK)
except Refused as e:
    result["code"], result["message"] = e.code, e.message
""")
    assert r["code"] == "PERMISSION_DENIED"
    assert r["message"] == f"peer uid {users['c']} is not allowed to use this server (allowed_uids)"


def test_a_uid_outside_allowed_uids_lists_nothing(node, users):
    path = node.path("a", "x.pt")
    r = node.run("a", f"""
s = Session(SOCK)
result["save"] = s.save("ja", {path!r}, b"A" * 4096)["code"]
result["tag"] = s.call("CommitTag", pb.CommitTagRequest(session=s.id, tag=pb.TagInfo(
    job="ja", tag="t1", world_size=1, files=[pb.TagFile(rank=0, path={path!r}, size=4096)])))[0]
""")
    assert r == {"uid": users["a"], "save": "OK", "tag": "OK"}
    # No session to be had, and the control socket closes its connections at
    # once: every RPC fails, whatever session it names, and returns nothing.
    r = node.run("c", """
stub = pb_grpc.CacheStub(grpc.insecure_channel("unix:" + SOCK))
out = {}
for name, req in [("List", pb.ListRequest()), ("Status", pb.StatusRequest()),
                  ("ListTags", pb.ListTagsRequest(job="ja")),
                  ("List", pb.ListRequest(session="0" * 32))]:
    try:
        resp = getattr(stub, name)(req, timeout=10)
        out[name] = ["OK", str(resp)]
    except grpc.RpcError as e:
        out[name] = [e.code().name, e.details()]
result.update(out)
""")
    for name in ("List", "Status", "ListTags"):
        assert r[name][0] == "UNAVAILABLE", (name, r[name])
    # An allowed uid with a made-up session id gets nothing either.
    r = node.run("b", """
s = Session(SOCK)
result["list"] = list(s.call("List", pb.ListRequest(session="0" * 32))[:2])
result["status"] = s.call("Status", pb.StatusRequest())[0]
""")
    assert r["list"][0] == "UNAUTHENTICATED" and "unknown session" in r["list"][1]
    assert r["status"] == "UNAUTHENTICATED"


def test_another_uid_cannot_read_remove_overwrite_or_tag_a_users_job(node, users):
    path = node.path("a", "model.pt")
    mine = bytes(range(256)) * 64
    r = node.run("a", f"""
s = Session(SOCK)
result["save"] = s.save("ja", {path!r}, {mine!r})["code"]
""")
    assert r["save"] == "OK"
    a, b = users["a"], users["b"]
    r = node.run("b", f"""
s = Session(SOCK)
code, msg, data = s.read("ja", {path!r})
result["read"] = [code, msg, len(data)]
code, msg, _ = s.call("Remove", pb.RemoveRequest(session=s.id, job="ja", path={path!r}))
result["remove"] = [code, msg]
result["overwrite"] = s.save("ja", {path!r}, b"B" * 100)
result["new_path"] = s.save("ja", {node.path("b", "x.pt")!r}, b"B" * 100)["code"]
tag = pb.TagInfo(job="ja", tag="t9", world_size=1, files=[pb.TagFile(rank=0, path={path!r}, size=1)])
result["tag"] = list(s.call("CommitTag", pb.CommitTagRequest(session=s.id, tag=tag))[:2])
result["tags"] = list(s.call("ListTags", pb.ListTagsRequest(session=s.id, job="ja"))[:2])
result["wait"] = list(s.call("Wait", pb.WaitRequest(session=s.id, job="ja", paths=[{path!r}],
                                                    timeout_s=1))[:2])
code, _, listing = s.call("List", pb.ListRequest(session=s.id))
result["list"] = [f.path for f in listing.files]
result["own"] = s.save("jb", {node.path("b", "mine.pt")!r}, b"B" * 100)["code"]
""")
    owner = f": job 'ja' belongs to uid {a}"
    assert r["read"] == ["PERMISSION_DENIED", f"uid {b} may not read {path} of job 'ja'" + owner, 0]
    assert r["remove"] == ["PERMISSION_DENIED", f"uid {b} may not remove {path} of job 'ja'" + owner]
    assert r["overwrite"] == {"code": "PERMISSION_DENIED",
                              "message": f"uid {b} may not write {path} in job 'ja'" + owner}
    assert r["new_path"] == "PERMISSION_DENIED"
    assert r["tag"] == ["PERMISSION_DENIED",
                        f"uid {b} may not commit tag 't9' into job 'ja'" + owner]
    assert r["tags"] == ["PERMISSION_DENIED", f"uid {b} may not list the tags of job 'ja'" + owner]
    assert r["wait"] == ["PERMISSION_DENIED",
                         f"uid {b} may not wait for files of job 'ja'" + owner]
    assert r["list"] == [], "B sees none of A's files"
    assert r["own"] == "OK"
    # A's file is untouched: A reads its bytes, waits for them on disk, and
    # the file there is A's, with A's bytes. A sees only its own job.
    r = node.run("a", f"""
s = Session(SOCK)
code, msg, data = s.read("ja", {path!r})
result["read"] = [code, data.hex()]
code, msg, w = s.call("Wait", pb.WaitRequest(session=s.id, job="ja", paths=[{path!r}], timeout_s=30))
result["wait"] = [code, msg, [pb.FileState.Name(f.state) for f in w.files] if w else []]
code, _, listing = s.call("List", pb.ListRequest(session=s.id))
result["list"] = sorted({{f.job for f in listing.files}})
""")
    assert r["read"] == ["OK", mine.hex()]
    assert r["wait"] == ["OK", "", ["FILE_STATE_PERSISTED"]]
    assert r["list"] == ["ja"]
    with open(path, "rb") as f:
        assert f.read() == mine
    assert os.stat(path).st_uid == a


READ_VERSION = """
s = Session(SOCK)
code, msg, v = s.call("GetVersion", pb.GetVersionRequest(session=s.id, job="ja"))
result["get"] = [code, msg, v.tag.version if v else 0]
code, msg, g = s.call("AcquireVersion", pb.AcquireVersionRequest(session=s.id, job="ja"))
result["acquire"] = [code, msg]
if g:
    fd, capacity, writable = s.fd(g.files[0].buffer_id)
    with mmap.mmap(fd, g.files[0].size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) as m:
        result["bytes"] = bytes(m).hex()
    os.close(fd)
    result["writable"] = writable
"""


def test_a_granted_uid_reads_published_versions_only_until_the_grant_is_revoked(node, users):
    path = node.path("a", "policy.pt")
    mine = bytes(range(256)) * 16
    a, b = users["a"], users["b"]
    grant = """
s = Session(SOCK)
code, msg, r = s.call("GrantRead", pb.GrantReadRequest(session=s.id, job="ja", uids=[{b}],
                                                        revoke={revoke}))
result["grant"] = [code, msg, list(r.uids) if r else []]
"""
    r = node.run("a", f"""
s = Session(SOCK)
result["save"] = s.save("ja", {path!r}, {mine!r}, tag="step1")["code"]
tag = pb.TagInfo(job="ja", tag="step1", world_size=1,
                 files=[pb.TagFile(rank=0, path={path!r}, size={len(mine)})])
code, msg, t = s.call("CommitTag", pb.CommitTagRequest(session=s.id, tag=tag))
result["publish"] = [code, t.tag.version if t else 0]
""")
    assert r == {"uid": a, "save": "OK", "publish": ["OK", 1]}
    # Not granted: refused with the reason, and B's own grant to itself is too.
    r = node.run("b", READ_VERSION + grant.format(b=b, revoke=False))
    refused = f"uid {b} may not read the published versions of job 'ja' (it belongs to uid {a}): "
    assert r["get"] == ["PERMISSION_DENIED", refused + f"no read grant for uid {b} or gid "
                        f"{grp.getgrnam(GROUP).gr_gid}", 0]
    assert r["acquire"][0] == "PERMISSION_DENIED"
    assert r["grant"] == ["PERMISSION_DENIED",
                          f"uid {b} may not grant read of job 'ja': job 'ja' belongs to uid {a}", []]
    # Granted: B reads version 1's bytes through a read-only fd...
    assert node.run("a", grant.format(b=b, revoke=False))["grant"] == ["OK", "", [b]]
    r = node.run("b", READ_VERSION + f"""
code, msg, data = s.read("ja", {path!r})
result["lookup"] = [code, msg]
result["overwrite"] = s.save("ja", {path!r}, b"B" * 10)["code"]
code, msg, _ = s.call("ListTags", pb.ListTagsRequest(session=s.id, job="ja"))
result["tags"] = code
""")
    assert r["get"] == ["OK", "", 1]
    assert r["acquire"] == ["OK", ""]
    assert (r["bytes"], r["writable"]) == (mine.hex(), False)
    # ...and nothing else of the job.
    assert r["lookup"] == ["PERMISSION_DENIED", f"uid {b} may not read {path} of job 'ja': "
                           f"job 'ja' belongs to uid {a}"]
    assert (r["overwrite"], r["tags"]) == ("PERMISSION_DENIED", "PERMISSION_DENIED")
    # Revoked: the next read is refused, saying why.
    assert node.run("a", grant.format(b=b, revoke=True))["grant"] == ["OK", "", []]
    r = node.run("b", READ_VERSION)
    assert r["get"] == ["PERMISSION_DENIED", refused + f"the owner revoked the read grant of uid {b}", 0]
    assert r["acquire"] == ["PERMISSION_DENIED", refused + f"the owner revoked the read grant of uid {b}"]


def test_a_read_only_fd_cannot_be_opened_again_writable(node, users):
    """A passed read-only fd stays read-only: /proc/self/fd/N names the
    memfd itself, whose inode admits the server's uid alone, so opening it
    again writable (or changing its mode) is refused, and the committed
    bytes stay what the server checksummed."""
    path = node.path("a", "ro.pt")
    mine = bytes(range(256)) * 20
    r = node.run("a", f"""
s = Session(SOCK)
result["save"] = s.save("ja", {path!r}, {mine!r})["code"]
code, msg, look = s.call("Lookup", pb.LookupRequest(session=s.id, job="ja", path={path!r}, lease=True))
fd, cap, writable = s.fd(look.file.buffer_id)
result["writable"] = writable
try:
    w = os.open(f"/proc/self/fd/{{fd}}", os.O_RDWR)
    os.pwrite(w, b"EVIL", 0)
    result["reopen"] = "opened"
except OSError as e:
    result["reopen"] = e.errno
try:
    os.fchmod(fd, 0o666)
    result["chmod"] = "changed"
except OSError as e:
    result["chmod"] = e.errno
code, msg, data = s.read("ja", {path!r})
result["same"] = data == {mine!r}
""")
    assert r["save"] == "OK" and r["writable"] is False
    assert r["reopen"] == errno.EACCES, r
    assert r["chmod"] == errno.EPERM, r
    assert r["same"]


def test_root_sees_every_job_and_a_user_sees_no_other_users_errors(node, users):
    node.run("a", f"""
s = Session(SOCK)
s.save("ja", {node.path("a", "x.pt")!r}, b"A" * 100)
""")
    node.run("b", f"""
s = Session(SOCK)
s.save("jb", {node.path("b", "x.pt")!r}, b"B" * 100)
""")
    r = node.run("root", """
s = Session(SOCK)
code, _, listing = s.call("List", pb.ListRequest(session=s.id))
result["jobs"] = sorted({f.job for f in listing.files})
""")
    assert r["jobs"] == ["ja", "jb"]
    r = node.run("b", """
s = Session(SOCK)
code, _, st = s.call("Status", pb.StatusRequest(session=s.id))
result["status"] = [code, st.files, st.sessions]
""")
    assert r["status"] == ["OK", 2, 1]  # the node's counters, no one's paths


def _gid(name: str) -> int:
    import grp

    return grp.getgrnam(name).gr_gid


def test_a_recycled_buffer_given_to_another_uid_holds_no_byte_of_the_previous_owners(node, users):
    big = node.path("a", "big.pt")
    r = node.run("a", f"""
s = Session(SOCK)
result["save"] = s.save("ja", {big!r}, b"\\xaa" * (4 << 20))
code, msg, _ = s.call("Wait", pb.WaitRequest(session=s.id, job="ja", paths=[{big!r}], timeout_s=30))
result["wait"] = code
result["remove"] = s.call("Remove", pb.RemoveRequest(session=s.id, job="ja", path={big!r}))[0]
""")
    assert (r["save"]["code"], r["wait"], r["remove"]) == ("OK", "OK", "OK")
    # A's session is gone (the process exited): its free buffer is mapped by no one.
    root = Session(node.socket)
    try:
        until(lambda: root.call("Status", pb.StatusRequest(session=root.id))[2].sessions == 1,
              what="A's session to close")
        assert root.call("Status", pb.StatusRequest(session=root.id))[2].free_bytes >= 4 << 20
    finally:
        root.close()
    # B saves a smaller file that A's buffer would fit, then reads every byte
    # of the buffer it was given, past its own file too.
    r = node.run("b", f"""
s = Session(SOCK)
code, msg, a = s.call("Allocate", pb.AllocateRequest(session=s.id, job="jb", tag="t",
                                                     path={node.path("b", "small.pt")!r}, size=3 << 20))
fd, capacity, writable = s.fd(a.buffer_id)
with mmap.mmap(fd, capacity, flags=mmap.MAP_SHARED) as m:
    m[: 3 << 20] = b"\\xbb" * (3 << 20)
    whole = bytes(m)
result["capacity"] = capacity
result["foreign"] = whole.count(b"\\xaa")
result["zeros_after"] = whole[3 << 20:].count(0)
result["commit"] = s.call("Commit", pb.CommitRequest(session=s.id, allocation_id=a.allocation_id))[0]
""")
    assert r["commit"] == "OK"
    assert r["foreign"] == 0, f"B's buffer held {r['foreign']} of A's bytes"
    assert r["zeros_after"] == r["capacity"] - (3 << 20)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


FLOOD = """
import time
held, attempts = [], 0
for _ in range(300):  # idle connections to the control socket, held
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        s.connect(SOCK)
        held.append(s)
    except OSError:
        s.close()
deadline = time.monotonic() + 4
while attempts < 1200 and time.monotonic() < deadline:  # then the fd socket
    attempts += 1
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.setblocking(False)
    try:
        s.connect(SOCK + ".fd")
        held.append(s)
    except OSError:
        s.close()
time.sleep(max(0.0, deadline - time.monotonic()))  # hold them while the server copes
result["attempts"] = attempts
for s in held:
    s.close()
"""

SAVE_AFTER = """
import time
deadline = time.monotonic() + 20
while True:  # the server may still be backing off
    try:
        s = Session(SOCK)
        break
    except (OSError, Refused):
        if time.monotonic() > deadline:
            raise
        time.sleep(0.2)
result["save"] = s.save("ja", PATH, b"A" * 4096)["code"]
result["read"] = s.read("ja", PATH)[2] == b"A" * 4096
"""


@pytest.mark.parametrize("flooder", ["c", "a"])
def test_a_connection_flood_neither_spins_nor_floods_the_log_and_saves_go_on(users, flooder):
    """1,200 connections to the fd socket on top of 300 held control
    connections, from a uid that is not allowed (c: every connection is
    closed at once) and from one that is (a: the server runs out of fds and
    must shed). The server's fds run out early: hard limit 200, so raising
    the soft limit to the hard one cannot help."""
    node = Node(users, prefix=["prlimit", "--nofile=200:200", "--"])
    try:
        pid = node.server.proc.pid
        log_before = os.path.getsize(node.server.log_path)
        cpu_before = _cpu_seconds(pid)
        r = node.run(flooder, FLOOD, timeout=120)
        assert r["attempts"] >= 1000, r
        cpu = _cpu_seconds(pid) - cpu_before
        grown = os.path.getsize(node.server.log_path) - log_before
        assert cpu < 2.0, f"the server used {cpu:.1f} s of CPU in ~4 s of flood (spinning)"
        assert grown < 64 << 10, f"the log grew by {grown} bytes:\n{node.server.log()[-2000:]}"
        if flooder == "a":  # it did run out of fds, and said so (rate-limited)
            assert "accept: Too many open files: closed a waiting connection" in node.server.log()
        r = node.run("a", f"PATH = {node.path('a', 'after.pt')!r}\n" + SAVE_AFTER)
        assert r["save"] == "OK" and r["read"], (r, node.server.log()[-3000:])
    finally:
        node.close()


def test_an_idle_session_is_closed_and_a_session_holding_a_lease_is_not(users):
    node = Node(users, extra_args=["--session-idle-timeout-s", "1"])
    try:
        path = node.path("a", "x.pt")
        # The reader's last call comes before the idle session's: when the
        # server closes the idle one, the reader has been idle longer.
        r = node.run("a", f"""
import os
writer = Session(SOCK)
result["save"] = writer.save("ja", {path!r}, b"A" * 4096)["code"]
writer.close()
reader = Session(SOCK)
code, _, lease = reader.call("Lookup", pb.LookupRequest(session=reader.id, job="ja", path={path!r}, lease=True))
result["lease"] = code
idle = Session(SOCK)
result["idle_status"] = idle.call("Status", pb.StatusRequest(session=idle.id))[0]
idle.fd_sock.settimeout(60)  # bounds a hang only
result["idle_closed"] = idle.fd_sock.recv(4096) == b""  # until the server closes it
result["idle_call"] = list(idle.call("List", pb.ListRequest(session=idle.id))[:2])
# The fd socket's thread closes every idle session in one pass: it answers
# the reader only after the pass that closed the idle one.
fd, _, _ = reader.fd(lease.file.buffer_id)
os.close(fd)
result["reader_open"] = True
result["release"] = reader.call("Release", pb.ReleaseRequest(session=reader.id, lease_ids=[lease.lease_id]))[0]
""")
        assert r["save"] == "OK" and r["lease"] == "OK" and r["idle_status"] == "OK"
        assert r["idle_closed"], "the idle session's connection was not closed"
        assert r["idle_call"][0] == "UNAUTHENTICATED"
        assert r["reader_open"] and r["release"] == "OK"
        assert "idle for 1 s (session_idle_timeout_s)" in node.server.log()
    finally:
        node.close()


def test_blocked_waits_and_leases_per_session_are_capped(users):
    node = Node(users, extra_args=["--max-waits", "2", "--max-leases-per-session", "3",
                                   "--persist-retries", "100", "--persist-backoff-ms", "50"])
    try:
        blocked = node.path("a", "blocked")
        os.mkdir(blocked)
        os.chown(blocked, users["a"], -1)
        blocker = Blocker(os.path.join(blocked, "x.pt"), owner=(users["a"], -1))
        stuck = str(blocker.path)
        r = node.run("a", f"""
import threading, time
s = Session(SOCK)
result["save"] = s.save("ja", {stuck!r}, b"A" * 4096)["code"]

def wait(timeout_s):
    return list(s.call("Wait", pb.WaitRequest(session=s.id, job="ja", paths=[{stuck!r}], timeout_s=timeout_s))[:2])

capped = threading.Event()
first = []

def block():  # Waits that block (the file cannot persist) until the third was refused
    codes = set()
    while True:
        code = wait(4)[0]
        codes.add(code)
        if capped.is_set() and code != "RESOURCE_EXHAUSTED":
            first.append(sorted(codes))
            return

threads = [threading.Thread(target=block) for _ in range(2)]
for t in threads:
    t.start()
# A third Wait, of 1 ms, until both block: admitted until then, it may
# hold a slot for a moment, and a blocking one refused then waits again.
deadline = time.monotonic() + 60  # bounds a hang only
while True:
    third = wait(1e-9)
    if third[0] == "RESOURCE_EXHAUSTED" or time.monotonic() > deadline:
        break
    time.sleep(0.02)
capped.set()
result["third"] = third
for t in threads:
    t.join()
result["first"] = sorted(first)
result["after"] = s.call("Wait", pb.WaitRequest(session=s.id, job="ja", paths=[{stuck!r}],
                                                 timeout_s=0.2))[0]
leases = []
for i in range(4):
    code, msg, resp = s.call("Lookup", pb.LookupRequest(session=s.id, job="ja", path={stuck!r}, lease=True))
    leases.append([code, msg])
    if code == "OK":
        last = resp.lease_id
result["leases"] = leases
s.call("Release", pb.ReleaseRequest(session=s.id, lease_ids=[last]))
result["again"] = s.call("Lookup", pb.LookupRequest(session=s.id, job="ja", path={stuck!r}, lease=True))[0]
""")
        assert r["save"] == "OK"
        assert r["third"] == ["RESOURCE_EXHAUSTED",
                              "the server already runs 2 blocked calls (max_waits=2): try again later"]
        # Each blocking Wait ended at its timeout (one refused while the third
        # held a slot, if any, was retried).
        assert all("DEADLINE_EXCEEDED" in codes and set(codes) <= {"DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"}
                   for codes in r["first"]) and len(r["first"]) == 2, r["first"]
        assert r["after"] == "DEADLINE_EXCEEDED"  # the slots were given back
        assert r["leases"][:3] == [["OK", ""]] * 3
        assert r["leases"][3] == ["RESOURCE_EXHAUSTED",
                                  "this session holds 3 leases (max_leases_per_session=3): "
                                  "release loaded files before loading more"]
        assert r["again"] == "OK"
    finally:
        blocker.release()
        node.close()


def test_control_connections_beyond_the_cap_are_closed_at_once(tmp_path):
    """Even an allowed uid cannot hold the control socket's connections
    without bound: beyond max_control_connections the server closes new
    ones at once, and counts a connection gRPC has closed as gone."""
    s = LocalServer(memory_budget="64MiB", extra_args=["--max-control-connections", "8"]).start()
    held: list[socket.socket] = []
    try:
        def connect() -> socket.socket:
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.settimeout(60)  # bounds a hang only
            c.connect(s.socket)
            return c

        for _ in range(8):
            held.append(connect())
        extra = connect()  # accepted after the 8: one thread accepts them, in order
        assert extra.recv(1) == b""  # closed by the server, not left waiting
        extra.close()
        assert "control connections open (max_control_connections)" in s.log()
        for c in held:
            c.close()
        held.clear()

        def serves() -> bool:
            p = subprocess.run([sys.executable, "-m", "tce.cli", "--socket", s.socket, "status", "--json"],
                               capture_output=True, text=True, timeout=60)
            return p.returncode == 0 and int(json.loads(p.stdout)["pid"]) == s.proc.pid

        until(serves, what="the server to serve a client once the connections are gone")
    finally:
        for c in held:
            c.close()
        assert s.stop() == 0, s.log()
        s.cleanup()


def _peer_endpoint(node: Node) -> str:
    return node.run("root", """
s = Session(SOCK)
result["endpoint"] = s.call("Status", pb.StatusRequest(session=s.id))[2].peer_endpoint
""")["endpoint"]


def test_a_ring_squatter_of_another_uid_gets_no_copy_and_no_range(users):
    """Nodes A and B, a job's ring. On B, user b sets the ring of job `ja`
    first (a squatter: the job is user a's on A). B then holds no copy of
    a's checkpoint (the job belongs to another uid there), a's own SetRing
    on B is refused, and b's ranged reads of a's file, which B would serve
    from A's memory, get no byte of it."""
    peer = ["--peer-listen", "127.0.0.1:0", "--peer-token", "t", "--peer-timeout-ms", "2000"]
    a = Node(users, extra_args=peer)
    b = None
    try:
        b = Node(users, extra_args=peer, ckpt=a.ckpt)  # shared storage, as a cluster's
        ring = [_peer_endpoint(a), _peer_endpoint(b)]
        set_ring = f"""
s = Session(SOCK)
code, msg, _ = s.call("SetRing", pb.SetRingRequest(session=s.id, job="ja", node_rank=NODE,
                                                   endpoints={ring!r}))
result["ring"] = code
result["message"] = msg
"""
        squat = b.run("b", set_ring.replace("NODE", "1"))
        assert squat["ring"] == "OK", squat
        assert a.run("a", set_ring.replace("NODE", "0"))["ring"] == "OK"
        mine = b.run("a", set_ring.replace("NODE", "1"))
        assert mine["ring"] == "PERMISSION_DENIED", mine
        assert f"job 'ja' belongs to uid {users['b']}" in mine["message"], mine

        path = a.path("a", "x.pt")
        secret = b"S3CRET!" * 1000
        saved = a.run("a", f"""
s = Session(SOCK)
result["save"] = s.save("ja", {path!r}, {secret!r})["code"]
""")
        assert saved["save"] == "OK", saved
        refusal = f"job ja belongs to uid {users['b']} here, and {ring[0]} acts for it as uid {users['a']}"
        until(lambda: refusal in b.server.log(), what="B to refuse A's copy")
        st = b.run("root", """
s = Session(SOCK)
st = s.call("Status", pb.StatusRequest(session=s.id))[2]
result["held"] = st.held_backups
""")
        assert st["held"] == 0, st

        read = b.run("b", f"""
s = Session(SOCK)
code, msg, r = s.call("ReadRange", pb.ReadRangeRequest(session=s.id, job="ja", path={path!r},
                                                       offset=0, length=4096))
result["code"], result["message"] = code, msg
result["data"] = (r.data if r else b"").hex()
""")
        assert read["code"] != "OK" and read["data"] == "", read
        until(lambda: f"as uid {users['b']}: it may not read its files" in a.server.log(),
              what="A to refuse B's ranged read for uid b")
    finally:
        if b is not None:
            b.close()
        a.close()


@contextlib.contextmanager
def holding(node: Node, user: str, code: str):
    """Runs `code` as `user` and keeps its process, and so its sessions and
    connections, alive inside the block; yields the `result` the snippet had
    made by then. The process ends when the block does."""
    release_r, release_w = os.pipe()
    snippet = (f"SOCK = {node.socket!r}\n{code}\n"
               f"import json\nprint(json.dumps(result), flush=True)\nos.read({release_r}, 1)\n")
    p = subprocess.Popen([sys.executable, AS_USER, USERS[user]], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         pass_fds=(release_r,))
    os.close(release_r)
    try:
        p.stdin.write(snippet)
        p.stdin.close()
        line = p.stdout.readline()
        assert line, f"as {user}: no result\n{p.stderr.read()}"
        yield json.loads(line)
    finally:
        os.close(release_w)
        p.wait(timeout=60)
        p.stdout.close()
        p.stderr.close()


def _opens_session(node: Node, user: str) -> bool:
    r = node.run(user, """
try:
    Session(SOCK).close()
    result["ok"] = True
except Refused:
    result["ok"] = False
""")
    return r["ok"]


def test_a_uid_at_its_session_cap_is_refused_while_another_uid_still_saves(users):
    """A held lease keeps a session from ever being idle, so without a cap
    per uid one user could hold every session and leave the others none."""
    node = Node(users, extra_args=["--max-sessions-per-uid", "3"])
    try:
        with holding(node, "a", """
held = [Session(SOCK) for _ in range(3)]
try:
    Session(SOCK)
except Refused as e:
    result["code"], result["message"] = e.code, e.message
""") as a:
            assert a["code"] == "RESOURCE_EXHAUSTED"
            assert a["message"] == f"uid {users['a']} holds 3 sessions (max_sessions_per_uid)"
            path = node.path("b", "x.pt")
            b = node.run("b", f"""
s = Session(SOCK)
result["save"] = s.save("jb", {path!r}, b"B" * 4096)["code"]
result["read"] = s.read("jb", {path!r})[2] == b"B" * 4096
""")
            assert b == {"uid": users["b"], "save": "OK", "read": True}
        # A's sessions ended with its process: it gets one again.
        until(lambda: _opens_session(node, "a"), what="uid a's sessions to be counted as gone")
    finally:
        node.close()


def test_a_uid_at_its_control_connection_cap_is_closed_while_another_uid_is_served(users):
    node = Node(users, extra_args=["--max-control-connections-per-uid", "4"])
    try:
        with holding(node, "a", """
held = []
for _ in range(4):
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(SOCK)
    held.append(c)
extra = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
extra.settimeout(10)
extra.connect(SOCK)
result["extra"] = extra.recv(1).decode()  # "": closed by the server, not left waiting
""") as a:
            assert a["extra"] == ""
            b = node.run("b", "s = Session(SOCK)\nresult['list'] = s.call('List', pb.ListRequest(session=s.id))[0]\n")
            assert b["list"] == "OK"
        log = node.server.log()
        assert (f"uid={users['a']}: uid {users['a']} holds 4 control connections "
                "(max_control_connections_per_uid)") in log
    finally:
        node.close()


def test_a_uid_at_its_range_buffer_cap_is_refused_while_another_uid_gets_one(users):
    """Range buffers (where a ranged read puts its bytes) are few: one uid
    holds at most max_range_buffers_per_uid of them; its other sessions read
    through the reply, and another uid still gets its own."""
    node = Node(users, extra_args=["--max-range-buffers-per-uid", "2"])
    try:
        with holding(node, "a", """
sessions = [Session(SOCK) for _ in range(3)]
result["sizes"] = [sessions[i].range_buffer()[1] for i in range(2)]
try:
    sessions[2].range_buffer()
except Refused as e:
    result["code"], result["message"] = e.code, e.message
""") as a:
            assert a["sizes"] == [64 << 20] * 2
            assert a["code"] == "RESOURCE_EXHAUSTED"
            assert a["message"] == f"uid {users['a']} holds 2 range buffers (max_range_buffers_per_uid)"
            path = node.path("b", "r.bin")
            b = node.run("b", f"""
data = bytes(range(256)) * 4096
s = Session(SOCK)
result["save"] = s.save("jb", {path!r}, data)["code"]
fd, result["size"] = s.range_buffer()
code, msg, _ = s.call("ReadRange", pb.ReadRangeRequest(
    session=s.id, job="jb", path={path!r}, offset=1000, length=100000, into_buffer=True, buffer_offset=0))
result["read"] = [code, msg]
result["bytes"] = os.pread(fd, 100000, 0) == data[1000:101000]
""")
            assert b["save"] == "OK" and b["size"] == 64 << 20
            assert b["read"] == ["OK", ""] and b["bytes"]
    finally:
        node.close()


def test_a_load_the_server_reads_is_checked_against_the_users_rights_alone(users):
    """A load that misses has the (root) server read the file from storage
    as the loading user: its fsuid and fsgid, and none of the server's own
    supplementary groups. Started in group 0 (as a container's root often
    is, with more), the server still does not read for uid a a file that
    only group 0 may read; a's own file it reads."""
    node = Node(users, prefix=["setpriv", "--groups", "0", "--"])
    try:
        secret, mine = node.path("a", "secret.pt"), node.path("a", "mine.pt")
        for path, owner, mode in ((secret, (0, 0), 0o640), (mine, (users["a"], -1), 0o600)):
            with open(path, "wb") as f:
                f.write(b"PK\x05\x06" + bytes(18))  # any bytes: the server does not parse them
            os.chown(path, *owner)
            os.chmod(path, mode)
        r = node.run("a", f"""
s = Session(SOCK)
for name, path in (("secret", {secret!r}), ("mine", {mine!r})):
    code, msg, look = s.call("Lookup", pb.LookupRequest(session=s.id, job="ja", path=path, lease=True))
    result[name] = [code, look.file.size if look else 0]
""")
        assert (r["secret"], r["mine"]) == (["NOT_FOUND", 0], ["OK", 22]), r
        assert "Permission denied" in node.server.log()  # the read it refused, left to the user
    finally:
        node.close()
