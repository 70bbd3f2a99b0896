"""Sweeps on a real SLURM cluster (scripts/slurm-up.sh): array + parallelism, cancel, requeue and
resume, reconciliation of a job killed outside twoclocks.

Without a cluster these tests skip, unless TWOCLOCKS_REQUIRE_SLURM=1 (CI), where they fail.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.cli import twoclocks
from twoclocks_cli.store import Store

pytestmark = pytest.mark.slurm

CONFIG = """\
name = "{name}"
backend = "sim"
sample_budget = {budget}
executor = "slurm"
workdir = "{workdir}"
[scaling]
reference_batch = 16
reference_lr = 0.01
[grid]
batch = {batch}
group_size = 1
seeds = [0]
[sim]
dim = 8
flat_dims = 8
drift_threshold = 1e9
checkpoint_every = 200
[slurm]
array_parallelism = {parallel}
timeout_min = 10
"""


def _cluster_up() -> str | None:
    """None if sinfo and sacct answer, else why not."""
    for cmd in (["sinfo", "-h"], ["sacct", "-n", "-X", "-S", "now"]):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{cmd[0]}: {exc}"
        if out.returncode != 0:
            return f"{cmd[0]}: {out.stderr.strip()[:200]}"
    return None


@pytest.fixture(scope="module")
def slurm():
    why = _cluster_up()
    if why:
        msg = f"SLURM is not up ({why}); run scripts/slurm-up.sh"
        if os.environ.get("TWOCLOCKS_REQUIRE_SLURM") == "1":
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture
def sweep(tmp_path, slurm):
    """Write a config, return (path, db url); scancel whatever the test left running."""
    made = []

    def make(name, batch="[1, 2, 4, 8]", budget=4096, parallel=2):
        path = tmp_path / f"{name}.toml"
        path.write_text(CONFIG.format(name=name, budget=budget, batch=batch, parallel=parallel,
                                      workdir=tmp_path / "runs"))
        made.append(name)
        return str(path), f"sqlite:///{tmp_path / 'store.db'}"

    yield make
    url = f"sqlite:///{tmp_path / 'store.db'}"
    for name in made:
        twoclocks("cancel", name, "--db", url)


def _runs(url, name):
    store = Store.open(url)
    try:
        return store.list_runs(name)
    finally:
        store.close()


def _wait(cond, timeout=180, every=0.5):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"condition not met in {timeout}s")


def _status(url, name) -> dict:
    proc = twoclocks("status", name, "--db", url, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_four_cells_one_array_parallelism_two(sweep):
    cfg, url = sweep("arr")
    proc = twoclocks("sweep", cfg, "--db", url, "--wait")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    runs = _runs(url, "arr")
    assert [r.status for r in runs] == ["completed"] * 4
    arrays = {r.job_id.split("_")[0] for r in runs}
    assert len(arrays) == 1, [r.job_id for r in runs]  # one sbatch, one array
    assert sorted(r.job_id.split("_")[1] for r in runs) == ["0", "1", "2", "3"]
    scripts = list(Path(_folder(url, "arr")).rglob("*_submission.sh"))
    assert len(scripts) == 1 and "#SBATCH --array=0-3%2" in scripts[0].read_text()
    spans = sorted((r.started_at, r.finished_at) for r in runs)
    for start, _ in spans:  # never more than two cells at once
        assert sum(1 for s, f in spans if s <= start < f) <= 2


def _folder(url, name) -> str:
    store = Store.open(url)
    try:
        return store.get_sweep(name).folder
    finally:
        store.close()


@pytest.mark.slow
def test_cancel_marks_every_cell_cancelled(sweep):
    cfg, url = sweep("can", batch="[1, 2, 3, 4]", budget=10_000_000)
    proc = twoclocks("sweep", cfg, "--db", url)
    assert proc.returncode == 0, proc.stderr
    _wait(lambda: any(r.status == "running" for r in _runs(url, "can")))
    out = twoclocks("cancel", "can", "--db", url)
    assert out.returncode == 0, out.stderr
    assert "cancelled 4 cell(s)" in out.stdout
    arrays = sorted({r.job_id.split("_")[0] for r in _runs(url, "can")})
    _wait(lambda: "RUNNING" not in subprocess.run(
        ["sacct", "-X", "-n", "-o", "State", "-j", ",".join(arrays)],
        capture_output=True, text=True).stdout)
    snap = _status(url, "can")
    assert snap["sweeps"] == {"can": {"cancelled": 4}}
    assert snap["queries"] == {}  # nothing waiting: no scheduler query needed


@pytest.mark.slow
@pytest.mark.parametrize("how", ["scontrol", "timeout-signal"])
def test_requeued_cell_resumes_from_its_checkpoint(sweep, how):
    """`scontrol requeue` (SLURM kills and requeues), or the USR2 SLURM sends before a timeout
    (submitit calls CellJob.checkpoint and requeues)."""
    budget = 60_000
    cfg, url = sweep("req", batch="[1]", budget=budget)
    assert twoclocks("sweep", cfg, "--db", url).returncode == 0
    (run,) = _runs(url, "req")

    def past_checkpoint():
        store = Store.open(url)
        try:
            return (store.max_step(run.id) or 0) > 1000
        finally:
            store.close()

    _wait(past_checkpoint)
    job = _runs(url, "req")[0].job_id
    if how == "scontrol":
        subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True)
    else:
        subprocess.run(["scancel", "--signal=USR2", job], check=True, capture_output=True)
    final = _wait(lambda: (r := _runs(url, "req")[0]).status in ("completed", "failed") and r,
                  timeout=300)
    assert final.status == "completed", final.error
    assert final.attempts == 2
    store = Store.open(url)
    try:
        events = [e.message or "" for e in store.events(run.id)]
        resumed = [m for m in events if m.startswith("attempt 2")]
        assert resumed and re.search(r"resuming after step [1-9]\d* \(checkpoint found\)",
                                     resumed[0]), events
        assert ("requeues 1" in resumed[0]) == (how == "timeout-signal"), resumed[0]
        series = store.load_metric([run.id], "reward_mean")[run.id]
        # every step exactly once across both attempts: no gap, no duplicate
        assert list(series.steps) == list(range(1, budget + 1))
    finally:
        store.close()


@pytest.mark.slow
def test_status_reconciles_a_job_killed_outside_twoclocks(sweep):
    cfg, url = sweep("kil", batch="[1]", budget=10_000_000)
    assert twoclocks("sweep", cfg, "--db", url).returncode == 0
    (run,) = _wait(lambda: [r for r in _runs(url, "kil") if r.status == "running"])
    store = Store.open(url)
    try:
        msg = next(e.message for e in store.events(run.id) if e.to_status == "running")
    finally:
        store.close()
    pid = int(re.search(r"pid (\d+)", msg).group(1))
    os.kill(pid, signal.SIGKILL)  # like the OOM killer: the job cannot report
    snap = _wait(lambda: (s := _status(url, "kil"))["sweeps"]["kil"].get("lost") and s,
                 timeout=120)
    (row,) = snap["runs"]
    assert row["status"] == "lost" and "without reporting" in row["error"], row
    assert snap["queries"] in ({"slurm": 1}, {})
