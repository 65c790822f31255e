"""The persistence rows of ``tce bench`` (:mod:`tce.tools._bench`): time
from commit to persisted through a server whose storage root is on the
bench's filesystem, against what the disk itself does with the same bytes
there (``dd conv=fsync``; fio's O_DIRECT writes, 4 MiB, 16 in flight;
``torch.save`` and fsync), each run paired with the persist it is compared
with."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import time
from typing import Any

import torch

import tce
from tce import api, client
from tce.tools._server import LocalServer
from tce.tools._workload import TINY, median_s, time_s


def _quiesce() -> None:
    """Lets the disk settle before a timed write: what earlier runs left
    (dirty pages, and the discards of the files they freed, which ext4
    mounted with ``discard`` issues at its next journal commit) is written
    now, not inside the next timing. Each timed run of the persistence
    rows, the persist and every floor alike, starts from here."""
    os.sync()


def _dd(path: str, nbytes: int) -> float:
    """Seconds for `dd conv=fsync` to write nbytes (16 MiB blocks) to path."""
    count = max(1, nbytes // (16 << 20))
    t0 = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=16M", f"count={count}", "conv=fsync"],
                   check=True, capture_output=True)
    seconds = time.perf_counter() - t0
    os.unlink(path)
    return seconds * nbytes / (count * (16 << 20))


# fio's figure for the disk: O_DIRECT writes of 4 MiB, 16 in flight (libaio),
# one fsync at the end; what a writer that keeps the disk busy gets.
FIO_BS = 4 << 20
FIO_NOTE = "fio O_DIRECT 4 MiB iodepth 16"


def _fio(path: str, nbytes: int) -> float:
    """Seconds for fio to write nbytes to path: O_DIRECT, 4 MiB blocks, 16
    in flight (libaio), fsync at the end; from fio's own bandwidth figure."""
    size = max(1, nbytes // FIO_BS) * FIO_BS
    try:
        out = subprocess.run(
            ["fio", "--name=w", f"--filename={path}", "--rw=write", f"--bs={FIO_BS}", "--iodepth=16",
             "--ioengine=libaio", "--direct=1", f"--size={size}", "--end_fsync=1",
             "--output-format=json"], check=True, capture_output=True, text=True).stdout
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    write = json.loads(out[out.index("{"):])["jobs"][0]["write"]  # fio may print notes first
    return nbytes / write["bw_bytes"]


def persistence(sd: dict[str, torch.Tensor], nbytes: int, *, repeats: int,
                 directory: str) -> dict[str, Any]:
    """Time-to-persisted through a server with `directory` as storage root,
    against dd conv=fsync and fio (O_DIRECT) of the same bytes on the same
    filesystem."""
    res: dict[str, Any] = {}
    fio = shutil.which("fio") is not None
    if not fio:
        res["fio_missing"] = "fio not found on PATH (make setup installs it)"
    root = os.path.join(directory, "storage")
    os.makedirs(root)
    server = LocalServer(memory_budget=str(4 * nbytes + (256 << 20)), storage_roots=[root]).start()
    try:
        with client.override(socket=server.socket, on_unavailable="raise"):
            a, b = os.path.join(root, "a.pt"), os.path.join(root, "b.pt")
            for p in (a, b):  # warm both buffers
                tce.save(sd, p)
            tce.wait()
            # Pairs (persist, dd, fio) in turn: a disk's speed drifts, so only
            # ratios taken side by side mean something.
            persist, dd, fio_s, during, durable, torch_fsync = [], [], [], [], [], []
            for _ in range(repeats):
                _quiesce()
                t_save = time.perf_counter()
                tce.save(sd, a)
                t0 = time.perf_counter()
                tce.wait([a])
                persist.append(time.perf_counter() - t0)
                durable.append(time.perf_counter() - t_save)  # patch_torch(durable=True)
                _quiesce()
                torch_fsync.append(time_s(lambda: torch_save_fsync(sd, os.path.join(root, "t.pt"))))
                _quiesce()
                dd.append(_dd(os.path.join(root, "dd.bin"), nbytes))
                if fio:
                    _quiesce()
                    fio_s.append(_fio(os.path.join(root, "fio.bin"), nbytes))
                tce.save(sd, a)  # a's persistence now runs in the background...
                t0 = time.perf_counter()
                tce.save(sd, b)  # ...while this save blocks the "training rank"
                during.append(time.perf_counter() - t0)
                tce.wait()
            res["tce_persist_s"] = statistics.median(persist)
            res["dd_fsync_s"] = statistics.median(dd)
            res["persist_vs_dd"] = statistics.median(d / p for p, d in zip(persist, dd))
            if fio:
                res["fio_direct_s"] = statistics.median(fio_s)
                res["persist_vs_fio"] = statistics.median(f / p for p, f in zip(persist, fio_s))
            res["tce_save_while_persisting_s"] = statistics.median(during)
            res["tce_durable_s"] = statistics.median(durable)
            res["durable_vs_torch_fsync"] = statistics.median(t / d for d, t in zip(durable, torch_fsync))
            # A load of a persisted file first compares it with storage.
            tiny = os.path.join(root, "tiny.pt")
            tce.save(TINY, tiny)
            tce.wait([tiny])
            res["tiny_load_checked_s"] = median_s(lambda: tce.load(tiny), 200)
            api.close()
    finally:
        server.stop()
        server.cleanup()
    return res


def torch_save_fsync(sd: dict[str, torch.Tensor], path: str) -> None:
    torch.save(sd, path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
