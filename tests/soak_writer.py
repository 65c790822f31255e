"""The soak's writer (tests/soak.py), a process of its own so that the soak
can SIGKILL it and start it again: it saves files through the tce-server
and records, in an append-only journal, what it saved and what
``tce.wait`` acknowledged as durable.

Each round saves a batch of 1-4 files (distinct paths) of random sizes,
from a few KiB to a few MiB, under the directory root and the object (S3)
root, drawn from a small pool of names so that paths are saved again: torch
state dicts with ``tce.save``, a raw uint8 tensor with the patched
``torch.save``, raw bytes with ``tce.objects.save_bytes``, each under a tag.
Before each save the journal gets a ``save`` record (the path, the SHA-256
of the bytes the saved file holds (:func:`digest`), a global order number),
fsynced; once ``tce.wait`` returned for the batch, an ``ack`` record per
file it settled, fsynced, saying whether storage held those bytes then
(read without the server: the file, or the object straight from moto). Only
acknowledged files must be found on storage; a save that was recorded but
never acknowledged may land or not.

The journal is JSON lines; a line a SIGKILL cut short is ignored by
:func:`read_journal` (it can only be the last line an incarnation wrote).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import io
import json
import os
import random
import signal
import struct
import sys
import time
import zipfile

JOB = "soak"
KINDS = ("state", "torch", "bytes")  # tce.save, the patched torch.save, tce.objects.save_bytes
TORCH_KINDS = ("state", "torch")  # files in torch's zip format (tce.load reads them)
MIN_SIZE, MAX_SIZE = 4 << 10, 7 << 20  # above s3_part_size (5 MiB, tests/soak.py): multipart
SUBDIRS = ("d0", "d1", "d2")  # under each root; the soak makes the directory root's


def digest(kind: str, data: bytes) -> str:
    """What the journal records of a file's bytes: their SHA-256; for a torch
    file, with ``.data/serialization_id`` (its 40 bytes, and their CRC-32
    in the record's data descriptor and central directory entry) zeroed
    first: an id each save draws (torch's own from the content, TCE's at
    random, see tce/core/_layout.py). Every other byte counts."""
    if kind in TORCH_KINDS:
        data = _without_serialization_id(data)
    return hashlib.sha256(data).hexdigest()


_ID = "/.data/serialization_id"


def _without_serialization_id(data: bytes) -> bytes:
    """``data`` with the id's bytes and CRCs zeroed; unchanged when it is not
    a torch zip (then every byte counts)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            info = next(i for i in z.infolist() if i.filename.endswith(_ID))
            central = z.start_dir
    except (zipfile.BadZipFile, StopIteration, ValueError, EOFError, AttributeError):
        return data
    out = bytearray(data)
    at = info.header_offset
    if out[at:at + 4] != b"PK\x03\x04":
        return data
    name_len, extra_len = struct.unpack_from("<HH", out, at + 26)
    start = at + 30 + name_len + extra_len
    end = start + info.compress_size
    if out[end:end + 4] != b"PK\x07\x08":  # torch writes a data descriptor after each record
        return data
    out[start:end] = bytes(end - start)
    out[end + 4:end + 8] = bytes(4)
    while out[central:central + 4] == b"PK\x01\x02":  # the central directory's entries
        name_len, extra_len, comment_len = struct.unpack_from("<HHH", out, central + 28)
        if out[central + 46:central + 46 + name_len].endswith(_ID.encode()):
            out[central + 16:central + 20] = bytes(4)
            return bytes(out)
        central += 46 + name_len + extra_len + comment_len
    return data


@dataclasses.dataclass
class Save:
    """One save as the journal records it (before the save is made)."""
    n: int  # order of the save, over every incarnation of the writer
    root: str  # "dir" or "s3"
    path: str
    sha: str  # digest() of the bytes the file holds once saved
    size: int
    kind: str
    writer: int  # the incarnation that made it


@dataclasses.dataclass
class Journal:
    saves: dict[int, Save]
    acks: set[int]
    ack_mismatches: dict[int, str]  # acknowledged saves storage did not hold then: what it held
    fails: int  # saves that raised at once
    torn: int  # lines a SIGKILL cut short


def s3_client(endpoint: str):
    """boto3 for moto at ``endpoint`` (the soak's reads skip the fault proxy)."""
    import boto3
    from botocore.config import Config

    from tce.tools._moto import ACCESS_KEY, REGION, SECRET_KEY

    return boto3.client("s3", endpoint_url=endpoint, region_name=REGION,
                        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                        config=Config(s3={"addressing_style": "path"}))


def object_key(s3_root: str, path: str) -> str:
    """The key of ``path`` under the object root (its prefix: the job's name)."""
    return f"{JOB}/{os.path.relpath(path, s3_root)}"


def stored(s3, bucket: str, s3_root: str, save: Save) -> bytes | None:
    """The bytes storage holds at ``save.path`` (None: nothing), read
    without the server: the file, or the object from moto."""
    if save.root == "dir":
        try:
            with open(save.path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
    try:
        return s3.get_object(Bucket=bucket, Key=object_key(s3_root, save.path))["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None


def read_journal(path: str) -> Journal:
    """Every complete record of the journal at ``path``."""
    j = Journal({}, set(), {}, 0, 0)
    try:
        f = open(path, encoding="utf-8")
    except FileNotFoundError:
        return j
    with f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                j.torn += line.strip() != ""
                continue
            ev = rec.pop("ev", None)
            if ev == "save":
                j.saves[rec["n"]] = Save(**rec)
            elif ev == "ack":
                j.acks.add(rec["n"])
                if rec.get("stored", True) is not True:
                    j.ack_mismatches[rec["n"]] = rec["stored"]
            elif ev == "fail":
                j.fails += 1
    return j


def pool(dir_root: str, s3_root: str, names: int) -> list[tuple[str, str]]:
    """(root kind, path) of every path the writer may save: ``names`` per root."""
    out = []
    for root, base in (("dir", dir_root), ("s3", s3_root)):
        for i in range(names):
            ext = "bin" if i % 3 == 2 else "pt"
            out.append((root, os.path.join(base, SUBDIRS[i % len(SUBDIRS)], f"f{i:02d}.{ext}")))
    return out


def stamp(at: datetime.datetime | None = None) -> str:
    """UTC time as the server stamps its log lines (``...T12:00:00.123Z``)."""
    at = at or datetime.datetime.now(datetime.timezone.utc)
    return at.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def say(line: str) -> None:
    """A line of the writer's log."""
    print(f"{stamp()} {line}", flush=True)


class _JournalWriter:
    def __init__(self, path: str) -> None:
        self._f = open(path, "a", encoding="utf-8")
        if self._f.tell() > 0:  # a line cut short by a SIGKILL: the next starts afresh
            with open(path, "rb") as r:
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":
                    self._f.write("\n")

    def write(self, *records: dict) -> None:
        self._f.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records))
        self._f.flush()
        os.fsync(self._f.fileno())


def _content(rng: random.Random, kind: str, size: int, path: str, scratch: str):
    """(what to save at ``path``, the exact bytes the saved file holds)."""
    import torch
    from tce import buffers

    data = rng.randbytes(size)
    if kind == "bytes":
        return data, data
    if kind == "torch":
        obj = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    else:
        obj, cut, left = {"step": rng.randrange(1 << 30)}, 0, size
        for i in range(rng.randint(1, 4)):
            dtype = rng.choice((torch.float32, torch.bfloat16, torch.int64, torch.uint8))
            width = torch.empty(0, dtype=dtype).element_size()
            take = left if i == 3 else rng.randint(0, left)
            take -= take % width
            raw = torch.frombuffer(bytearray(data[cut:cut + take]), dtype=torch.uint8) if take else \
                torch.empty(0, dtype=torch.uint8)
            obj[f"t{i}"] = raw.view(dtype)
            cut, left = cut + take, left - take
    # torch's own save, to a file of the same name (torch names the records
    # inside the zip after the file): the bytes TCE must write too.
    twin = os.path.join(scratch, os.path.basename(path))
    buffers.torch_save(obj, twin)
    with open(twin, "rb") as f:
        data = f.read()
    os.unlink(twin)
    return obj, data


def _save(kind: str, root: str, path: str, obj, tag: str) -> None:
    import torch
    import tce
    from tce import client, objects

    # A save under the object root cannot fall back to a local write.
    with client.override(on_unavailable="raise" if root == "s3" else "fallback"):
        if kind == "state":
            tce.save(obj, path, tag=tag)
        elif kind == "torch":
            torch.save(obj, path)  # patched: through the cache (tag: the job's default)
        else:
            objects.save_bytes(path, obj, tag=tag)


def _wait(paths: list[str], budget: float) -> tuple[set[str], str]:
    """The paths ``tce.wait`` returned for, tried for up to ``budget``
    seconds while the server is away or an upload is slow (a FAILED file
    three times: the server writes some again by itself), and the last
    error seen."""
    import tce
    from tce.errors import PersistFailedError, TCEError

    deadline = time.monotonic() + budget
    todo, done, last, failed_rounds = list(paths), set(), "", 0
    while todo and time.monotonic() < deadline:
        try:
            tce.wait(todo, timeout=max(1.0, min(30.0, deadline - time.monotonic())))
            done.update(todo)
            break
        except PersistFailedError as e:  # the others were settled
            done.update(p for p in todo if p not in e.failures)
            todo, last = [p for p in todo if p in e.failures], f"{type(e).__name__}: {e}"
            failed_rounds += 1
            if failed_rounds >= 3 or all(r.startswith("lost") for r in e.failures.values()):
                break  # not written: the server gave up, or restarted before writing them
        except FileNotFoundError as e:  # neither held nor on storage: never acknowledged
            last = f"{type(e).__name__}: {e}"
            if e.filename not in todo:
                break
            todo.remove(e.filename)
            continue
        except (TCEError, OSError) as e:  # the server is away, or a wait ran out of time
            last = f"{type(e).__name__}: {e}"
        time.sleep(0.5)  # pacing: the server is restarting, or writes the failed file again
    return done, last


def _kill_server_if_asked(trigger: str, socket: str, n: int) -> None:
    """The soak's kill-server-after-save fault: SIGKILLs the server whose pid
    the soak wrote to ``trigger``, the instant a save returned."""
    try:
        with open(trigger) as f:
            pid = int(f.read())
        os.unlink(trigger)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if os.fsencode(socket) not in f.read().split(b"\0"):
                return  # not the server (it died by itself, and the pid went to another)
    except (FileNotFoundError, ValueError):
        return
    os.kill(pid, signal.SIGKILL)
    say(f"killed the server (pid {pid}) right after save {n} returned")


def run(args: argparse.Namespace) -> None:
    import tce
    from tce import client

    client.configure(socket=args.socket, job=JOB, rpc_timeout=30)
    tce.patch_torch([args.dir_root, args.s3_root])
    journal = _JournalWriter(args.journal)
    past = read_journal(args.journal)
    n = max(past.saves, default=-1) + 1
    rng = random.Random(f"{args.seed}/{args.incarnation}")
    s3 = s3_client(args.s3_endpoint)
    paths = pool(args.dir_root, args.s3_root, args.names)
    scratch = os.path.join(os.path.dirname(args.journal), f"scratch-{args.incarnation}")
    os.makedirs(scratch, exist_ok=True)  # in the soak's work dir: gone with it
    started, written, batch = time.monotonic(), 0, 0
    say(f"writer {args.incarnation}: from save {n}")
    while not os.path.exists(args.stop_file):
        batch += 1
        tag = f"w{args.incarnation}-b{batch}"
        saved: dict[str, Save] = {}
        for root, path in rng.sample(paths, rng.randint(1, 4)):
            kind = rng.choice(KINDS)
            size = int(MIN_SIZE * (MAX_SIZE / MIN_SIZE) ** rng.random())
            obj, data = _content(rng, kind, size, path, scratch)
            rec = Save(n, root, path, digest(kind, data), len(data), kind, args.incarnation)
            journal.write({"ev": "save", **dataclasses.asdict(rec)})
            try:
                _save(kind, root, path, obj, tag)
                saved[path] = rec
                written += len(data)
                _kill_server_if_asked(args.kill_trigger, args.socket, n)
            except Exception as e:  # noqa: BLE001 (any failed save: recorded, not acknowledged)
                journal.write({"ev": "fail", "n": n, "why": f"{type(e).__name__}: {e}"[:300]})
                say(f"save {n} {path}: {type(e).__name__}: {e}"[:400])
            n += 1
        if saved:
            done, last = _wait(list(saved), args.wait_budget)
            acks = []
            for p in sorted(done):  # storage must hold it now: no later save of it was made
                found = stored(s3, args.bucket, args.s3_root, saved[p])
                held = "missing" if found is None else digest(saved[p].kind, found)
                acks.append({"ev": "ack", "n": saved[p].n, "stored": held == saved[p].sha or held})
                if held != saved[p].sha:
                    say(f"save {saved[p].n} {p}: acknowledged, but storage holds {held}")
            if acks:
                journal.write(*acks)
            if len(done) < len(saved):
                say(f"batch {tag}: {len(saved) - len(done)} of {len(saved)} not acknowledged: "
                    f"{last}"[:400])
        ahead = written / args.rate - (time.monotonic() - started)
        if ahead > 0:
            time.sleep(min(ahead, 5.0))  # pacing: a few MB/s, so the soak is about faults
    os.rmdir(scratch)
    say(f"writer {args.incarnation}: stopped at save {n}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", required=True)
    p.add_argument("--dir-root", required=True)
    p.add_argument("--s3-root", required=True)
    p.add_argument("--journal", required=True)
    p.add_argument("--stop-file", required=True)
    p.add_argument("--seed", required=True)
    p.add_argument("--incarnation", type=int, required=True)
    p.add_argument("--s3-endpoint", required=True, help="moto itself (no faults): to read objects")
    p.add_argument("--bucket", required=True, help="the S3 root's bucket (prefix: the job's name)")
    p.add_argument("--kill-trigger", required=True,
                   help="a file the soak writes a server pid to: SIGKILL it after the next save")
    p.add_argument("--names", type=int, default=16, help="paths per root")
    p.add_argument("--rate", type=float, default=2 << 20, help="bytes per second, at most")
    p.add_argument("--wait-budget", type=float, default=90.0,
                   help="seconds one batch's tce.wait is tried for")
    run(p.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
