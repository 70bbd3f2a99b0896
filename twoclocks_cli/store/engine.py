"""Database URLs and engines: selection order, masking, SQLite pragmas, connection errors."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, OperationalError

from twoclocks_cli.core.errors import StoreError

DEFAULT_URL = "sqlite:///twoclocks.db"
ENV_VAR = "TWOCLOCKS_DB"
SQLITE_BUSY_TIMEOUT_MS = 60_000


def resolve_url(cli_value: str | None = None) -> str:
    """Pick the database: `--db URL` > `$TWOCLOCKS_DB` > `sqlite:///twoclocks.db` in the cwd.

    An empty `--db` is an error (never a silent fall-back to the default); an empty
    $TWOCLOCKS_DB counts as unset, as in the shell.
    """
    if cli_value is not None and not cli_value.strip():
        raise StoreError(f"--db {cli_value!r}: empty database URL; give e.g. "
                         "sqlite:///path/to.db or postgresql://user:pass@host:5432/dbname")
    return cli_value or os.environ.get(ENV_VAR) or DEFAULT_URL


def mask_url(url: str | URL) -> str:
    """Render a URL with its password replaced by ***, safe to print."""
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except (ArgumentError, ValueError):
        text_url = str(url)
        if "@" in text_url and "://" in text_url:
            scheme, rest = text_url.split("://", 1)
            creds, host = rest.rsplit("@", 1)
            user = creds.split(":", 1)[0]
            return f"{scheme}://{user}:***@{host}"
        return text_url
    return parsed.render_as_string(hide_password=True)


_EXAMPLE = "expected e.g. sqlite:///path/to.db or postgresql://user:pass@host:5432/dbname"


def parse_url(url: str) -> URL:
    """Parse and normalise a URL; PostgreSQL goes through psycopg 3. Raises StoreError."""
    if not url.strip():
        raise StoreError(f"empty database URL: {_EXAMPLE}")
    if "\x00" in url:
        raise StoreError(f"database URL {mask_url(url)!r} contains a NUL character")
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StoreError(f"malformed database URL {mask_url(url)!r}: {_EXAMPLE}") from None
    except ValueError:  # sqlalchemy parses the port with int()
        raise StoreError(f"malformed database URL {mask_url(url)!r}: the port (after host:) must "
                         f"be a number; {_EXAMPLE}") from None
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise StoreError(f"database URL {mask_url(parsed)!r}: port {parsed.port} is not in "
                         "1..65535")
    # from the name itself: get_backend_name() loads the dialect (NoSuchModuleError for http://)
    backend, _, driver = parsed.drivername.partition("+")
    if backend == "postgresql" and driver in ("psycopg2", "psycopg", ""):
        parsed = parsed.set(drivername="postgresql+psycopg")
    elif backend == "sqlite" and driver in ("pysqlite", ""):
        pass
    elif backend in ("sqlite", "postgresql"):
        raise StoreError(f"unsupported driver in {mask_url(parsed)!r}: use sqlite:///FILE or "
                         "postgresql://... (psycopg 3)")
    else:
        raise StoreError(
            f"unsupported database {mask_url(parsed)!r}: use sqlite:///FILE or postgresql://..."
        )
    return parsed


def check_url(url: str) -> URL:
    """Everything about `url` that can be checked without connecting (StoreError naming it)."""
    parsed = parse_url(url)
    if parsed.get_backend_name() == "sqlite":
        _check_sqlite_path(parsed)
    return parsed


def _check_sqlite_path(parsed: URL) -> None:
    """The file of a SQLite URL is a path the OS accepts, in an existing folder, writable."""
    from twoclocks_cli.core.limits import path_problem

    db, masked = parsed.database, mask_url(parsed)
    if not db or db == ":memory:" or db.startswith("file:"):
        return
    problem = path_problem(db, reserve=len(".migrate-lock"))
    if problem:
        raise StoreError(f"database file of {masked[:80]!r}: {problem}")
    path = Path(db)
    try:
        if not path.parent.is_dir():
            raise StoreError(f"database directory {path.parent} does not exist ({masked})")
        if path.is_dir():
            raise StoreError(f"database file {path} is a folder ({masked})")
        if path.exists() and not os.access(path, os.W_OK):
            raise StoreError(f"database file {path} is read-only ({masked})")
        if path.is_file() and path.stat().st_size > 0:
            _check_sqlite_file(path, masked)
    except PermissionError as err:  # a folder on the way that this user may not enter
        where = err.filename or path
        raise StoreError(f"database file {path}: permission denied on {where} ({masked})"
                         ) from None


def is_in_memory(url: str) -> bool:
    """Whether `url` is an in-memory SQLite database (gone when the process exits)."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return False
    if not parsed.drivername.startswith("sqlite"):
        return False
    db = parsed.database or ""
    return db in ("", ":memory:") or "mode=memory" in db or \
        parsed.query.get("mode") == "memory"


def _check_sqlite_file(path: Path, masked: str) -> None:
    """Refuse a file that is not SQLite, or SQLite with tables but no alembic_version, before
    our connection switches it to WAL mode (that would change someone else's file)."""
    import sqlite3
    from urllib.parse import quote

    try:
        con = sqlite3.connect(f"file:{quote(str(path.absolute()))}?mode=ro", uri=True)
        try:
            names = {row[0] for row in con.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")}
        finally:
            con.close()
    except sqlite3.Error as exc:
        raise StoreError(f"database {masked}: {exc}") from None
    if names and "alembic_version" not in names:
        tables = sorted(names)
        shown = ", ".join(tables[:5]) + (f" and {len(tables) - 5} more" if len(tables) > 5 else "")
        raise StoreError(f"database {masked} has tables ({shown}) but no twoclocks revision: it "
                         "is not a twoclocks store; use another --db")


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
    parsed = check_url(url)
    masked = mask_url(parsed)
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        _sqlite_pragmas(engine)
    else:
        from sqlalchemy.pool import NullPool

        from twoclocks_cli.store import pgretry

        try:
            engine = create_engine(  # no pool: a connection lives only while it is used
                parsed,
                poolclass=NullPool,
                connect_args={"connect_timeout": 10},
            )
            pgretry.install(engine)
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


def store_identity(url) -> str:
    """The store's URL without its password; a relative SQLite path made absolute: what a
    workdir's and a checkpoint's owner record name the store by."""
    parsed = make_url(url) if isinstance(url, str) else url
    db = parsed.database
    if parsed.get_backend_name() == "sqlite" and db and db != ":memory:" and \
            not db.startswith("file:"):
        parsed = parsed.set(database=str(Path(db).resolve()))
    return mask_url(parsed)
