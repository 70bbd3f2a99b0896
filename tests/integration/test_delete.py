"""`runs delete` and `sweeps delete` through the real CLI on SQLite and PostgreSQL: exactly the
named rows go (metrics, events, the analyses that used them), nothing is left orphaned, and a
refused delete (a running run, a 'no' at the prompt) changes nothing."""

from __future__ import annotations

import json
import os
import socket
import subprocess

import pytest
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from tests.support.curves import ingest, make_curve
from twoclocks_cli.app import app
from twoclocks_cli.store import Store
from twoclocks_cli.store.engine import parse_url

TABLES = ("sweeps", "runs", "metrics", "run_events", "analyses")
ORPHANS = {
    "metrics": "SELECT count(*) FROM metrics WHERE run_id NOT IN (SELECT id FROM runs)",
    "run_events": "SELECT count(*) FROM run_events WHERE run_id NOT IN (SELECT id FROM runs)",
    "runs": "SELECT count(*) FROM runs WHERE sweep_id IS NOT NULL AND "
            "sweep_id NOT IN (SELECT id FROM sweeps)",
    "analyses": "SELECT count(*) FROM analyses WHERE sweep_id NOT IN (SELECT id FROM sweeps)",
}


def cli(*args, input=None):
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def filled(url, tmp_path):
    """Sweep a (3 ingested runs), sweep b (1 run); analyses A1 over all of a, A2 over a's last
    two runs, B1 over b, stored with the real save_analysis."""
    a = [make_curve(f"a{i}", 8 * 2 ** i, 4, 1e-3 * (i + 1), i, 6 + i) for i in range(3)]
    b = [make_curve("b0", 16, 8, 2e-3, 0, 5)]
    ingest(url, "a", a, tmp_path / "a")
    ingest(url, "b", b, tmp_path / "b")
    store = Store.open(url)

    def result(curves):
        return {"options": {}, "runs": [{"run_id": c.run_id, "status": "completed"}
                                        for c in curves]}

    ids = {"A1": store.save_analysis("a", result(a)),
           "A2": store.save_analysis("a", result(a[1:])),
           "B1": store.save_analysis("b", result(b))}
    store.close()
    return url, a, b, ids


def rows(url) -> dict[str, list[tuple]]:
    """Every row of every table, read with plain SQL (not through the Store)."""
    engine = create_engine(parse_url(url))
    order = {"sweeps": "id", "runs": "id", "metrics": "run_id, step, key",
             "run_events": "id", "analyses": "id"}
    with engine.connect() as conn:
        out = {t: [tuple(r) for r in conn.execute(text(f"SELECT * FROM {t} ORDER BY {o}"))]
               for t, o in order.items()}
        out["orphans"] = [conn.execute(text(q)).scalar() for q in ORPHANS.values()]
    engine.dispose()
    return out


def n_metrics(curve) -> int:
    """Metric rows the curve's import wrote: one per logged value (NaN included)."""
    return sum(len(vals) for _, _, vals in curve.steps)


def test_delete_one_run_takes_its_rows_and_the_analyses_that_used_it(filled):
    url, a, b, ids = filled
    before = rows(url)
    assert [len(before[t]) for t in TABLES] == [2, 4, sum(map(n_metrics, a + b)), 4, 3]
    gone = a[0]
    r = cli("runs", "delete", gone.run_id, "--yes", "--json", "--db", url)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["rows"] == {"metrics": n_metrics(gone), "run_events": 1,
                                            "analyses": 1, "runs": 1}
    after = rows(url)
    assert after["orphans"] == [0, 0, 0, 0]
    assert after["sweeps"] == before["sweeps"]
    assert after["runs"] == [x for x in before["runs"] if x[0] != gone.run_id]
    assert after["metrics"] == [x for x in before["metrics"] if x[0] != gone.run_id]
    assert after["run_events"] == [x for x in before["run_events"] if x[1] != gone.run_id]
    assert [x[0] for x in after["analyses"]] == [ids["A2"], ids["B1"]]
    nf = cli("runs", "show", gone.run_id, "--db", url)
    assert nf.exit_code == 2 and f"no run with id {gone.run_id}" in nf.stderr


def test_delete_sweep_takes_its_runs_and_analyses_only(filled):
    url, a, b, ids = filled
    before = rows(url)
    r = cli("sweeps", "delete", "a", "--yes", "--db", url)
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == (f"deleted sweep a: {sum(map(n_metrics, a))} metric rows, "
                                "3 status events, 2 analyses, 3 runs, 1 sweep")
    after = rows(url)
    keep = {x[0] for x in before["runs"]} - {c.run_id for c in a}
    assert keep == {b[0].run_id}
    assert after["orphans"] == [0, 0, 0, 0]
    assert after["sweeps"] == [x for x in before["sweeps"] if x[1] == "b"]
    assert after["runs"] == [x for x in before["runs"] if x[0] in keep]
    assert after["metrics"] == [x for x in before["metrics"] if x[0] in keep]
    assert after["run_events"] == [x for x in before["run_events"] if x[1] in keep]
    assert [x[0] for x in after["analyses"]] == [ids["B1"]]
    listed = json.loads(cli("sweeps", "list", "--json", "--db", url).stdout)
    assert [w["name"] for w in listed] == ["b"]


def test_prompt_no_changes_nothing_yes_deletes(filled):
    url, a, _, _ = filled
    before = rows(url)
    r = cli("runs", "delete", a[1].run_id, a[2].run_id, "--db", url, input="n\n")
    assert r.exit_code == 1
    assert f"Delete 2 runs ({a[1].run_id}, {a[2].run_id}) (" in r.stderr
    assert r.stderr.splitlines()[-1].endswith("nothing deleted")
    assert "internal error" not in r.output and "Traceback" not in r.output
    assert rows(url) == before
    r = cli("sweeps", "delete", "a", "--db", url, input="\n")  # the default is no
    assert r.exit_code == 1 and rows(url) == before
    assert r.stderr.splitlines()[-1].endswith("nothing deleted")
    r = cli("runs", "delete", a[1].run_id, "--db", url, input="y\n")
    assert r.exit_code == 0, r.output
    assert len(rows(url)["runs"]) == len(before["runs"]) - 1


@pytest.fixture
def cell_process():
    """A real process standing in for a running local cell (killed by the test at the end)."""
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.mark.subprocess
def test_running_run_is_refused_then_force_cancels_and_deletes(filled, cell_process):
    url, a, _, _ = filled
    run = a[1]
    job = f"local:{socket.gethostname()}:{os.getpid()}:{cell_process.pid}"
    store = Store.open(url)
    store.set_status(run.run_id, "running", "test: a cell started", job_id=job)
    store.close()
    before = rows(url)
    for args in (["runs", "delete", run.run_id, "--yes"], ["sweeps", "delete", "a", "--yes"],
                 ["runs", "delete", a[0].run_id, run.run_id, "--yes"]):
        r = cli(*args, "--db", url)
        assert r.exit_code == 2, (args, r.output)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "Traceback" not in r.output, r.output
        assert f"run {run.run_id}" in lines[0] and "is running" in lines[0]
        assert "--force" in lines[0]
        assert rows(url) == before, args
    assert cell_process.poll() is None  # nothing was stopped either
    r = cli("runs", "delete", run.run_id, "--yes", "--force", "--db", url)
    assert r.exit_code == 0, r.output
    assert f"run {run.run_id}: cancelled, process {cell_process.pid} stopped" in r.stdout
    assert cell_process.wait(timeout=10) == -9
    after = rows(url)
    assert after["orphans"] == [0, 0, 0, 0]
    assert run.run_id not in {x[0] for x in after["runs"]}
    assert len(after["metrics"]) == len(before["metrics"]) - n_metrics(run)


@pytest.mark.subprocess
def test_force_on_a_waiting_cell_leaves_its_runner_alone(filled, cell_process):
    """A submitted cell still queued in a local runner: cancelled and deleted; the runner
    (which serves the other cells) is not signalled."""
    url, a, _, _ = filled
    runner = cell_process
    job = f"local:{socket.gethostname()}:{runner.pid}"
    store = Store.open(url)
    store.set_status(a[2].run_id, "submitted", "test: queued", job_id=job)
    store.close()
    r = cli("runs", "delete", a[2].run_id, "--yes", "--force", "--db", url)
    assert r.exit_code == 0, r.output
    assert f"run {a[2].run_id}: cancelled (it had not started)" in r.stdout
    assert runner.poll() is None
    assert a[2].run_id not in {x[0] for x in rows(url)["runs"]}


@pytest.mark.subprocess
def test_sweep_delete_force_stops_the_sweep_like_cancel(filled, cell_process):
    """`sweeps delete --force` stops the whole sweep as `twoclocks cancel` does: the local
    runner gets SIGTERM, the running cell SIGKILL; then everything of the sweep goes."""
    url, a, b, ids = filled
    runner = subprocess.Popen(["sleep", "120"])
    try:
        store = Store.open(url)
        host = socket.gethostname()
        store.set_status(a[0].run_id, "running", "test", job_id=f"local:{host}:{runner.pid}:"
                         f"{cell_process.pid}")
        store.set_status(a[1].run_id, "submitted", "test", job_id=f"local:{host}:{runner.pid}")
        store.close()
        before = rows(url)
        r = cli("sweeps", "delete", "a", "--yes", "--db", url)
        assert r.exit_code == 2 and "--force" in r.stderr and rows(url) == before
        r = cli("sweeps", "delete", "a", "--yes", "--force", "--db", url)
        assert r.exit_code == 0, r.output
        assert "sweep a: cancelled 2 cell(s)" in r.stdout
        assert cell_process.wait(timeout=10) == -9 and runner.wait(timeout=10) == -15
        after = rows(url)
        assert after["orphans"] == [0, 0, 0, 0]
        assert [x[1] for x in after["sweeps"]] == ["b"]
        assert {x[0] for x in after["runs"]} == {b[0].run_id}
        assert [x[0] for x in after["analyses"]] == [ids["B1"]]
    finally:
        if runner.poll() is None:
            runner.kill()
        runner.wait()


@pytest.mark.parametrize("job, needles", [
    (None, ["without a job id", "Ctrl-C"]),
    ("debug:{host}:{pid}", ["debug executor", "Ctrl-C"]),
    ("4242_3", ["SLURM job 4242_3", "scancel 4242_3"]),
    ("local:elsewhere.invalid:1:2", ["on host elsewhere.invalid", "on that host"]),
])
@pytest.mark.subprocess
def test_force_refuses_what_it_cannot_stop_alone(filled, job, needles):
    url, a, _, _ = filled
    if job is not None:
        job = job.format(host=socket.gethostname(), pid=os.getpid())
    store = Store.open(url)
    store.set_status(a[0].run_id, "running", "test", job_id=job, host="somehost")
    store.close()
    before = rows(url)
    r = cli("runs", "delete", a[0].run_id, "--yes", "--force", "--db", url)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for needle in needles + ["nothing deleted"]:
        assert needle in lines[0], (needle, lines[0])
    assert rows(url) == before


def test_unknown_names_change_nothing(filled):
    url, a, _, _ = filled
    before = rows(url)
    for args, needle in ((["runs", "delete", a[0].run_id, "999"], "no run with id 999"),
                         (["sweeps", "delete", "zzz"], "no sweep named 'zzz' (sweeps: a, b)"),
                         (["runs", "delete", "nosuch.csv"], "no run with id or name")):
        r = cli(*args, "--yes", "--db", url)
        assert r.exit_code == 2 and needle in r.stderr, (args, r.output)
        assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1
    assert rows(url) == before
