"""Reading the server's metadata directly (no server needed): `tce ls --metadata`.

A reader of the stored format, not a second definition of it: the schema
and its migrations live in the server (server_cpp/src/meta/schema.h), which
Python cannot import. This module reads only the files table's columns
named by `FileRow`'s fields, which every schema version has had, and passes
the stored state names through: they are the tce.v1.FileState names without
the FILE_STATE_ prefix (the server's gtest file_state_test.cc holds them to it).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, fields
from urllib.parse import unquote, urlsplit

from tce.errors import FailedPreconditionError


@dataclass(frozen=True)
class FileRow:
    job: str
    tag: str
    rank: int
    state: str
    size: int
    path: str
    reason: str


def _query(quote: str, param: str) -> str:
    """The files of one job and tag ('' for any), as `FileRow`s, in order.

    `quote` quotes a column name (`rank` is reserved in MySQL), `param` is
    the driver's placeholder; each filter's parameter is passed twice."""
    columns = ", ".join(f"{quote}{f.name}{quote}" for f in fields(FileRow))
    return (f"SELECT {columns} FROM files WHERE ({param} = '' OR job = {param}) "
            f"AND ({param} = '' OR tag = {param}) ORDER BY job, tag, path")


def _read_mysql(url: str, job: str, tag: str) -> list[FileRow]:
    import pymysql  # only for mysql:// URLs

    u = urlsplit(url)
    db = pymysql.connect(host=u.hostname, port=u.port or 3306, user=unquote(u.username or ""),
                         password=unquote(u.password or ""), database=u.path.lstrip("/"),
                         connect_timeout=5)
    try:
        with db.cursor() as cur:
            cur.execute(_query("`", "%s"), (job, job, tag, tag))
            return [FileRow(*r) for r in cur.fetchall()]
    finally:
        db.close()


def read_files(url: str, *, job: str = "", tag: str = "") -> list[FileRow]:
    """Files recorded in the metadata store at `url`
    (sqlite:///abs/path.db or mysql://user:pass@host:port/db)."""
    if url.startswith("mysql://"):
        return _read_mysql(url, job, tag)
    prefix = "sqlite://"
    if not url.startswith(prefix) or not url[len(prefix):].startswith("/"):
        raise ValueError(f"unsupported metadata URL {url!r} "
                         "(sqlite:///abs/path.db or mysql://user:pass@host:port/db)")
    path = url[len(prefix):]
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
    try:
        rows = db.execute(_query('"', "?"), (job, job, tag, tag)).fetchall()
    except sqlite3.OperationalError as e:
        if "locked" not in str(e):
            raise
        # The server holds its SQLite database exclusively while it runs.
        raise FailedPreconditionError(
            f"{path} is held by a running tce-server; ask the server instead (tce ls without "
            "--metadata)") from None
    finally:
        db.close()
    return [FileRow(*r) for r in rows]
