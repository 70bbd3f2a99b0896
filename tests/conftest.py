"""Shared fixtures: a real SQLite file and a real PostgreSQL server started by this session.

PostgreSQL must start: when it cannot, tests that need it fail (never skip), so CI notices.

`make test` runs the suite on two pytest-xdist workers (`-n 2`, `--dist loadgroup`; see
pyproject's addopts). The hooks below keep that sound and fast on a 2-core machine:

- each worker, and every process it starts, uses 1 torch/BLAS thread (OMP_NUM_THREADS=1):
  two workers with 2 threads each on 2 cores oversubscribe the OpenMP pools. A config's own
  `threads` (the exact-resume tests) and the tiny model's build (2 threads, trainer/tiny.py)
  still set theirs explicitly;
- tests that share a cluster or a port run on one worker (`xdist_group`): the SLURM tests (one
  2-CPU node: two workers' arrays would queue behind each other into the tests' timeouts);
  modules whose module-scoped fixture is expensive keep it to one worker (built once, not twice);
- `builtin:tiny-arith` is built before pytest starts by `make test` (scripts/test.sh), alone
  on the cores; a run that starts pytest itself builds it at the start on one worker when a
  selected test needs it (marked `tiny_model`), while the other worker runs tests; the tests
  that need it run after all others, so that worker does not wait on the build's lock.

The lanes are markers (pyproject.toml): `make test-fast` runs the tests marked none of slow,
postgres, slurm, tiny_model and subprocess, and an audit hook (tests/support/lane.py, whose
hooks this file takes) fails a test there that starts a process.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
_ENV_BEFORE = {v: os.environ.get(v) for v in _THREAD_VARS}  # for the tiny build (its own 2)
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in _THREAD_VARS:
        os.environ.setdefault(_var, "1")
    if "torch" in sys.modules:  # imported before this file (a plugin): too late for the env
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# the fast lane's guard: its hooks, taken by name
from tests.support.lane import pytest_configure, pytest_runtest_protocol  # noqa: E402, F401
from tests.support.pgserver import PgServer  # noqa: E402

_db_counter = itertools.count()
_ROOT = Path(__file__).resolve().parents[1]

# Markers choose the lanes (pyproject's [tool.pytest.ini_options] markers). Those a test's
# fixtures imply are added here; a module says the rest with `pytestmark`. `make test-fast`
# runs every test marked none of these (lane.OUTSIDE_FAST_LANE), with an audit hook that fails a
# test starting a process (tests/support/lane.py).
_SERVER_FIXTURES = {"pg_server", "pg_url"}


def _implied_markers(item) -> list[str]:
    """postgres for a test on the session's server, tiny_model for one given the built model."""
    names = set(getattr(item, "fixturenames", ()))
    implied = []
    callspec = getattr(item, "callspec", None)
    on_postgres = callspec is not None and callspec.params.get("db_url") == "postgres"
    if names & _SERVER_FIXTURES or on_postgres:
        implied.append("postgres")
    if "tiny_model" in names:
        implied.append("tiny_model")
    return implied


def _module(item) -> str:
    return Path(item.path).resolve().relative_to(_ROOT).as_posix()


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        for name in _implied_markers(item):
            item.add_marker(name)
        if item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group("slurm"))
        elif item.get_closest_marker("one_worker"):
            item.add_marker(pytest.mark.xdist_group(Path(_module(item)).stem))
    # the tests needing the built tiny model last (a stable sort: every process orders alike)
    items.sort(key=lambda item: item.get_closest_marker("tiny_model") is not None)


@pytest.hookimpl(trylast=True)  # after xdist has sent this worker's collection
def pytest_collection_finish(session):
    """Build the tiny model at the start when a selected test needs it, on worker gw0 only
    (2 threads, as trainer/tiny.py fixes them): gw0 has already reported its collection, so the
    other worker runs tests meanwhile (one 1-thread worker next to the 2-thread build on 2
    cores), and gw0 starts its tests with the model built. ensure_tiny_model's lock makes any
    test that needs the model sooner wait for this build."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    if worker != "gw0" or session.config.option.collectonly:
        return
    if not any(it.get_closest_marker("tiny_model") for it in session.items):
        return
    env = {k: v for k, v in os.environ.items() if k not in _THREAD_VARS}
    env.update({k: v for k, v in _ENV_BEFORE.items() if v is not None})
    # A failed build (no train extra, no disk) says nothing here: the tests that need the
    # model build it themselves and fail with the reason. Nothing is printed when it is cached.
    subprocess.run(
        [sys.executable, "-c", "from trainer.tiny import ensure_tiny_model; ensure_tiny_model(0)"],
        cwd=_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, check=False,
    )


@pytest.fixture(scope="session")
def tiny_model():
    """The built `builtin:tiny-arith` model's folder (built here when no test built it yet)."""
    from trainer.tiny import ensure_tiny_model

    return ensure_tiny_model(0)


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


_FIGURES: list[tuple[str, object]] = []


def pytest_runtest_logreport(report):
    """Keep the figures a test measured (`record_property("figure: <name>", value)`) for the
    summary; xdist carries a report's user properties from its worker to here."""
    if report.when == "call":
        _FIGURES.extend((key.removeprefix("figure: "), value)
                        for key, value in report.user_properties if key.startswith("figure: "))


def pytest_terminal_summary(terminalreporter):
    """The figures measured by this run, so a note can quote what a command printed."""
    if _FIGURES:
        terminalreporter.section("figures measured by this run")
        for name, value in _FIGURES:
            terminalreporter.write_line(f"{name}: {value}")
