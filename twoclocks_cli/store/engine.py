"""Database URLs and engines: selection order, masking, SQLite pragmas, connection errors."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, OperationalError

from twoclocks_cli.errors import StoreError

DEFAULT_URL = "sqlite:///twoclocks.db"
ENV_VAR = "TWOCLOCKS_DB"
SQLITE_BUSY_TIMEOUT_MS = 60_000


def resolve_url(cli_value: str | None = None) -> str:
    """Pick the database: `--db URL` > `$TWOCLOCKS_DB` > `sqlite:///twoclocks.db` in the cwd."""
    return cli_value or os.environ.get(ENV_VAR) or DEFAULT_URL


def mask_url(url: str | URL) -> str:
    """Render a URL with its password replaced by ***, safe to print."""
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except ArgumentError:
        text_url = str(url)
        if "@" in text_url and "://" in text_url:
            scheme, rest = text_url.split("://", 1)
            creds, host = rest.rsplit("@", 1)
            user = creds.split(":", 1)[0]
            return f"{scheme}://{user}:***@{host}"
        return text_url
    return parsed.render_as_string(hide_password=True)


def parse_url(url: str) -> URL:
    """Parse and normalise a URL; PostgreSQL goes through psycopg 3. Raises StoreError."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StoreError(
            f"malformed database URL {mask_url(url)!r}: expected e.g. sqlite:///path/to.db "
            "or postgresql://user:pass@host:5432/dbname"
        ) from None
    backend = parsed.get_backend_name()
    if backend == "postgresql" and parsed.get_driver_name() in ("psycopg2", "psycopg", ""):
        parsed = parsed.set(drivername="postgresql+psycopg")
    elif backend not in ("sqlite", "postgresql"):
        raise StoreError(
            f"unsupported database {mask_url(parsed)!r}: use sqlite:///FILE or postgresql://..."
        )
    return parsed


def _sqlite_pragmas(engine: Engine) -> None:
    """WAL, a long busy timeout and BEGIN IMMEDIATE so concurrent writers queue, never fail."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_engine(url: str) -> Engine:
    """Create an engine for `url` and prove it can be used; every failure is a StoreError."""
    parsed = parse_url(url)
    masked = mask_url(parsed)
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if db and db != ":memory:":
            path = Path(db)
            if path.parent and not path.parent.exists():
                raise StoreError(f"database directory {path.parent} does not exist ({masked})")
            if path.exists() and not os.access(path, os.W_OK):
                raise StoreError(f"database file {path} is read-only ({masked})")
        engine = create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        _sqlite_pragmas(engine)
    else:
        try:
            engine = create_engine(
                parsed,
                pool_pre_ping=True,
                connect_args={"connect_timeout": 10},
            )
        except NoSuchModuleError:
            raise StoreError(f"no driver for {masked}") from None
        except ModuleNotFoundError:
            raise StoreError(
                f"PostgreSQL needs psycopg 3: pip install 'twoclocks[postgres]' ({masked})"
            ) from None
    check_connection(engine)
    return engine


def describe_db_error(exc: BaseException, url: str | URL) -> str:
    """One line saying what went wrong with the database at `url` (password masked)."""
    orig = getattr(exc, "orig", None) or exc
    first = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    low = first.lower()
    masked = mask_url(url)
    if "password authentication failed" in low or "authentication failed" in low:
        return f"database {masked}: authentication failed ({first})"
    if "connection refused" in low or "could not connect" in low or "timeout" in low:
        return f"cannot reach database {masked}: {first}"
    if "readonly" in low or "read-only" in low:
        return f"database {masked} is read-only: {first}"
    if "does not exist" in low:
        return f"database {masked}: {first}"
    return f"database {masked}: {first}"


def check_connection(engine: Engine) -> None:
    """Open one connection and run a trivial query; map failures to a one-line StoreError."""
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except (OperationalError, DBAPIError) as exc:
        engine.dispose()
        raise StoreError(describe_db_error(exc, engine.url)) from None
