"""Store round trips on SQLite and PostgreSQL: runs, status events, metrics with NaN/inf;
bad database URLs and foreign files refused in one line."""

import math
import os
import sqlite3
from pathlib import Path

import pytest

from tests.support.cli import assert_one_line_error, twoclocks_inproc
from twoclocks_cli.core.errors import StoreError
from twoclocks_cli.store import Run, RunStatus, Store, Sweep
from twoclocks_cli.store.engine import parse_url, resolve_url


def _make_run(store, name="r0", sweep_name="s"):
    with store.session() as s:
        sweep = Sweep(name=sweep_name, backend="sim", config={})
        s.add(sweep)
        s.flush()
        run = Run(sweep_id=sweep.id, cell_id="c" + name, name=name, backend="sim",
                  batch_prompts=4, group_size=8, batch_samples=32, lr=1e-3, seed=0, config={})
        s.add(run)
        s.flush()
        return run.id


def test_metric_roundtrip_keeps_nan_and_inf(store):
    rid = _make_run(store)
    with store.metric_writer(rid, batch_rows=3) as w:
        w.log(0, 32, {"a": 1.5, "b": math.nan})
        w.log(1, 64, {"a": math.inf, "b": -math.inf})
        w.log(2, 96, {"a": 0.0})
    a = store.load_metric([rid], "a")[rid]
    b = store.load_metric([rid], "b")[rid]
    assert list(a.steps) == [0, 1, 2] and list(a.samples) == [32, 64, 96]
    assert a.values[0] == 1.5 and a.values[1] == math.inf and a.values[2] == 0.0
    assert math.isnan(b.values[0]) and b.values[1] == -math.inf
    assert store.metric_keys([rid]) == ["a", "b"]
    assert store.max_step(rid) == 2


def test_replayed_batch_does_not_duplicate(store):
    rid = _make_run(store)
    for _ in range(2):  # a resumed run replays the same steps
        with store.metric_writer(rid) as w:
            for step in range(50):
                w.log(step, step * 8, {"x": step, "y": -step})
    assert store.count_metrics(rid) == 100
    assert list(store.load_metric([rid], "x")[rid].values) == list(range(50))


def test_status_lifecycle_records_events(store):
    rid = _make_run(store)
    store.set_status(rid, RunStatus.submitted, job_id="17")
    store.set_status(rid, RunStatus.running, host="node1", attempts=1)
    run = store.set_status(rid, RunStatus.failed, error="boom")
    assert run.status == "failed" and run.error == "boom" and run.job_id == "17"
    assert run.finished_at is not None and run.started_at is not None
    transitions = [(e.from_status, e.to_status) for e in store.events(rid)]
    assert transitions == [
        ("planned", "submitted"), ("submitted", "running"), ("running", "failed")
    ]


def test_list_runs_by_sweep(store):
    _make_run(store, "a", "s1")
    _make_run(store, "b", "s2")
    assert [r.name for r in store.list_runs("s2")] == ["b"]
    assert len(store.list_runs()) == 2


# --- database URLs and foreign files: one line, no password, nothing written ---------------

def _dump(path) -> list[str]:
    """Every table and row of a SQLite file, independent of twoclocks."""
    con = sqlite3.connect(path)
    try:
        return list(con.iterdump())
    finally:
        con.close()


@pytest.mark.parametrize("url,needles", [
    ("postgresql://u:s3cret@127.0.0.1:abc/db", ["malformed", "port", "u:***@127.0.0.1:abc"]),
    ("postgresql://u:s3cret@[::1/db", ["malformed", "u:***@"]),
    ("postgresql://u:s3cret@h:99999/db", ["port 99999", "1..65535"]),
    ("postgresql+asyncpg://u:s3cret@h/db", ["unsupported driver"]),
    ("mysql://u:s3cret@h/db", ["unsupported database"]),
    ("", ["empty database URL"]),
    ("   ", ["empty database URL"]),
    ("not a url", ["malformed"]),
])
def test_bad_urls_are_one_line_without_the_password(url, needles):
    with pytest.raises(StoreError) as info:
        parse_url(url)
    line = str(info.value)
    assert "\n" not in line and "s3cret" not in line
    for needle in needles:
        assert needle in line, (needle, line)


def test_empty_db_option_is_an_error_not_the_default(tmp_path):
    with pytest.raises(StoreError, match="empty database URL"):
        resolve_url("")
    proc = twoclocks_inproc("status", "--db", "", cwd=tmp_path)
    assert_one_line_error(proc, "--db ''", "empty database URL")
    assert not (tmp_path / "twoclocks.db").exists()  # no silent fallback to ./twoclocks.db


def test_sqlite_paths_the_os_refuses(tmp_path):
    (tmp_path / "folder").mkdir()
    cases = [(tmp_path / "folder", "is a folder"), (tmp_path / "nope" / "x.db", "does not exist"),
             (tmp_path / ("a" * 300), "component is 300 bytes")]
    for path, needle in cases:
        with pytest.raises(StoreError, match=needle):
            Store.open(f"sqlite:///{path}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:",
                                 "sqlite:///file:x?mode=memory&uri=true"])
def test_an_in_memory_database_is_refused(tmp_path, url):
    """What a command writes to an in-memory store is gone at exit: refused, by --db and env."""
    config = Path(__file__).parents[2] / "examples" / "sim-sweep.toml"
    proc = twoclocks_inproc("sweep", str(config), "--db", url, cwd=tmp_path)
    assert_one_line_error(proc, f"--db {url!r}", "in-memory")
    proc = twoclocks_inproc("sweeps", "list", cwd=tmp_path, env={"TWOCLOCKS_DB": url})
    assert_one_line_error(proc, "in-memory")
    assert list(tmp_path.iterdir()) == []  # no sweep folder, no fallback store


def _without_file_permissions_override() -> list[str] | None:
    """A command prefix under which this process is subject to file permissions: nothing for a
    plain user; for root, setpriv dropping the two capabilities that bypass them."""
    if os.geteuid() != 0:
        return []
    import shutil

    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] \
        if shutil.which("setpriv") else None


@pytest.mark.subprocess
@pytest.mark.parametrize("below", ["sub/x.db", "x.db"])
def test_a_store_behind_a_folder_this_user_may_not_enter_is_one_line(tmp_path, below):
    import subprocess
    import sys

    prefix = _without_file_permissions_override()
    if prefix is None:
        pytest.skip("running as root without setpriv: file permissions cannot bind")
    locked = tmp_path / "locked"
    (locked / "sub").mkdir(parents=True)
    locked.chmod(0o700)
    if os.geteuid() == 0:
        os.chown(locked, 65534, 65534)  # nobody's: root without the override is "other" here
    else:
        locked.chmod(0o000)
    try:
        proc = subprocess.run([*prefix, sys.executable, "-m", "twoclocks_cli", "sweeps", "list",
                               "--db", f"sqlite:///{locked / below}"], capture_output=True,
                              text=True, cwd=tmp_path, timeout=120)
        assert_one_line_error(proc, "permission denied", str(locked / below))
    finally:
        locked.chmod(0o700)
    assert sorted(p.name for p in locked.iterdir()) == ["sub"]  # nothing created
    assert list((locked / "sub").iterdir()) == []


def test_a_foreign_sqlite_file_is_refused_not_migrated(tmp_path):
    path = tmp_path / "theirs.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    con.execute("INSERT INTO customers (name) VALUES ('ada')")
    con.commit()
    con.close()
    before = _dump(path)
    with pytest.raises(StoreError, match=r"has tables \(customers\).*not a twoclocks store"):
        Store.open(f"sqlite:///{path}")
    for args in (["status"], ["db", "upgrade"]):
        assert_one_line_error(twoclocks_inproc(*args, "--db", f"sqlite:///{path}"), "customers",
                              "not a twoclocks store")
    assert _dump(path) == before  # no twoclocks table was added beside theirs


def test_another_tools_alembic_revision_is_refused(tmp_path):
    path = tmp_path / "alembic.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
    con.execute("INSERT INTO alembic_version VALUES ('abc123')")
    con.execute("CREATE TABLE orders (id INTEGER)")
    con.commit()
    con.close()
    before = _dump(path)
    with pytest.raises(StoreError, match="'abc123', which is not twoclocks'"):
        Store.open(f"sqlite:///{path}")
    assert _dump(path) == before
