"""The soak: a real tce-server, a writer saving through it, and faults for
minutes on end; then every file acknowledged as durable must be on storage,
bit for bit, and a fresh server must load it so.

    python tests/soak.py --minutes 10 [--seed N]      (make soak, SOAK_MINUTES)

Pieces, all real and on this machine: moto's S3 server on loopback behind the
fault-injecting proxy (tests/s3_helpers.py) and a cutting relay
(tests/soak_faults.py); a tce-server with one directory root and one S3
root, SQLite metadata in a state dir that outlives its restarts and a small
memory budget (so that persisted files are evicted); the writer
(tests/soak_writer.py), a process of its own, journaling each save before
it is made and each ``tce.wait`` acknowledgement after. Faults, drawn from
the seed (printed first, so a run's schedule can be replayed): the server
and the writer SIGKILLed and started again, S3 connections reset or cut
mid-body, the endpoint frozen, 503 SlowDown bursts, a storage directory
or the server's state dir made unwritable (``chattr +i``). At the deadline the faults stop, the
writer stops, the server persists what it holds and is stopped (SIGTERM,
exit 0), and the journal is checked (tests/soak_verify.py). Exit status 1
on any loss, any server or writer exit the soak did not cause, or a run
that acknowledged nothing.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

from s3_helpers import FaultProxy  # noqa: E402
from soak_faults import KINDS, CutRelay, Faults  # noqa: E402
from soak_verify import Outcome, corrupt, log_lines, verify  # noqa: E402
from soak_writer import JOB, SUBDIRS, read_journal, stamp  # noqa: E402
from tce.tools._moto import MotoServer, credentials_env  # noqa: E402
from tce.tools._server import LocalServer  # noqa: E402

MEMORY_BUDGET = "24MiB"  # the pool of paths holds more than this: persisted files are evicted


class Server:
    """The tce-server of the soak, started again on the same socket, state
    dir and settings after each SIGKILL. ``unexpected``: each exit the soak
    did not cause (its status and its log since it started)."""

    def __init__(self, work: Path, roots: list[str], s3_endpoint: str) -> None:
        self.socket = str(work / "tce.sock")
        self.log_path = str(work / "server.log")
        self.state_dir = str(work / "state")
        self.args = dict(
            socket_path=self.socket, memory_budget=MEMORY_BUDGET, storage_roots=roots,
            state_dir=self.state_dir, log_path=self.log_path, env=credentials_env(),
            drain_timeout_ms=30000,
            extra_args=["--s3-endpoint", s3_endpoint, "--s3-path-style", "true",
                        "--s3-part-size", "5MiB", "--s3-backoff-ms", "50",
                        "--persist-backoff-ms", "100", "--persist-failed-retry-ms", "2000",
                        "--cache-full-timeout-ms", "5000", "--memory-backing", "4k"])
        self.local: LocalServer | None = None
        self.starts = self.sigkills = 0
        self.unexpected: list[str] = []
        self._offset = 0
        self._expected_exit = False

    def start(self) -> None:
        self._offset = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        self.local = LocalServer(**self.args)
        self._expected_exit = False
        self.starts += 1
        try:
            self.local.start(timeout=120)
        except (RuntimeError, TimeoutError) as e:
            self._expected_exit = True
            self.unexpected.append(f"start {self.starts} failed: {str(e)[-3000:]}")
            raise

    def kill(self) -> None:
        if self.local is not None and self.local.proc.poll() is None:
            self._expected_exit = True
            self.local.kill()
            self.sigkills += 1

    def arm_kill(self, trigger: str) -> None:
        """Has the writer SIGKILL it after its next save (soak_writer.py)."""
        self._expected_exit = True
        with open(trigger + ".tmp", "w") as f:
            f.write(str(self.local.proc.pid))
        os.replace(trigger + ".tmp", trigger)

    def disarm_kill(self, trigger: str) -> bool:
        """Ends :meth:`arm_kill`; True when the writer killed it."""
        try:
            os.unlink(trigger)  # first: no kill will come
            self._expected_exit = False
            return False
        except FileNotFoundError:
            pass  # the writer took it: its SIGKILL follows at once
        try:
            code = self.local.proc.wait(30)
        except subprocess.TimeoutExpired:  # the writer was killed in between
            self._expected_exit = False
            return False
        if code != -signal.SIGKILL:
            self.unexpected.append(f"server start {self.starts} exited with {code} while the "
                                   f"writer was to SIGKILL it; its log:\n{self.log_since()[-4000:]}")
        else:
            self.sigkills += 1
        return True

    def check(self) -> bool:
        """False (and the exit recorded) when it exited by itself."""
        if self.local is None or self._expected_exit or self.local.proc.poll() is None:
            return True
        self._expected_exit = True
        self.unexpected.append(f"server start {self.starts} exited with {self.local.proc.returncode} "
                               f"(not killed by the soak); its log:\n{self.log_since()[-4000:]}")
        return False

    def log_since(self) -> str:
        with open(self.log_path, errors="replace") as f:
            f.seek(self._offset)
            return f.read()

    def stop(self) -> int:
        """SIGTERM (it drains first); its exit status."""
        self._expected_exit = True
        return self.local.stop(timeout=90)

    def close(self) -> None:
        if self.local is not None:
            self._expected_exit = True
            self.local.kill()


class Writer:
    """The writer process (tests/soak_writer.py), in a process group of its own."""

    def __init__(self, work: Path, socket: str, dir_root: str, s3_root: str, seed: str,
                 rate: float, moto_endpoint: str, bucket: str) -> None:
        self.journal = str(work / "journal.jsonl")
        self.log_path = str(work / "writer.log")
        self.stop_file = str(work / "writer.stop")
        self.kill_trigger = str(work / "kill-server-after-save")
        self.base = [sys.executable, str(TESTS / "soak_writer.py"), "--socket", socket,
                     "--dir-root", dir_root, "--s3-root", s3_root, "--journal", self.journal,
                     "--stop-file", self.stop_file, "--kill-trigger", self.kill_trigger,
                     "--s3-endpoint", moto_endpoint, "--bucket", bucket,
                     "--seed", seed, "--rate", str(rate)]
        self.proc: subprocess.Popen | None = None
        self.starts = self.sigkills = 0
        self.unexpected: list[str] = []
        self._expected_exit = False

    def start(self) -> None:
        self.starts += 1
        self._expected_exit = False
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.base + ["--incarnation", str(self.starts)],
                                         stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self._expected_exit = True
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.sigkills += 1

    def check(self) -> bool:
        if self.proc is None or self._expected_exit or self.proc.poll() is None:
            return True
        self._expected_exit = True
        with open(self.log_path, errors="replace") as f:
            tail = f.read()[-3000:]
        self.unexpected.append(f"writer {self.starts} exited with {self.proc.returncode} "
                               f"(not killed by the soak); its log ends:\n{tail}")
        return False

    def stop(self, timeout: float) -> bool:
        """Asks it to stop after its batch; True when it exited 0 in time."""
        Path(self.stop_file).touch()
        self._expected_exit = True
        try:
            return self.proc.wait(timeout) == 0
        except subprocess.TimeoutExpired:
            self.kill()
            return False

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self._expected_exit = True
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _commit() -> str:
    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(TESTS), *a], capture_output=True, text=True).stdout
    head = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    return head + ("+uncommitted changes" if git("status", "--porcelain", "--untracked-files=no").strip()
                   else "")


class Soak:
    def __init__(self, args: argparse.Namespace, seed: int, work: Path) -> None:
        self.args, self.seed, self.work = args, seed, work
        self.failures: list[str] = []
        self.events_path = str(work / "events.log")
        self.events = open(self.events_path, "a")
        self.t0 = time.monotonic()
        self.failed_at_end: collections.Counter[str] = collections.Counter()  # FAILED files by reason
        self.stop_codes: list[int] = []
        self.drain_s = 0.0
        self.outcome: Outcome | None = None
        self.self_check: list[tuple[str, str]] = []

    def log(self, line: str) -> None:
        self.events.write(f"{stamp()} [{time.monotonic() - self.t0:7.2f}s] {line}\n")
        self.events.flush()

    def run(self) -> None:
        work, args = self.work, self.args
        self.dir_root = str(work / "storage")
        self.s3_root = str(work / "s3root")  # never made: an object root has no local directory
        for d in SUBDIRS:
            os.makedirs(os.path.join(self.dir_root, d))
        self.moto = MotoServer(log_path=str(work / "moto.log")).start()
        self.bucket = self.moto.make_bucket("tce-soak")
        self.proxy = FaultProxy(self.moto.endpoint)
        port = int(self.proxy.endpoint.rsplit(":", 1)[1])
        self.relay = CutRelay(("127.0.0.1", port))
        roots = [self.dir_root, f"{self.s3_root}=s3://{self.bucket}/{JOB}"]  # soak_writer.object_key
        self.server = Server(work, roots, self.relay.endpoint)
        self.writer = Writer(work, self.server.socket, self.dir_root, self.s3_root, str(self.seed),
                             args.rate, self.moto.endpoint, self.bucket)
        rng = random.Random(self.seed)
        self.faults = Faults(
            rng, server=self.server, writer=self.writer, proxy=self.proxy, relay=self.relay,
            readonly_dir=os.path.join(self.dir_root, SUBDIRS[0]), kinds=args.faults,
            every=args.every, plan=args.plan, log=self.log)
        self.server.start()
        self.writer.start()
        self.log(f"started: seed {self.seed}, work dir {work}")
        deadline = time.monotonic() + args.minutes * 60
        next_progress = time.monotonic()
        while time.monotonic() < deadline and not self.all_failures():
            self.faults.step()
            if not self.server.check() or not self.writer.check():
                break
            now = time.monotonic()
            if now >= next_progress:
                if now > self.t0 + 30 and args.minutes >= 2:
                    self._progress(now)
                next_progress = now + 60
            time.sleep(0.05)  # pacing of the loop

    def _progress(self, now: float) -> None:
        j = read_journal(self.writer.journal)
        print(f"soak: {(now - self.t0) / 60:.1f}/{self.args.minutes:g} min: {len(j.saves)} saves, "
              f"{len(j.acks)} acknowledged, {sum(self.faults.counts.values())} faults", flush=True)

    def finish(self) -> None:
        """Faults off, the writer stopped, the server drained and stopped."""
        from helpers import until
        from tce import client
        from tce.v1 import tce_pb2 as pb

        self.faults.end_all()
        if self.server.local.proc.poll() is not None:
            self.server.start()  # killed by the last fault, its restart not due yet
        if not self.writer.stop(timeout=300):
            self.failures.append(f"the writer did not stop cleanly:\n{self._tail(self.writer.log_path)}")
        self.log("writer stopped")
        pending: list = []

        def drained() -> bool:
            pending.clear()
            self.failed_at_end.clear()
            try:
                with client.session(self.server.socket, job=JOB, rpc_timeout=30,
                                    on_unavailable="raise"):
                    for f in client.files(job=JOB):
                        if f.state in (pb.FILE_STATE_CACHED, pb.FILE_STATE_BACKED_UP):
                            pending.append(f.path)
                        elif f.state == pb.FILE_STATE_FAILED:
                            self.failed_at_end[f.reason.split(":")[0]] += 1
            except Exception as e:  # noqa: BLE001 (a server gone now fails below)
                pending.append(e)
            return not pending

        started = time.monotonic()
        try:
            until(drained, 300, "the server to persist every file it holds")
        except AssertionError:
            self.failures.append(f"the server did not persist what it held in 300 s: {pending[:5]}")
        self.drain_s = time.monotonic() - started
        if self.server.check():
            self.stop_codes.append(self.server.stop())
        self.log(f"server stopped: {self.stop_codes}")

    def check(self) -> None:
        """Corrupts what the self-check asks, then verifies the journal."""
        journal = read_journal(self.writer.journal)
        s3 = self.moto.boto3()
        if self.args.self_check:
            self.self_check = corrupt(journal, s3, self.bucket, self.s3_root)
            self.log(f"self-check: corrupted {self.self_check}")
        self.server.start()  # a fresh server on the same state and storage
        try:
            self.outcome = verify(journal, s3, self.bucket, self.s3_root, self.server.socket)
        finally:
            if self.server.check():
                self.stop_codes.append(self.server.stop())
        if any(self.stop_codes):
            self.failures.append(f"the server's exit status after SIGTERM: {self.stop_codes}")
        if not journal.acks:
            self.failures.append("the writer had no save acknowledged: the soak tested nothing")

    def all_failures(self) -> list[str]:
        """What fails the run besides losses: the soak's own findings and
        every exit of the server or the writer it did not cause."""
        out = list(self.failures)
        for proc in (getattr(self, "server", None), getattr(self, "writer", None)):
            if proc is not None:
                out += proc.unexpected
        return out

    def _tail(self, path: str) -> str:
        with open(path, errors="replace") as f:
            return f.read()[-2000:]

    def close(self) -> None:
        for close in ("faults.writable", "writer.close", "server.close", "relay.close",
                      "proxy.close", "moto.stop", "events.close"):
            obj_name, _, method = close.partition(".")
            obj = getattr(self, obj_name, None)
            if obj is not None:
                try:
                    getattr(obj, method)()
                except Exception as e:  # noqa: BLE001 (every piece is closed whatever failed)
                    print(f"soak: closing {obj_name}: {e}", file=sys.stderr)


def _report(soak: Soak, args: argparse.Namespace, seconds: float) -> tuple[str, bool]:
    j = read_journal(soak.writer.journal) if hasattr(soak, "writer") else None
    lines = [f"soak report: seed {soak.seed}, {seconds / 60:.1f} min of faults "
             f"(--minutes {args.minutes:g}), commit {_commit()}, {os.cpu_count()} cores"]
    if j is not None:
        roots = collections.Counter(s.root for s in j.saves.values())
        kinds = collections.Counter(s.kind for s in j.saves.values())
        mib = sum(s.size for s in j.saves.values()) / (1 << 20)
        lines.append(f"  writer: {len(j.saves)} saves ({roots['dir']} dir, {roots['s3']} s3; "
                     f"{', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}; {mib:.0f} MiB), "
                     f"{j.fails} raised at once, {len(j.acks)} acknowledged durable; "
                     f"{soak.writer.starts} starts, {soak.writer.sigkills} SIGKILLed"
                     + (f", {j.torn} journal line(s) cut short" if j.torn else ""))
    if hasattr(soak, "faults"):
        c = soak.faults.counts
        lines.append("  faults: " + ", ".join(f"{k} {c[k]}" for k in KINDS)
                     + f" ({soak.faults.untriggered} kills after a save armed while no save "
                       f"returned, {soak.relay.cuts} connections cut mid-body, "
                       f"{soak.proxy.counts().get('SlowDown', 0)} requests answered 503)")
        for kind, why in soak.faults.unavailable.items():
            lines.append(f"  {kind} left out: {why}")
        s3_kinds = {k: v for k, v in soak.proxy.counts().items() if k != "SlowDown"}
        lines.append("  S3 requests: " + ", ".join(f"{k} {v}" for k, v in sorted(
            s3_kinds.items(), key=lambda kv: -kv[1])[:8]))
        seen = _log_counts(soak.server.log_path)
        lines.append(f"  server: {soak.server.starts} starts, {soak.server.sigkills} SIGKILLed, "
                     f"{len(soak.server.unexpected)} unexpected exits, exit status after SIGTERM "
                     f"{soak.stop_codes}; drained in {soak.drain_s:.1f} s; its log: "
                     + ", ".join(f"{k} {v}" for k, v in seen.items()))
        if soak.failed_at_end:
            lines.append("  FAILED at the end (never acknowledged), by reason: " + ", ".join(
                f"{why} {n}" for why, n in soak.failed_at_end.most_common()))
    o = soak.outcome
    if o is not None:
        lines += o.summary(j)
        for loss in o.losses:
            lines.append(f"  LOST {loss.path} ({loss.root}): acknowledged save {loss.n} "
                         f"digest {loss.expected[:16]}, found {loss.found}: {loss.detail}")
            lines += _context(soak, loss)
    failures = soak.all_failures()
    ok = not failures and o is not None
    if args.self_check:
        found = sorted(loss.path for loss in o.losses) if o else []
        wanted = sorted(p for p, _ in soak.self_check)
        ok = ok and bool(wanted) and found == wanted
        lines.append(f"  self-check: corrupted {wanted} after the run; the soak reported "
                     f"{found}: {'as expected' if ok else 'NOT as expected'}")
    else:
        ok = ok and not o.losses
    for f in failures:
        lines.append("  FAILURE: " + f)
    lines.append(f"result: {'PASS' if ok else 'FAIL'} (work dir {soak.work})")
    return "\n".join(lines), ok


def _context(soak: Soak, loss) -> list[str]:
    """The lines of the logs around a loss: the faults of the 15 s before
    the writer saw it (or before the end), the server's lines about its
    path until then, the writer's about its save."""
    writer = log_lines(soak.writer.log_path, (f"save {loss.n} ",))
    seen = [line.split()[0] for line in writer if "acknowledged, but" in line]
    until = seen[0] if seen else "9"  # "9" sorts after every stamp: the whole log
    since = "0"
    if seen:
        at = datetime.datetime.fromisoformat(seen[0].replace("Z", "+00:00"))
        since = stamp(at - datetime.timedelta(seconds=15))
    faults = [line for line in log_lines(soak.events_path, (" for ",))
              if since <= line.split()[0] <= until]
    server = [line for line in log_lines(soak.server.log_path, (loss.path,))
              if line.split()[0] <= until]
    return ([f"    fault:  {line}" for line in faults[-3:]] +
            [f"    server: {line}" for line in server[-4:]] +
            [f"    writer: {line}" for line in writer[-3:]])


_LOGGED = {"persisted": " persist: persisted ", "evicted": " cache: evicted ",
           "persist retries": " persist: retrying ", "FAILED": " persist: FAILED ",
           "DISCARDED": "DISCARDED job=", "ERROR lines": " ERROR "}


def _log_counts(path: str) -> dict[str, int]:
    """How often the server logged each of :data:`_LOGGED` (every start)."""
    counts = dict.fromkeys(_LOGGED, 0)
    with open(path, errors="replace") as f:
        for line in f:
            for name, needle in _LOGGED.items():
                counts[name] += needle in line
    return counts


def _plan(text: str) -> list[tuple[float, str]]:
    out = []
    for item in filter(None, text.split(",")):
        kind, _, at = item.partition("@")
        if kind not in KINDS:
            raise argparse.ArgumentTypeError(f"unknown fault {kind!r} (known: {', '.join(KINDS)})")
        out.append((float(at), kind))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="how long faults are injected")
    p.add_argument("--seed", type=int, default=None, help="replays a run's draws (default: random)")
    p.add_argument("--faults", type=lambda s: tuple(s.split(",")), default=KINDS,
                   help=f"kinds to draw from (default: all: {','.join(KINDS)})")
    p.add_argument("--every", type=lambda s: tuple(map(float, s.split(":"))), default=(3.0, 12.0),
                   help="MIN:MAX seconds between faults (default 3:12)")
    p.add_argument("--plan", type=_plan, default=None,
                   help="KIND@SECONDS,... : these faults at these times instead of the draw")
    p.add_argument("--rate", type=float, default=2 << 20, help="the writer's bytes per second")
    p.add_argument("--work-dir", default=None, help="default: a new temp dir, removed on success")
    p.add_argument("--self-check", action="store_true",
                   help="corrupt one stored file per root after the run: it must be reported lost")
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="tce-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"soak: seed {seed}, {args.minutes:g} min, work dir {work} "
          f"(to replay its draws: the same arguments and --seed {seed})", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally below cleans up
    soak = Soak(args, seed, work)
    started = time.monotonic()
    seconds = 0.0
    try:
        for step in (soak.run, soak.finish, soak.check):
            if step != soak.run and not hasattr(soak, "writer"):
                break  # nothing was started
            try:
                step()
            except Exception as e:  # noqa: BLE001 (reported; the run is over)
                soak.failures.append(f"{step.__name__}: {type(e).__name__}: {e}")
                break
            finally:
                seconds = seconds or time.monotonic() - started
    except (KeyboardInterrupt, SystemExit):
        print("soak: interrupted; its processes are ended, its work dir is kept", flush=True)
        raise
    finally:
        soak.close()
    report, ok = _report(soak, args, seconds)
    print(report, flush=True)
    if ok and args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
