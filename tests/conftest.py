"""Shared fixtures: a real SQLite file and a real PostgreSQL server started by this session.

PostgreSQL must start: when it cannot, tests that need it fail (never skip), so CI notices.
"""

from __future__ import annotations

import itertools
import os

import pytest

from tests.support.pgserver import PgServer

_db_counter = itertools.count()


@pytest.fixture(scope="session")
def pg_server():
    server = PgServer().start()
    yield server
    server.stop()


@pytest.fixture
def pg_url(pg_server) -> str:
    """A fresh, empty PostgreSQL database for one test."""
    return pg_server.create_database(f"t{os.getpid()}_{next(_db_counter)}")


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    """A fresh SQLite file for one test."""
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path) -> str:
    """The same test on a SQLite file and on a PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def store(db_url):
    from twoclocks_cli.store import Store

    s = Store.open(db_url)
    yield s
    s.close()
