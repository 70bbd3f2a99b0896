"""`twoclocks sweep` on the local executor (submitit local jobs) with the real sim backend."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import running_pids, sigint_deliverable, twoclocks
from twoclocks_cli.store import Store

CONFIG = """\
name = "{name}"
backend = "sim"
sample_budget = 4096
executor = "local"
workdir = "{workdir}"
[scaling]
reference_batch = 64
reference_lr = 0.02
[grid]
batch = {batch}
group_size = 8
seeds = {seeds}
{extra}
[sim]
dim = 8
flat_dims = 16
checkpoint_every = 50
[local]
max_parallel = 2
"""


def _config(tmp_path, name, batch="[2, 4]", seeds="[0, 1]", extra=""):
    path = tmp_path / f"{name}.toml"
    path.write_text(CONFIG.format(name=name, workdir=tmp_path / "runs", batch=batch, seeds=seeds,
                                  extra=extra))
    return str(path)


def _runs(url, sweep):
    store = Store.open(url)
    try:
        runs = store.list_runs(sweep)
        return {r.id: (r.status, r.attempts, r.error, len(store.events(r.id))) for r in runs}, \
            {r.id: store.count_metrics(r.id) for r in runs}
    finally:
        store.close()


def _block_a_cell(url: str, cfg: str) -> int:
    """Register `cfg` as `sweep` does and put a file where its last cell's workdir goes, so
    that cell raises when it runs; returns its run id."""
    from pathlib import Path

    from twoclocks_cli.config import load_plan
    from twoclocks_cli.launch import sweeps

    store = Store.open(url)
    try:
        reg = sweeps.register(store, load_plan(Path(cfg)), cfg)
    finally:
        store.close()
    cell = sorted(reg.runs, key=reg.runs.get)[-1]
    (Path(reg.folder) / "cells").mkdir(parents=True)
    (Path(reg.folder) / "cells" / cell[:16]).write_text("not a directory")
    return reg.runs[cell]


@pytest.mark.slow
def test_four_cells_complete_and_a_rerun_submits_nothing(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    cfg = _config(tmp_path, "loc")
    proc = twoclocks("sweep", cfg, "--db", url, "--wait")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "4 cells (4 new), submitted 4 via local" in proc.stdout
    runs, metrics = _runs(url, "loc")
    assert [s for s, *_ in runs.values()] == ["completed"] * 4
    assert all(n > 0 for n in metrics.values())
    again = twoclocks("sweep", cfg, "--db", url)
    assert again.returncode == 0, again.stderr
    assert "4 cells (0 new), submitted 0" in again.stdout
    assert _runs(url, "loc") == (runs, metrics)  # no attempt, event or row added
    status = json.loads(twoclocks("status", "loc", "--db", url, "--json").stdout)
    assert status["sweeps"] == {"loc": {"completed": 4}}
    listed = json.loads(twoclocks("sweeps", "list", "--db", url, "--json").stdout)
    assert [(w["name"], w["executor"], w["cells"]) for w in listed] == \
        [("loc", "local", {"completed": 4})]
    # a changed config adds only its new cells
    more = twoclocks("sweep", _config(tmp_path, "loc", seeds="[0, 1, 2]"), "--db", url, "--wait")
    assert more.returncode == 0, more.stderr
    assert "6 cells (2 new), submitted 2" in more.stdout


@pytest.mark.slow
def test_retry_failed_resubmits_only_the_failed_cell(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    cfg = _config(tmp_path, "bad", batch="[2, 4, 8, 16]", seeds="0")
    blocked = _block_a_cell(url, cfg)  # that cell raises when it runs (config is all valid)
    proc = twoclocks("sweep", cfg, "--db", url, "--wait")
    assert proc.returncode == 1, proc.stderr + proc.stdout
    assert "1 cell(s) failed" in proc.stderr
    before, _ = _runs(url, "bad")
    failed = [rid for rid, (s, *_) in before.items() if s == "failed"]
    assert failed == [blocked] and "FileExistsError" in before[blocked][2]
    assert sorted(s for s, *_ in before.values()) == ["completed"] * 3 + ["failed"]
    retry = twoclocks("sweep", cfg, "--db", url, "--retry-failed", "--wait")
    assert retry.returncode == 1
    assert "submitted 1 via local" in retry.stdout
    after, _ = _runs(url, "bad")
    for rid, (status, attempts, _, events) in after.items():
        if rid == failed[0]:
            assert (status, attempts) == ("failed", 2) and events > before[rid][3]
        else:
            assert (status, attempts, events) == ("completed", 1, before[rid][3])


@pytest.mark.slow
def test_local_reconcile_a_killed_cell_and_cancel_the_rest(tmp_path):
    import os
    import signal
    import time

    from twoclocks_cli.core.process import pid_alive

    url = f"sqlite:///{tmp_path / 'store.db'}"
    cfg = _config(tmp_path, "long", batch="[1]", seeds="[0, 1]")
    text = open(cfg).read().replace("sample_budget = 4096", "sample_budget = 80000000")
    open(cfg, "w").write(text.replace("group_size = 8", "group_size = 1"))
    assert twoclocks("sweep", cfg, "--db", url).returncode == 0

    deadline = time.monotonic() + 60
    while len(pids := running_pids(url, "long", "id")) < 2:
        assert time.monotonic() < deadline, "cells did not start"
        time.sleep(0.3)
    victim, other = sorted(pids)
    os.kill(pids[victim], signal.SIGKILL)  # dies without reporting
    deadline = time.monotonic() + 30
    while True:
        snap = json.loads(twoclocks("status", "long", "--db", url, "--json").stdout)
        states = {r["id"]: r for r in snap["runs"]}
        if states[victim]["status"] == "lost":
            break
        assert time.monotonic() < deadline, states
        time.sleep(0.5)
    assert "without reporting" in states[victim]["error"]
    assert states[other]["status"] == "running" and snap["queries"] == {"local": 1}
    out = twoclocks("cancel", "long", "--db", url)  # the lost cell too: a rerun leaves both
    assert out.returncode == 0 and "cancelled 2 cell(s)" in out.stdout, out.stderr
    deadline = time.monotonic() + 30
    while pid_alive(pids[other]):
        assert time.monotonic() < deadline, "cancelled cell still running"
        time.sleep(0.3)
    time.sleep(1)
    runs, _ = _runs(url, "long")
    assert runs[other][0] == "cancelled" and runs[victim][0] == "cancelled"
    again = twoclocks("sweep", cfg, "--db", url)
    assert again.returncode == 0 and "submitted 0" in again.stdout, again.stderr


@pytest.mark.slow
def test_cancel_stops_a_debug_sweep_in_its_own_process(tmp_path):
    """The debug executor runs cells inside `twoclocks sweep`; `cancel` from another process
    interrupts it there: the running cell stops mid-run, the queued one never starts."""
    import subprocess
    import sys
    import time

    url = f"sqlite:///{tmp_path / 'store.db'}"
    cfg = _config(tmp_path, "dbg", batch="[1]", seeds="[0, 1]")
    text = open(cfg).read().replace("sample_budget = 4096", "sample_budget = 80000000")
    open(cfg, "w").write(text.replace("group_size = 8", "group_size = 1"))
    proc = subprocess.Popen([sys.executable, "-m", "twoclocks_cli", "sweep", cfg, "--db", url,
                             "--executor", "debug"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=sigint_deliverable)
    from twoclocks_cli.core.errors import NotFoundError

    store, deadline = None, time.monotonic() + 60
    while True:
        if store is None and (tmp_path / "store.db").exists():
            store = Store.open(url)  # waits for the sweep's first-use migration
        try:
            runs = store.list_runs("dbg") if store else []
        except NotFoundError:  # not registered yet
            runs = []
        if any(r.status == "running" for r in runs) and store.count_metrics() > 0:
            break
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
        time.sleep(0.2)
    out = twoclocks("cancel", "dbg", "--db", url)
    assert out.returncode == 0 and "cancelled 2 cell(s)" in out.stdout, out.stderr
    stdout, stderr = proc.communicate(timeout=30)  # the in-process cell stopped
    assert proc.returncode == 0, stderr
    assert "cancelled by twoclocks cancel; stopping" in stderr
    first, second = store.list_runs("dbg")
    assert (first.status, second.status) == ("cancelled", "cancelled")
    assert store.count_metrics(first.id) > 0 and second.attempts == 0  # never started
    store.close()


@pytest.mark.postgres
def test_the_store_password_never_reaches_the_stored_config_or_any_output(pg_url, tmp_path):
    """A config's `store` URL carries the password; the sweep registered from it, its runs,
    events and every command's output hold the URL masked."""
    import sqlalchemy as sa

    from tests.support.pgserver import PASSWORD

    assert PASSWORD in pg_url
    cfg = _config(tmp_path, "pw", batch="[2]", seeds="[0]")
    text = open(cfg).read().replace('executor = "local"', 'executor = "debug"')
    open(cfg, "w").write(f"store = {json.dumps(pg_url)}\n" + text)
    outputs = [twoclocks("sweep", cfg)]
    assert outputs[0].returncode == 0, outputs[0].stderr
    outputs += [twoclocks("status", "pw", "--db", pg_url, "--json"),
                twoclocks("sweeps", "list", "--db", pg_url, "--json"),
                twoclocks("runs", "list", "--db", pg_url, "--json")]
    for out in outputs:
        assert out.returncode == 0, out.stderr
        assert PASSWORD not in out.stdout + out.stderr
    store = Store.open(pg_url)
    try:
        with store.engine.connect() as c:
            (stored,) = c.execute(sa.text("SELECT config FROM sweeps")).scalars()
            texts = c.execute(sa.text(
                "SELECT s.config::text || r.config::text || coalesce(r.error, '') "
                "|| coalesce(e.message, '') FROM sweeps s JOIN runs r ON r.sweep_id = s.id "
                "JOIN run_events e ON e.run_id = r.id")).scalars().all()
        assert stored["store"] == pg_url.replace(PASSWORD, "***")
        assert texts and not [t for t in texts if PASSWORD in t]
        assert [r.status for r in store.list_runs("pw")] == ["completed"]
    finally:
        store.close()
