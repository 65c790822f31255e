"""The soak's verdict (tests/soak.py): every file the writer's journal says
``tce.wait`` acknowledged as durable is on storage with the bytes it saved,
and a fresh server loads it bit for bit.

The writer already looked at storage as each ``tce.wait`` returned (the
journal's ``ack`` records say what it found); a save storage did not hold
then is lost even if a later save of its path replaced it since. At the
end, for each path, the last acknowledged save is what storage must hold, unless
a later save of the path (recorded, never acknowledged: it may have landed)
holds what storage has. Storage is read without the server: the directory
root's file, and the object straight from moto with boto3 (not through the
fault proxy). Then the fresh server: ``tce.buffers.load_file`` of each torch
file must equal ``torch.load`` of the stored bytes, tensor bytes included,
and ``tce.objects.read_bytes`` (the server's own copy: its cache, or the
bucket) must be the stored bytes whenever it serves the file.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import os

from soak_writer import JOB, TORCH_KINDS, Journal, Save, digest, object_key, stored


@dataclasses.dataclass
class Loss:
    path: str
    root: str
    n: int  # the acknowledged save's order
    expected: str  # its digest (soak_writer.digest)
    found: str  # what storage holds ("missing": nothing), or "fresh server"
    detail: str


@dataclasses.dataclass
class Outcome:
    checked: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # by root
    exact: int = 0  # storage holds the last acknowledged bytes
    superseded: int = 0  # storage holds a later, unacknowledged save's bytes
    loaded: int = 0  # torch files the fresh server's tce.load gave bit for bit
    served: int = 0  # files whose bytes the fresh server served itself (cache or bucket)
    losses: list[Loss] = dataclasses.field(default_factory=list)

    def summary(self, journal: Journal) -> list[str]:
        n = sum(self.checked.values())
        return [f"  checked as tce.wait returned: {len(journal.acks)} acknowledged saves, "
                f"{len(journal.ack_mismatches)} not on storage then",
                f"  verified at the end: {n} paths with an acknowledged save ({self.checked['dir']} dir, "
                f"{self.checked['s3']} s3): {self.exact} hold the last acknowledged bytes, "
                f"{self.superseded} a later unacknowledged save's; fresh server: {self.loaded} "
                f"torch files loaded bit for bit, {self.served} files' bytes served by it equal",
                f"  lost: {len(self.losses) or 'nothing'}"]




def _plan(journal: Journal) -> list[tuple[Save, list[Save]]]:
    """(last acknowledged save, later saves) of each path with an acknowledged save."""
    by_path: dict[str, list[Save]] = collections.defaultdict(list)
    for s in journal.saves.values():
        by_path[s.path].append(s)
    out = []
    for path in sorted(by_path):
        saves = sorted(by_path[path], key=lambda s: s.n)
        acked = [s for s in saves if s.n in journal.acks]
        if acked:
            out.append((acked[-1], [s for s in saves if s.n > acked[-1].n]))
    return out


def corrupt(journal: Journal, s3, bucket: str, s3_root: str) -> list[tuple[str, str]]:
    """The self-check: flips one byte of one stored file per root (the first
    path, in order, whose stored bytes are its last acknowledged save's).
    Returns (path, root) of each."""
    done: dict[str, str] = {}
    for last, _ in _plan(journal):
        if last.root in done.values():
            continue
        data = stored(s3, bucket, s3_root, last)
        if data is None or digest(last.kind, data) != last.sha:
            continue
        bad = bytearray(data)
        bad[len(bad) // 2] ^= 0x5A
        if digest(last.kind, bytes(bad)) == last.sha:  # the one byte not counted: the serialization id
            continue
        if last.root == "dir":
            with open(last.path, "r+b") as f:
                f.write(bad)
        else:
            s3.put_object(Bucket=bucket, Key=object_key(s3_root, last.path), Body=bytes(bad))
        done[last.path] = last.root
    return sorted(done.items())


def verify(journal: Journal, s3, bucket: str, s3_root: str, socket: str) -> Outcome:
    """Checks every acknowledged path on storage, then through the fresh
    server at ``socket``."""
    import torch
    from helpers import assert_same
    from tce import buffers, client, objects

    out = Outcome()
    at_ack: dict[int, Loss] = {}
    for n, held in sorted(journal.ack_mismatches.items()):  # the writer's look, as tce.wait returned
        save = journal.saves[n]
        at_ack[n] = Loss(save.path, save.root, n, save.sha, held,
                         "storage did not hold it when tce.wait returned")
        out.losses.append(at_ack[n])
    good: list[tuple[Save, bytes]] = []
    for last, later in _plan(journal):
        out.checked[last.root] += 1
        data = stored(s3, bucket, s3_root, last)
        match = None if data is None else \
            next((s for s in [last, *later] if digest(s.kind, data) == s.sha), None)
        if match is None:
            found = "missing" if data is None else \
                f"{len(data)} bytes, digest {digest(last.kind, data)[:16]}"
            if last.n in at_ack:
                at_ack[last.n].detail += f", nor at the end ({found})"
            else:
                out.losses.append(Loss(last.path, last.root, last.n, last.sha, found,
                                       "storage holds neither it nor any of "
                                       f"{len(later)} later save(s)"))
            continue
        if match is last:
            out.exact += 1
        else:
            out.superseded += 1
        good.append((match, data))
    with client.session(socket, job=JOB, rpc_timeout=60, on_unavailable="raise"):
        for save, data in good:
            try:
                if save.kind in TORCH_KINDS:
                    got, _ = buffers.load_file(save.path, weights_only=False)
                    assert_same(got, torch.load(io.BytesIO(data), weights_only=False))
                    out.loaded += 1
                served = objects.read_bytes(save.path)
                if served is not None:
                    assert served == data, (f"it served {len(served)} bytes, digest "
                                            f"{digest(save.kind, served)[:16]}, not the stored ones")
                    out.served += 1
                elif save.root == "s3":
                    raise AssertionError("it could not read the object")
            except Exception as e:  # noqa: BLE001 (any failure to load it is a loss)
                out.losses.append(Loss(save.path, save.root, save.n, save.sha, "fresh server",
                                       f"{type(e).__name__}: {e}"[:500]))
    return out


def log_lines(path: str, needles: tuple[str, ...]) -> list[str]:
    """The lines of a log that mention any of ``needles``."""
    try:
        with open(path, errors="replace") as f:
            return [line.rstrip() for line in f if any(n in line for n in needles)]
    except OSError:
        return []
