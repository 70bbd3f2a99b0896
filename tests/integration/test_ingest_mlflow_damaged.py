"""A damaged or older MLflow store given to `twoclocks ingest`: refused in one line on stderr,
MLflow's own logging included, so these run the real CLI process with MLflow at its most
talkative; the store, the source and the working folder stay as they were. The nested sweep
they damage is tests/support/mlflow_family.py's; its imports are
tests/unit/test_ingest_mlflow_nested.py's.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.support.cli import assert_one_line_error, twoclocks
from tests.support.mlflow_family import content, digest, ingest, write_family

pytest.importorskip("mlflow")
pytestmark = pytest.mark.subprocess  # the real CLI process


@pytest.fixture(scope="module")
def family(tmp_path_factory) -> Path:
    """The nested MLflow sweep of tests/support/mlflow_family.py, written once."""
    return write_family(tmp_path_factory.mktemp("mlflow") / "mlflow.db")


def _damaged(family: Path, folder: Path, table: str) -> Path:
    db = folder / f"no-{table}.db"
    shutil.copy(family, db)
    con = sqlite3.connect(db)
    con.execute(f"drop table {table}")
    con.commit()
    con.close()
    return db


def _older(family: Path, folder: Path) -> tuple[Path, str]:
    """A copy migrated one revision down by MLflow's own alembic migrations; its revision."""
    from alembic import command
    from mlflow.store.db.utils import _get_alembic_config

    db = folder / "older.db"
    shutil.copy(family, db)
    command.downgrade(_get_alembic_config(f"sqlite:///{db}"), "-1")
    con = sqlite3.connect(db)
    rev = con.execute("select version_num from alembic_version").fetchone()[0]
    con.close()
    return db, rev


def _refused_alone(source: list[str], cwd: Path, url: str, *needles: str) -> None:
    """The real CLI refuses `source` in one stderr line, leaving the twoclocks store, the
    source and the working folder as they were."""
    before, files = content(url), sorted(p.name for p in cwd.iterdir())
    proc = twoclocks("ingest", *source, "--sweep", "nested", "--db", url, cwd=cwd,
                     env={"MLFLOW_LOGGING_LEVEL": "INFO"})  # MLflow at its most talkative
    assert_one_line_error(proc, *needles)
    assert proc.stdout == ""
    assert content(url) == before
    assert sorted(p.name for p in cwd.iterdir()) == files


@pytest.mark.parametrize("table, form", [
    ("latest_metrics", "path"),  # MLflow logs the failed query with its traceback, then raises
    ("latest_metrics", "uri"),
    ("metrics", "uri"),  # MLflow would create the tables it misses: refused, read-only
    ("params", "path"),
])
def test_a_store_missing_a_table_is_refused_in_one_line(family, tmp_path, table, form):
    url = f"sqlite:///{tmp_path / 'tc.db'}"
    assert ingest(family, url, "--run", "other/*")[0] == 0  # a store with a run in it
    db = _damaged(family, tmp_path, table)
    before = digest(db)
    source = [str(db)] if form == "path" else ["--from", f"mlflow:sqlite:///{db}"]
    _refused_alone(source, tmp_path, url, f"it lacks MLflow's table {table}",
                   "only read, never migrated or repaired")
    assert digest(db) == before


def test_an_older_schema_is_refused_in_one_line_and_not_migrated(family, tmp_path):
    import mlflow

    url = f"sqlite:///{tmp_path / 'tc.db'}"
    assert ingest(family, url, "--run", "other/*")[0] == 0
    db, rev = _older(family, tmp_path)
    before = digest(db)
    _refused_alone([str(db)], tmp_path, url,
                   f"an MLflow store of an older schema (revision {rev}; mlflow "
                   f"{mlflow.__version__} reads", "never migrated", "mlflow db upgrade")
    assert digest(db) == before
