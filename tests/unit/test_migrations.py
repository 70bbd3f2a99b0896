"""Alembic migrations on both backends: empty → head, head → base → head, first-use race."""

import subprocess
import sys
import time

import pytest
from sqlalchemy import inspect

from tests.support.cli import assert_one_line_error, twoclocks_inproc
from twoclocks_cli.core.errors import StoreError
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
    up = twoclocks_inproc("db", "upgrade", "--db", db_url)
    assert up.returncode == 0, up.stderr
    cur = twoclocks_inproc("db", "current", "--db", db_url)
    assert f"revision {head_revision()}" in cur.stdout and "up to date" in cur.stdout
    down = twoclocks_inproc("db", "downgrade", "base", "--db", db_url)
    assert down.returncode == 0, down.stderr
    assert "empty" in twoclocks_inproc("db", "current", "--db", db_url).stdout
    assert_one_line_error(twoclocks_inproc("db", "downgrade", "nosuchrev", "--db", db_url),
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
    assert_one_line_error(twoclocks_inproc("runs", "list", "--db", db_url), "twoclocks db upgrade")
    assert twoclocks_inproc("db", "upgrade", "--db", db_url).returncode == 0
    assert twoclocks_inproc("runs", "list", "--db", db_url).returncode == 0


@pytest.mark.subprocess  # eight processes race to migrate one store
def test_first_use_migration_race_exactly_one_migrates(db_url):
    start_at = f"{time.time() + 3.0:.3f}"
    procs = [
        subprocess.Popen([sys.executable, "-m", "tests.support.workers", "migrate", db_url,
                          start_at], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(8)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    failed = [(p.returncode, *o) for p, o in zip(procs, outputs, strict=True) if p.returncode]
    assert not failed, failed
    verdicts = sorted(o[0].strip() for o in outputs)
    assert verdicts == ["MIGRATED"] + ["SKIPPED"] * 7
    assert current_revision(make_engine(db_url)) == head_revision()
    Store.open(db_url).list_runs()


def test_a_store_seen_mid_migration_waits_instead_of_calling_itself_out_of_date(db_url):
    """Each revision commits on its own, so a process opening the store between two of them sees
    an older revision: it must wait for the migrator's lock and find head, not ask for
    `twoclocks db upgrade` (the race a first-use migration of 8 processes once hit in CI)."""
    import threading

    from alembic import command

    from twoclocks_cli.store.migrate import _run, ensure_schema, migration_lock

    first = sorted(known_revisions())[0]
    engine = make_engine(db_url)
    halfway, results = threading.Event(), []

    def migrator():
        with migration_lock(make_engine(db_url)):
            _run(engine, command.upgrade, first)
            halfway.set()
            time.sleep(1.5)
            _run(engine, command.upgrade, "head")

    thread = threading.Thread(target=migrator)
    thread.start()
    assert halfway.wait(60)
    assert current_revision(engine) == first  # what the second process sees on opening
    try:
        results.append(ensure_schema(make_engine(db_url)))
    finally:
        thread.join()
    assert results == [False] and current_revision(engine) == head_revision()


def test_the_models_match_the_migrations(db_url):
    """After `upgrade head`, Alembic's autogenerate finds nothing to add, drop or retype: the
    SQLAlchemy models and the migration scripts describe the same schema (both backends)."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from twoclocks_cli.store.models import Base

    engine = make_engine(db_url)
    upgrade(engine)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == [], diff
