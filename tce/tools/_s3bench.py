"""``tce bench --s3``: a checkpoint to and from S3 through TCE, against boto3.

One run, one endpoint: moto's S3 server on loopback (:mod:`tce.tools._moto`,
a process of its own), a bucket made for the run, and one ``--size`` object's
worth of random bytes (a file in tmpfs for boto3, the same bytes as one
uint8 tensor for TCE). Each figure is the median, min and max of
``--repeats`` runs:

* boto3: ``upload_file`` of the file and ``download_file`` to a file
  (``TransferConfig`` defaults), every download checked against the source;
* TCE: a tce-server whose storage root maps to ``s3://<bucket>/tce``
  (credentials in its environment); ``tce.save`` of the tensor, then
  ``tce.wait`` until it is durable in S3 (the wait alone, from the save's
  return, and the save and the wait together); the bucket must then hold an
  object of at least that size. Then a cold load: a new server with the
  same settings and nothing cached, ``tce.load`` of the path and a read of
  every byte, checked against the source; the path never exists on local
  disk, so the bytes can only come from S3.

moto keeps objects in its own memory and reads a whole object for each
ranged GET, so the absolute figures are moto's more than S3's; the ratios
compare two clients of the same endpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Iterator

import torch

import tce
from tce import api, client, objects
from tce.tools import _moto
from tce.tools._server import LocalServer

BUCKET = "tce-bench"
PREFIX = "tce"
PARTS = ("boto3", "tce")
_BLOCK = 64 << 20


@contextlib.contextmanager
def _part(name: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    finally:
        print(f"tce bench --s3: {name} took {time.perf_counter() - t0:.1f} s", file=sys.stderr,
              flush=True)


def _stats(res: dict[str, Any], key: str, seconds: list[float], nbytes: int) -> None:
    med = statistics.median(seconds)
    res[f"{key}_s"] = med
    res[f"{key}_min_s"] = min(seconds)
    res[f"{key}_max_s"] = max(seconds)
    res[f"{key}_GBps"] = nbytes / med / 1e9


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def _sha256_tensor(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy()).hexdigest()


def _touch(t: torch.Tensor) -> None:
    """Reads every byte (a loaded tensor may map bytes not yet faulted in)."""
    flat = t.view(torch.uint8).reshape(-1)
    n = flat.numel() // 8 * 8
    flat[:n].view(torch.int64).sum()
    flat[n:].sum()


def _boto3_upload(s3: Any, src: str, key: str, crc32: bool) -> float:
    """One ``upload_file`` (``TransferConfig`` defaults; with ``crc32``,
    ``ChecksumAlgorithm=CRC32``, the checks TCE has S3 make); its seconds."""
    from boto3.s3.transfer import TransferConfig

    extra = {"ChecksumAlgorithm": "CRC32"} if crc32 else None
    t0 = time.perf_counter()
    s3.upload_file(src, BUCKET, key, Config=TransferConfig(), ExtraArgs=extra)
    return time.perf_counter() - t0


def _boto3_download(s3: Any, key: str, digest: str, directory: str) -> float:
    from boto3.s3.transfer import TransferConfig

    dst = os.path.join(directory, "boto3-download.bin")
    t0 = time.perf_counter()
    s3.download_file(BUCKET, key, dst, Config=TransferConfig())
    took = time.perf_counter() - t0
    if _sha256_file(dst) != digest:
        raise RuntimeError("tce bench --s3: boto3's download differs from what it uploaded")
    os.unlink(dst)
    return took


def _server(root: str, moto: _moto.MotoServer, budget: int, extra: list[str]) -> LocalServer:
    """A tce-server whose ``root`` is the bucket's ``tce/`` prefix on moto."""
    return LocalServer(
        memory_budget=str(budget), storage_roots=[f"{root}=s3://{BUCKET}/{PREFIX}"],
        extra_args=["--s3-endpoint", moto.endpoint, "--s3-path-style", "true", *extra],
        env=_moto.credentials_env()).start()


def _s3_object_bytes(s3: Any) -> int:
    """The largest object under the TCE prefix (0: none)."""
    listing = s3.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX + "/")
    return max((int(o["Size"]) for o in listing.get("Contents", [])), default=0)


def _tce_upload(data: torch.Tensor, path: str) -> tuple[float, float]:
    """``tce.save`` of the tensor, then ``tce.wait`` until durable in S3:
    (the save's seconds, the wait's)."""
    t0 = time.perf_counter()
    tce.save({"x": data}, path)
    t1 = time.perf_counter()
    tce.wait([path], timeout=3600)
    return t1 - t0, time.perf_counter() - t1


def _uploads(s3: Any, moto: _moto.MotoServer, src: str, data: torch.Tensor, directory: str,
             repeats: int, clients: tuple[str, ...], server_args: list[str]) -> dict[str, Any]:
    """The uploads of every client, in rounds: one unmeasured upload each
    first (connections, moto's first multipart), then `repeats` rounds, the
    clients' order reversed every other round, each object deleted after
    its round, so no client meets a moto the others left fuller."""
    res: dict[str, Any] = {}
    nbytes = data.numel()
    root = os.path.join(directory, "ckpt")
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, "x.pt")
    times: dict[str, list[float]] = {k: [] for k in ("boto3_upload", "boto3_crc32_upload", "tce_save",
                                                       "tce_persist", "tce_durable")}
    server = _server(root, moto, 3 * nbytes + (256 << 20), server_args) if "tce" in clients else None
    try:
        with contextlib.ExitStack() as stack:
            if server is not None:
                stack.enter_context(client.override(socket=server.socket, on_unavailable="raise"))
            for round_ in range(repeats + 1):
                order = list(clients) if round_ % 2 else list(reversed(clients))
                for who in order:
                    if who == "tce":
                        save, persist = _tce_upload(data, path)
                        if round_:
                            times["tce_save"].append(save)
                            times["tce_persist"].append(persist)
                            times["tce_durable"].append(save + persist)
                        stored = _s3_object_bytes(s3)
                        if stored < nbytes:
                            raise RuntimeError(f"tce bench --s3: after tce.wait the bucket holds no object of "
                                               f"{nbytes} bytes under {PREFIX}/ (largest: {stored})")
                        if os.path.exists(path):
                            raise RuntimeError(f"tce bench --s3: {path} exists on local disk: the root is not in S3")
                        if round_ < repeats:  # the last one stays, for the loads
                            objects.delete_object(path)
                    else:
                        crc32 = who == "boto3_crc32"
                        took = _boto3_upload(s3, src, f"boto3/{who}.bin", crc32)
                        if round_:
                            times[f"{who}_upload"].append(took)
                        if round_ < repeats or crc32:
                            s3.delete_object(Bucket=BUCKET, Key=f"boto3/{who}.bin")
            if server is not None:
                res["tce_file_bytes"] = int(next(f.size for f in client.files("") if f.path == path))
                api.close()
    finally:
        if server is not None:
            server.stop()
            server.cleanup()
    for key, seconds in times.items():
        if seconds:
            _stats(res, key, seconds, nbytes)
    return res


def _downloads(s3: Any, moto: _moto.MotoServer, digest: str, directory: str, nbytes: int, repeats: int,
               clients: tuple[str, ...], server_args: list[str]) -> dict[str, Any]:
    """boto3's ``download_file`` and TCE's cold load (each with a new server:
    nothing cached, no metadata; every byte read and checked), in rounds."""
    res: dict[str, Any] = {}
    path = os.path.join(directory, "ckpt", "x.pt")
    times: dict[str, list[float]] = {"boto3_download": [], "tce_cold_load": []}
    for round_ in range(repeats):
        order = list(clients) if round_ % 2 else list(reversed(clients))
        for who in order:
            if who == "boto3":
                times["boto3_download"].append(_boto3_download(s3, "boto3/boto3.bin", digest, directory))
            elif who == "tce":
                server = _server(os.path.dirname(path), moto, 3 * nbytes + (256 << 20), server_args)
                try:
                    with client.override(socket=server.socket, on_unavailable="raise"):
                        t0 = time.perf_counter()
                        loaded = tce.load(path, weights_only=True)
                        _touch(loaded["x"])
                        times["tce_cold_load"].append(time.perf_counter() - t0)
                        if _sha256_tensor(loaded["x"]) != digest:
                            raise RuntimeError("tce bench --s3: the cold load differs from what was saved")
                        del loaded
                        api.close()
                finally:
                    server.stop()
                    server.cleanup()
    for key, seconds in times.items():
        if seconds:
            _stats(res, key, seconds, nbytes)
    return res


def run(size: int, *, repeats: int, directory: str, skip: tuple[str, ...] = (),
        server_args: list[str] | None = None) -> dict[str, Any]:
    nbytes = max(4096, size // 4096 * 4096)
    res: dict[str, Any] = {
        "bytes": nbytes, "repeats": repeats, "moto": importlib.metadata.version("moto"),
        "boto3": importlib.metadata.version("boto3"), "torch": torch.__version__}
    gen = torch.Generator().manual_seed(27)
    data = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)
    digest = _sha256_tensor(data)
    src = os.path.join(directory, "source.bin")
    data.numpy().tofile(src)
    clients = tuple(c for c in ("boto3", "boto3_crc32", "tce")
                    if c.split("_")[0] not in skip)
    # moto spools what it keeps to temp files: into the run's directory
    # (tmpfs by default), so neither client waits on a disk.
    with _moto.MotoServer(log_path=os.path.join(directory, "moto.log"), env={"TMPDIR": directory}) as moto:
        res["endpoint"] = moto.endpoint
        moto.make_bucket(BUCKET)
        s3 = moto.boto3()
        try:
            with _part("uploads"):
                res.update(_uploads(s3, moto, src, data, directory, repeats, clients, list(server_args or ())))
            os.unlink(src)
            with _part("downloads"):
                res.update(_downloads(s3, moto, digest, directory, nbytes, repeats,
                                      tuple(c for c in clients if c != "boto3_crc32"), list(server_args or ())))
        except Exception as e:
            res["error"] = f"{type(e).__name__}: {e}"
            tail = moto.log()[-2000:]
            res["moto_log_tail"] = tail
    if "boto3_upload_s" in res and "tce_persist_s" in res:
        res["tce_upload_vs_boto3"] = res["boto3_upload_s"] / res["tce_persist_s"]
        res["tce_durable_vs_boto3_upload"] = res["boto3_upload_s"] / res["tce_durable_s"]
    if "boto3_crc32_upload_s" in res and "tce_persist_s" in res:
        res["tce_upload_vs_boto3_crc32"] = res["boto3_crc32_upload_s"] / res["tce_persist_s"]
    if "boto3_download_s" in res and "tce_cold_load_s" in res:
        res["tce_download_vs_boto3"] = res["boto3_download_s"] / res["tce_cold_load_s"]
    return res


def rows(res: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(group, name, key, note) of each figure the run has."""
    def vs(key: str, what: str) -> str:
        return f"{res[key]:.2f}x boto3 {what}" if key in res else ""

    out = [
        ("upload", "boto3 upload_file (defaults)", "boto3_upload", ""),
        ("upload", "boto3 upload_file, CRC-32 checked", "boto3_crc32_upload", ""),
        ("upload", "tce.save (into the cache)", "tce_save", ""),
        ("upload", "tce: save's return -> durable in S3", "tce_persist",
         ", ".join(x for x in (vs("tce_upload_vs_boto3", "upload_file"),
                               vs("tce_upload_vs_boto3_crc32", "CRC-32")) if x)),
        ("upload", "tce.save + wait (durable in S3)", "tce_durable",
         vs("tce_durable_vs_boto3_upload", "upload_file")),
        ("download", "boto3 download_file (defaults)", "boto3_download", ""),
        ("download", "tce.load, new server (from S3)", "tce_cold_load",
         vs("tce_download_vs_boto3", "download_file")),
    ]
    return [r for r in out if f"{r[2]}_s" in res]


def render(res: dict[str, Any]) -> str:
    out = [f"S3: moto {res['moto']} at {res.get('endpoint', '?')} (loopback), boto3 "
           f"{res['boto3']}; one object of {res['bytes'] / 2**30:.2f} GiB; median (min-max) "
           f"of {res['repeats']} runs",
           f"{'':9s}{'':38s} {'seconds':>8s} {'(min-max)':>16s} {'GB/s':>7s}"]
    for group, name, key, note in rows(res):
        spread = f"({res[key + '_min_s']:.2f}-{res[key + '_max_s']:.2f})"
        out.append(f"{group:9s}{name:38s} {res[key + '_s']:8.3f} {spread:>16s} "
                   f"{res[key + '_GBps']:7.3f}  {note}".rstrip())
    if "error" in res:
        out.append(f"FAILED: {res['error']}")
    return "\n".join(out)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--s3", action="store_true",
                   help="instead: a checkpoint to S3 and back through TCE against boto3's "
                        "upload_file/download_file, both against moto's S3 server on loopback "
                        "(needs moto[server] and boto3); --skip boto3 or tce leaves a half out")
    p.add_argument("--s3-server-arg", action="append", default=[], metavar="ARG",
                   help="with --s3: an argument for the tce-servers (repeat it; e.g. "
                        "--s3-server-arg=--s3-part-size=64MiB)")


def main(size: int, repeats: int, as_json: bool, directory: str | None, skip: str,
         server_args: list[str]) -> int:
    parts = tuple(x for x in skip.split(",") if x)
    unknown = [x for x in parts if x not in PARTS]
    if unknown:
        raise SystemExit(f"tce bench --s3: --skip takes {', '.join(PARTS)}, not {', '.join(unknown)}")
    try:
        _moto.require("tce bench --s3")
    except _moto.MissingDependency as e:
        raise SystemExit(str(e)) from None
    # The source file lives in tmpfs (page cache) unless told otherwise.
    where = directory or ("/dev/shm" if os.path.isdir("/dev/shm") else None)
    with tempfile.TemporaryDirectory(prefix="tce-s3bench-", dir=where) as d:
        res = run(size, repeats=repeats, directory=d, skip=parts, server_args=server_args)
    print(json.dumps(res, indent=2) if as_json else render(res))
    sys.stdout.flush()
    if "error" in res:
        if as_json:
            print(f"tce bench --s3: {res['error']}", file=sys.stderr)
        return 1
    return 0
