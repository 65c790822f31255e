"""Reading the server's metadata directly (no server needed): `tce ls --metadata`."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass


@dataclass(frozen=True)
class FileRow:
    job: str
    tag: str
    rank: int
    state: str
    size: int
    path: str
    reason: str


def read_files(url: str, *, job: str = "", tag: str = "") -> list[FileRow]:
    """Files recorded in the metadata store at `url` (sqlite:///abs/path.db)."""
    prefix = "sqlite://"
    if not url.startswith(prefix) or not url[len(prefix):].startswith("/"):
        raise ValueError(f"unsupported metadata URL {url!r} (expected sqlite:///abs/path.db)")
    path = url[len(prefix):]
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT job, tag, rank, state, size, path, reason FROM files "
            "WHERE (? = '' OR job = ?) AND (? = '' OR tag = ?) ORDER BY job, tag, path",
            (job, job, tag, tag),
        ).fetchall()
    finally:
        db.close()
    return [FileRow(*r) for r in rows]
