"""Alembic migrations run from inside the package; first-use migration guarded by one lock.

Many jobs of a SLURM array may open one empty database at the same instant. Exactly one of them
migrates: PostgreSQL serialises on an advisory lock, SQLite on an OS file lock beside the file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import Engine, inspect, text
from sqlalchemy.exc import DBAPIError, OperationalError

from twoclocks_cli.core.errors import StoreError
from twoclocks_cli.store.engine import describe_db_error, mask_url

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
_PG_LOCK_KEY = int(hashlib.sha1(b"twoclocks-migrate").hexdigest()[:15], 16)


def _config(connection=None):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(_migrations_dir()))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def _migrations_dir() -> Path:
    """The shipped migrations (installed package, or the repository's `migrations/`)."""
    import twoclocks_cli.migrations as pkg

    return Path(pkg.__file__).resolve().parent


def head_revision() -> str:
    """The newest revision this twoclocks knows."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config()).get_current_head()


def known_revisions() -> set[str]:
    from alembic.script import ScriptDirectory

    return {s.revision for s in ScriptDirectory.from_config(_config()).walk_revisions()}


def current_revision(engine: Engine) -> str | None:
    """The revision stamped in the database, or None when it has never been migrated."""
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table("alembic_version"):
                return None
            return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    except (OperationalError, DBAPIError) as exc:
        raise StoreError(describe_db_error(exc, engine.url)) from None


def _run(engine: Engine, fn, revision: str) -> None:
    """Run alembic command `fn` to `revision` on one connection, mapping DB errors and
    alembic's refusals (e.g. a store stamped with a revision this version does not know)."""
    from alembic.util import CommandError

    try:
        with engine.connect() as conn:
            fn(_config(conn), revision)
            conn.commit()
    except (OperationalError, DBAPIError) as exc:
        raise StoreError(describe_db_error(exc, engine.url)) from None
    except CommandError as exc:
        stamped = current_revision(engine)
        if stamped is not None and stamped not in known_revisions():
            raise StoreError(f"the store is at revision {stamped!r}, which this twoclocks does "
                             "not know (written by a newer version?); upgrade twoclocks") from None
        raise StoreError(f"cannot migrate to {revision!r}: {exc}") from None


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate forward to `revision` (default: head); a database that is not ours is refused."""
    from alembic import command

    if revision not in ("head", "heads") and revision not in known_revisions() \
            and not revision.lstrip("+").isdigit():
        allowed = ", ".join(["head", *sorted(known_revisions())])
        raise StoreError(f"unknown revision {revision!r}: known revisions are {allowed}")
    with migration_lock(engine):
        _refuse_foreign(engine)
        _run(engine, command.upgrade, revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Migrate back to `revision` ('base' empties the schema)."""
    from alembic import command
    from alembic.util import CommandError

    if revision != "base" and revision not in known_revisions() and not revision.startswith("-"):
        allowed = ", ".join(sorted(known_revisions()) + ["base"])
        raise StoreError(f"unknown revision {revision!r}: known revisions are {allowed}")
    with migration_lock(engine):
        try:
            _run(engine, command.downgrade, revision)
        except CommandError as exc:
            raise StoreError(f"cannot downgrade to {revision!r}: {exc}") from None


@contextlib.contextmanager
def migration_lock(engine: Engine) -> Iterator[None]:
    """Hold the store-wide migration lock (advisory lock on PostgreSQL, flock on SQLite)."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_LOCK_KEY})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK_KEY})
                conn.commit()
        return
    db = engine.url.database
    if not db or db == ":memory:":
        yield
        return
    lock_path = Path(db + ".migrate-lock")
    try:
        handle = open(lock_path, "a+")
    except OSError as exc:
        raise StoreError(f"cannot create lock file {lock_path}: {exc.strerror}") from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _tables(engine: Engine) -> list[str]:
    """The tables of the database's default schema (SQLite: of the main file)."""
    try:
        with engine.connect() as conn:
            return sorted(inspect(conn).get_table_names())
    except (OperationalError, DBAPIError) as exc:
        raise StoreError(describe_db_error(exc, engine.url)) from None


def _refuse_foreign(engine: Engine) -> None:
    """Refuse a database whose tables are not twoclocks' (never add our tables beside them)."""
    rev = current_revision(engine)
    tables = [t for t in _tables(engine) if t != "alembic_version"]
    if rev is None and tables:
        shown = ", ".join(tables[:5]) + (f" and {len(tables) - 5} more" if len(tables) > 5 else "")
        raise StoreError(
            f"database {mask_url(engine.url)} has tables ({shown}) but no twoclocks revision: "
            "it is not a twoclocks store; use another --db"
        )
    if rev is not None and rev not in known_revisions() and "runs" not in tables:
        raise StoreError(
            f"database {mask_url(engine.url)} is stamped with alembic revision {rev!r}, which is "
            "not twoclocks', and has no runs table: it is not a twoclocks store; use another --db"
        )


def ensure_schema(engine: Engine) -> bool:
    """Make the database usable: migrate an empty one, refuse an out-of-date one.

    Returns True when this call performed the first-use migration (exactly one caller does).
    """
    head = head_revision()
    rev = current_revision(engine)
    if rev == head:
        return False
    if rev is None:
        with migration_lock(engine):
            if current_revision(engine) is not None:
                return ensure_schema(engine)  # another process migrated while we waited
            _refuse_foreign(engine)
            from alembic import command

            _run(engine, command.upgrade, "head")
        return True
    if rev in known_revisions():
        # an older revision may be one step of a migration in progress (each revision commits on
        # its own): wait for the lock, then look again before calling the store out of date
        with migration_lock(engine):
            if current_revision(engine) == head:
                return False
        raise StoreError(
            f"database {mask_url(engine.url)} is at revision {rev}, this twoclocks needs {head}: "
            "run `twoclocks db upgrade`"
        )
    _refuse_foreign(engine)
    raise StoreError(
        f"database {mask_url(engine.url)} is at revision {rev}, unknown to this twoclocks "
        f"(head {head}): it was written by a newer twoclocks; upgrade twoclocks"
    )
