"""The ``tce`` command."""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import sys
import time
from typing import Any, Sequence

from tce import api, client, objects
from tce.errors import PersistFailedError, TCEError
from tce.tools import _bench, _demo, _doctor, _vllm_cli, _wait_progress
from tce.tools._server import server_binary
from tce.v1 import tce_pb2 as pb


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _cmd_server(args: argparse.Namespace, rest: Sequence[str]) -> int:
    binary = server_binary()
    os.execv(binary, [binary, *rest])
    return 1  # not reached


def _persist_lines(st: dict[str, Any]) -> list[str]:
    """The persistence part of `tce status`: each storage root, directory
    (``storage_roots``) and object storage (``object_roots``) alike, with
    its queue, what was written to it and what failed (``roots``), then the
    counters of all roots together, and those of object storage."""
    dirs, buckets = st.get("storage_roots") or [], st.get("object_roots") or []
    if not dirs and not buckets:
        return ["persist   off (no storage_roots): files live in memory only"]
    lines = []
    for r in st.get("roots") or []:
        n = {k: int(r.get(k, 0)) for k in ("queued_files", "queued_bytes", "written_files", "written_bytes",
                                           "failed_files", "retries", "held_markers")}
        line = (f"{'object root ' + r['root'] + '=' + r['url'] if r.get('url') else 'directory root ' + r['root']}: "
                f"queue {n['queued_files']} ({_human(n['queued_bytes'])}), "
                f"{n['written_files']} written ({_human(n['written_bytes'])}), {n['failed_files']} FAILED")
        if r.get("url"):
            line += f", {n['retries']} request(s) retried, {n['held_markers']} tag marker(s) held"
        lines.append(line)
    if not lines:  # a server that reports no figures by root
        lines = [f"directory root {r}" for r in dirs] + [f"object root {r}" for r in buckets]
    lines.append(f"all roots: queue {st['persist_queue']}, "
                 f"{st['persisted_files']} written ({_human(int(st['persisted_bytes']))}), "
                 f"{st['failed_files']} FAILED, {st['evicted_files']} evicted")
    if buckets:
        lines.append(f"all object roots: {st.get('objects_fetched', 0)} object(s) fetched "
                     f"({_human(int(st.get('object_bytes_fetched', 0)))}), "
                     f"{st.get('object_ranges_read', 0)} ranged read(s), "
                     f"{st.get('object_fetches_shared', 0)} load(s) shared a fetch, "
                     f"{st.get('object_retries', 0)} request(s) retried, "
                     f"{st.get('held_markers', 0)} tag marker(s) held, "
                     f"{st.get('marker_rounds', 0)} round(s) asking the ring")
    return ["persist   " + lines[0]] + ["          " + line for line in lines[1:]]


def _operation_lines(st: dict[str, Any]) -> list[str]:
    """The operations under way (``operations``), one line each: what runs
    for which job, the files and bytes done of the total (where known),
    the rate and the time so far. A finished one is not listed."""
    lines = []
    for op in st.get("operations") or []:
        n = {k: int(op.get(k, 0)) for k in ("files_done", "files_total", "files_failed", "bytes_done",
                                            "bytes_total")}
        secs = float(op.get("elapsed_s", 0))
        what = f"{op['kind']} job={op['job']}"
        what += f" tag={op['tag']}" if op.get("tag") else ""
        what += f" from={op['from']}" if op.get("from") else ""
        files = f"{n['files_done']}/{n['files_total']}" if n["files_total"] else f"{n['files_done']}"
        done = _human(n["bytes_done"]) + (f"/{_human(n['bytes_total'])}" if n["bytes_total"] else "")
        rate = f"{_human(n['bytes_done'] / secs)}/s" if secs > 0 else "-"
        failed = f" ({n['files_failed']} failed)" if n["files_failed"] else ""
        lines.append(f"running   {what}: {files} files{failed}, {done}, {rate}, {secs:.0f} s")
    return lines


def _reader_lines(st: dict[str, Any]) -> list[str]:
    """Per job whose versions readers lease (``version_readers``): how far
    the oldest lease is behind the newest version."""
    lines = []
    for r in st.get("version_readers") or []:
        newest, oldest = int(r.get("newest_version", 0)), int(r.get("oldest_leased", 0))
        lines.append(f"readers   job {r['job']}: {r.get('leases', 0)} lease(s), oldest on version {oldest}, "
                     f"newest {newest} ({max(newest - oldest, 0)} behind)")
    return lines


def _cmd_status(args: argparse.Namespace) -> int:
    st = api.status()
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    budget, used = int(st["budget_bytes"]), int(st["used_bytes"])
    print(f"tce-server {st['version']} pid {st['pid']} on {st['socket']}, up {float(st['uptime_s']):.0f}s")
    print(f"memory    {_human(used)} used of {_human(budget)} budget "
          f"({100 * used / budget if budget else 0:.1f}%)")
    print(f"          cached {_human(int(st['cached_bytes']))}, pending {_human(int(st['pending_bytes']))}, "
          f"free for reuse {_human(int(st['free_bytes']))}")
    print(f"buffers   {st['buffers']} live, {st['buffers_created']} created, {st['buffers_reused']} reuses")
    fallbacks = int(st.get("hugetlb_fallbacks", 0))
    print(f"pages     {st.get('memory_backing') or '4k'}: {st.get('huge_page_buffers', 0)} buffer(s) on huge pages"
          + (f", {fallbacks} made with 4 KiB pages (no huge page left)" if fallbacks else ""))
    if int(st.get("pool_target_bytes", 0)):
        print(f"pool      {_human(int(st['pool_bytes']))} pre-faulted of {_human(int(st['pool_target_bytes']))}; "
              f"{st['pool_taken']} new buffer(s) from it, {st['pool_missed']} while it was empty")
    print(f"files     {st['files']}   sessions {st['sessions']}   leases {st['leases']}   "
          f"version leases {st.get('version_leases', 0)}")
    print(f"records   {_human(int(st.get('metadata_bytes', 0)))} of {_human(int(st.get('metadata_budget', 0)))} "
          "(metadata_budget): tags, job names, read grants, version leases")
    if st.get("metadata_url"):
        health = "healthy" if st.get("metadata_healthy") else f"DEGRADED: {st.get('metadata_error')}"
        print(f"metadata  {st['metadata_url']} ({health}, {st.get('metadata_queue', 0)} queued)")
    else:
        print("metadata  none")
    for line in _persist_lines(st):
        print(line)
    if st.get("peer_endpoint"):
        print(f"ring      peer {st['peer_endpoint']} ({st.get('ring_transport', 'tcp')}); "
              f"backup queue {st['backup_queue']} "
              f"({_human(int(st['backup_lag_bytes']))} behind), {st['backed_up_files']} backed up, "
              f"{st['backup_failures']} failed attempts"
              + (f" (last: {st['backup_error']})" if st.get("backup_error") else ""))
        if int(st.get("backup_failing", 0)):
            print(f"          BACKUPS FAILING: {st['backup_failing']} attempts in a row; files cached "
                  "here have no copy on the next node")
        print(f"          holding {st['held_backups']} predecessor file(s), "
              f"{_human(int(st['held_backup_bytes']))} of {_human(int(st['backup_budget_bytes']))}, "
              f"and {st.get('held_tags', 0)} of its complete tag(s)")
        print(f"          {st.get('recovered_files', 0)} file(s) recovered from the ring, "
              f"{st.get('ring_checksum_mismatches', 0)} copies refused against metadata's CRCs, "
              f"{st.get('remote_reads', 0)} remote read(s), "
              f"{st.get('remote_misses', 0)} held by no peer")
    else:
        print("ring      off (no peer_listen)")
    for f in st.get("followed_jobs", []):
        version = f"version {f['version']}" if int(f.get("version", 0)) else "no version yet"
        line = f"follow    job {f['job']}: {version} from {', '.join(f.get('sources', []))}; "
        if f.get("state") == "FOLLOW_STATE_RETRYING":
            line += (f"RETRYING in {float(f.get('retry_in_s', 0)):.1f}s after {f['failures']} failed round(s) "
                     f"(last: {f.get('last_error', '')})")
        else:
            line += "following"
        print(line)
    for j in st.get("job_loads", []):
        print(f"loads     job {j['job']}: {_human(int(j.get('cache_bytes', 0)))} from this node's memory, "
              f"{_human(int(j.get('peer_bytes', 0)))} from other nodes', "
              f"{_human(int(j.get('storage_bytes', 0)))} read from storage "
              f"({_human(int(j.get('for_peers_bytes', 0)))} of it for other nodes)")
    for line in _reader_lines(st) + _operation_lines(st):
        print(line)
    ops = [f"metrics http://{st['metrics_endpoint']}/metrics" if st.get("metrics_endpoint") else "",
           f"gRPC health {st['health_endpoint']}" if st.get("health_endpoint") else ""]
    print("ops       " + ("; ".join(o for o in ops if o) or "no metrics or health endpoint"))
    return 0


def _tags_shown(files: list[pb.FileInfo]) -> dict[tuple[str, str], str]:
    """The tag to show for each (job, path): the file's own, else, for a file
    saved without one (the patched torch.save), the newest recorded tag that
    names it as saved now (its size, recorded after its commit), as
    ``weights.publish(tag, paths)`` records one."""
    shown = {(f.job, f.path): f.tag for f in files if f.tag}
    untagged = {(f.job, f.path): f for f in files if not f.tag}
    for job in sorted({job for job, _ in untagged}):
        try:
            recorded = client.tags(job)  # oldest first: the newest naming a file wins
        except TCEError:
            continue
        for t in recorded:
            for tf in t.files:
                f = untagged.get((job, tf.path))
                if f is not None and tf.size == f.size and t.complete_unix_ns >= f.committed_unix_ns:
                    shown[(job, tf.path)] = t.tag
    return shown


def _cmd_ls(args: argparse.Namespace) -> int:
    rows = [("JOB", "TAG", "RANK", "STATE", "SIZE", "PATH")]
    if args.metadata:  # straight from the metadata store: works with no server

        for f in client.metadata_files(args.metadata, job=args.job or "", tag=args.tag or ""):
            rows.append((f.job, f.tag or "-", str(f.rank), f.state, _human(f.size), f.path))
    else:
        files = client.files(args.job or "")
        shown = _tags_shown(files)
        for f in files:
            tag = shown.get((f.job, f.path), "")
            if args.tag and tag != args.tag:
                continue
            state = pb.FileState.Name(f.state).removeprefix("FILE_STATE_")
            rows.append((f.job, tag or "-", str(f.rank), state, _human(f.size), f.path))
    if args.json:
        print(json.dumps([dict(zip((h.lower() for h in rows[0]), r)) for r in rows[1:]], indent=2))
        return 0
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    print(f"{len(rows) - 1} file(s)")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    path = os.path.abspath(args.path)
    if args.metadata:
        rows = [f for f in client.metadata_files(args.metadata, job=args.job or "") if f.path == path]
        if not rows:
            print(f"tce show: {path} is not recorded in {args.metadata}", file=sys.stderr)
            return 1
        for f in rows:
            print(f"path      {f.path}\njob       {f.job}\ntag       {f.tag or '-'}\n"
                  f"rank      {f.rank}\nstate     {f.state}\nsize      {f.size} ({_human(f.size)})")
            if f.reason:
                print(f"reason    {f.reason}")
        return 0
    files = [f for f in client.files(args.job or "")
             if f.path == path]
    if not files:
        print(f"tce show: the server knows no file {path}", file=sys.stderr)
        return 1

    def when(ns: int) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9)) if ns else "-"

    shown = _tags_shown(files)
    for f in files:
        print(f"path      {f.path}\njob       {f.job}\ntag       {shown.get((f.job, f.path)) or '-'}\n"
              f"rank      {f.rank}")
        print(f"state     {pb.FileState.Name(f.state).removeprefix('FILE_STATE_')}")
        print(f"size      {f.size} ({_human(f.size)}), buffer {f.buffer_id or '-'}")
        print(f"created   {when(f.created_unix_ns)}\ncommitted {when(f.committed_unix_ns)}\n"
              f"persisted {when(f.persisted_unix_ns)}")
        if f.reason:
            print(f"reason    {f.reason}")
        for r in f.records:
            print(f"  record {r.name}  offset {r.data_offset}  size {r.size}  crc32 {r.crc32:08x}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    return _bench.main(args)


def _cmd_demo(args: argparse.Namespace) -> int:
    return _demo.main(args)


def _matching(paths: list[str], job: str | None) -> list[pb.FileInfo]:
    """The server's files at `paths` (absolute), in `job` or any job."""
    wanted = {os.path.abspath(p) for p in paths}
    return [f for f in client.files(job or "") if f.path in wanted]


def _cmd_retry(args: argparse.Namespace) -> int:
    if args.all:
        jobs = [args.job] if args.job else sorted({f.job for f in client.files("")
                                                   if f.state == pb.FILE_STATE_FAILED})
        retried = [f for job in jobs for f in client.retry(job=job)]
    else:
        files = _matching(args.paths, args.job)
        if not files:
            raise SystemExit(f"tce retry: the server knows none of {' '.join(args.paths)}")
        by_job: dict[str, list[str]] = {}
        for f in files:
            by_job.setdefault(f.job, []).append(f.path)
        retried = [f for job, paths in sorted(by_job.items()) for f in client.retry(paths, job=job)]
    for f in retried:
        print(f"retrying  {f.path} (job {f.job})")
    return 0


def _on_storage(path: str, job: str | None) -> bool:
    """Whether storage holds ``path``: its directory root's filesystem, or
    the bucket of its object root (asked through the server, as ``job``)."""
    if not objects.is_object_path(path):
        return os.path.exists(path)
    return any(p == path for p, _ in objects.stored_files(os.path.dirname(path), job=job))


def _cmd_wait(args: argparse.Namespace) -> int:
    paths = [os.path.abspath(p) for p in args.paths]
    by_job: dict[str, list[str]] = {}
    for f in _matching(paths, args.job):
        by_job.setdefault(f.job, []).append(f.path)
    held = {p for ps in by_job.values() for p in ps}
    code = 0
    for p in paths:
        if p not in held:  # written directly, or persisted and forgotten: only storage can say
            if _on_storage(p, args.job):
                print(f"durable   {p} (not in the cache)")
            else:
                print(f"missing   {p}: neither in the cache nor on storage", file=sys.stderr)
                code = 1
    progress = (_wait_progress.WaitProgress(sys.stderr, by_job, _human)
                if by_job and _wait_progress.shown(args.progress, sys.stderr) else None)
    for job, ps in sorted(by_job.items()):
        failed: dict[str, str] = {}
        try:
            if progress is None:
                api.wait(ps, timeout=args.timeout, job=job)
            else:
                progress.wait(ps, job=job, timeout=args.timeout)
        except PersistFailedError as e:
            failed = e.failures
        finally:
            if progress is not None:
                progress.clear()

        now = {f.path: f for f in _matching(ps, job)}
        for p in ps:
            if p in failed:
                print(f"failed    {p}: {failed[p]}", file=sys.stderr)
                code = 1
            elif p in now and now[p].state == pb.FILE_STATE_DISCARDED:
                print(f"discarded {p}: {now[p].reason}")  # settled: its path was removed
            else:
                print(f"durable   {p}")
    return code


def _cmd_drop(args: argparse.Namespace) -> int:
    files = _matching(args.paths, args.job)
    if not files:
        raise SystemExit(f"tce drop: the server knows none of {' '.join(args.paths)}")
    for f in files:
        api.remove(f.path, job=f.job)
        print(f"dropped   {f.path} (job {f.job}); storage keeps what it had")
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    return _doctor.main(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tce", description="TCE checkpoint cache")
    p.add_argument("--socket", help="server socket (default: $TCE_SOCKET or /run/tce/tce.sock)")
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("server", help="run tce-server (arguments go to the server; try --help)",
                   add_help=False)

    s = sub.add_parser("status", help="show the server's memory, buffers and sessions")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("ls", help="list the files the server knows")
    s.add_argument("--job")
    s.add_argument("--tag")
    s.add_argument("--metadata", metavar="URL",
                   help="read this metadata store (sqlite:///path/tce.db) instead of asking the server")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("show", help="one file: state, times, reason, records and CRCs")
    s.add_argument("path")
    s.add_argument("--job")
    s.add_argument("--metadata", metavar="URL", help="read the metadata store instead of the server")

    s = sub.add_parser("retry", help="persist FAILED files again now")
    s.add_argument("paths", nargs="*", metavar="PATH")
    s.add_argument("--job", help="only this job's files")
    s.add_argument("--all", action="store_true", help="every FAILED file (of --job, or of every job)")

    s = sub.add_parser("wait", help="block until files are on storage (durable)")
    s.add_argument("paths", nargs="+", metavar="PATH")
    s.add_argument("--job", help="only this job's files")
    s.add_argument("--timeout", type=float, default=None, help="seconds (default: as long as it takes)")
    s.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show the files and bytes left and the rate on stderr, one line redrawn "
                        "(default: when stderr is a terminal)")

    s = sub.add_parser("drop", help="let go of cached files (a FAILED one is then never persisted)")
    s.add_argument("paths", nargs="+", metavar="PATH")
    s.add_argument("--job", help="only this job's files")

    s = sub.add_parser("bench", help="save/load throughput against torch.save/torch.load")
    _bench.add_arguments(s)

    s = sub.add_parser("doctor", help="the fabric devices and providers the ring would use")
    _doctor.add_arguments(s)

    s = sub.add_parser("demo", help="train, crash, resume from the cache; print the timings")
    _demo.add_arguments(s)

    s = sub.add_parser("vllm", help="vLLM engines that take their weights from TCE")
    _vllm_cli.add_arguments(s)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one ``tce`` command; its exit status. Output into a pipe whose
    reader went away (``tce status | head -1``) ends the command quietly,
    with the status a shell gives a command SIGPIPE killed (141)."""
    try:
        code = _run(argv)
        sys.stdout.flush()  # a reader that went away shows here, not at the interpreter's exit
        return code
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # another pipe or socket of the command's: a failure to report
        # What is still buffered goes nowhere: the interpreter flushes stdout
        # again at exit, and would report the broken pipe.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 128 + signal.SIGPIPE


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe (or socket) no one reads any more: poll
    reports an error condition on the writing end once every reader closed."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced or closed: not a pipe of ours
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "server":  # everything else goes to the daemon untouched
        if args.socket:
            rest = ["--socket", args.socket, *rest]
        return _cmd_server(args, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.socket:
        client.configure(socket=args.socket)
    if args.command == "retry" and bool(args.paths) == bool(args.all):
        parser.error("retry takes PATH... or --all")
    handler = {"status": _cmd_status, "ls": _cmd_ls, "show": _cmd_show, "bench": _cmd_bench,
               "demo": _cmd_demo, "doctor": _cmd_doctor, "retry": _cmd_retry, "drop": _cmd_drop,
               "wait": _cmd_wait, "vllm": _vllm_cli.main}
    try:
        return handler[args.command](args)
    except TCEError as e:
        print(f"tce {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
