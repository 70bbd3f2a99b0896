"""Alembic migrations on both backends: empty → head, head → base → head, first-use race."""

import subprocess
import sys
import time

import pytest
from sqlalchemy import inspect

from tests.support.cli import assert_one_line_error, twoclocks
from twoclocks_cli.errors import StoreError
from twoclocks_cli.store import Store
from twoclocks_cli.store.engine import make_engine
from twoclocks_cli.store.migrate import (
    current_revision,
    downgrade,
    ensure_schema,
    head_revision,
    known_revisions,
    upgrade,
)

TABLES = {"sweeps", "runs", "metrics", "run_events"}


def _tables(engine):
    with engine.connect() as conn:
        return set(inspect(conn).get_table_names())


def test_empty_to_head_then_base_then_head(db_url):
    engine = make_engine(db_url)
    assert current_revision(engine) is None
    upgrade(engine)
    assert current_revision(engine) == head_revision()
    assert TABLES <= _tables(engine)
    downgrade(engine, "base")
    assert current_revision(engine) is None
    assert not (TABLES & _tables(engine))
    upgrade(engine)
    assert current_revision(engine) == head_revision()
    assert TABLES <= _tables(engine)


def test_db_commands_through_cli(db_url):
    up = twoclocks("db", "upgrade", "--db", db_url)
    assert up.returncode == 0, up.stderr
    cur = twoclocks("db", "current", "--db", db_url)
    assert f"revision {head_revision()}" in cur.stdout and "up to date" in cur.stdout
    down = twoclocks("db", "downgrade", "base", "--db", db_url)
    assert down.returncode == 0, down.stderr
    assert "empty" in twoclocks("db", "current", "--db", db_url).stdout
    assert_one_line_error(twoclocks("db", "downgrade", "nosuchrev", "--db", db_url),
                          "unknown revision 'nosuchrev'")


def test_out_of_date_database_says_upgrade(db_url):
    revisions = sorted(known_revisions())
    if len(revisions) < 2:
        pytest.fail("needs at least two revisions to have an out-of-date database")
    engine = make_engine(db_url)
    upgrade(engine)
    downgrade(engine, revisions[0])
    with pytest.raises(StoreError, match="run `twoclocks db upgrade`"):
        ensure_schema(engine)
    assert_one_line_error(twoclocks("runs", "list", "--db", db_url), "twoclocks db upgrade")
    assert twoclocks("db", "upgrade", "--db", db_url).returncode == 0
    assert twoclocks("runs", "list", "--db", db_url).returncode == 0


def test_first_use_migration_race_exactly_one_migrates(db_url):
    start_at = f"{time.time() + 3.0:.3f}"
    procs = [
        subprocess.Popen([sys.executable, "-m", "tests.support.workers", "migrate", db_url,
                          start_at], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(8)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outputs]
    verdicts = sorted(o[0].strip() for o in outputs)
    assert verdicts == ["MIGRATED"] + ["SKIPPED"] * 7
    assert current_revision(make_engine(db_url)) == head_revision()
    Store.open(db_url).list_runs()
