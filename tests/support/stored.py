"""What an import stored, read back with plain sqlite3 (an independent reader of the store)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tests.support.cli import twoclocks_inproc


def ingest(db: Path, *args: str) -> list[dict]:
    """`twoclocks ingest ARGS --json` into the SQLite file `db`, run in this process; its records
    (exit 0 asserted)."""
    proc = twoclocks_inproc("ingest", *args, "--db", f"sqlite:///{db}", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def metric_rows(db: Path, run_id: int, key: str) -> list[tuple]:
    """(step, samples, value) of one metric of one run, by step."""
    with sqlite3.connect(db) as con:
        return con.execute("select step, samples, value from metrics where run_id=? and key=? "
                           "order by step", (run_id, key)).fetchall()


def sql(db: Path, query: str, *args) -> list[tuple]:
    """The rows of one query on the SQLite file `db`."""
    with sqlite3.connect(db) as con:
        return con.execute(query, args).fetchall()


def dump(db: Path) -> list[str]:
    """The store's whole state as SQL text (nothing when there is no store yet): a refused
    input must leave it exactly as it was."""
    if not db.exists():
        return []
    con = sqlite3.connect(db)
    try:
        return list(con.iterdump())
    finally:
        con.close()


def empty_store(folder: Path) -> Path:
    """An empty twoclocks store in `folder`, its WAL folded into the file, so that a copy of
    the one file is the whole store."""
    from twoclocks_cli.store import Store

    path = folder / "s.db"
    Store.open(f"sqlite:///{path}").close()
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return path
