"""Lost is not failed: a local sim sweep whose whole process tree is killed -9 at seeded points
resumes on plain reruns to the same rows as an uninterrupted sweep; a cell that raised stays
failed until --retry-failed."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli import kill_tree, running_pids, twoclocks
from twoclocks_cli.store import Store

pytestmark = pytest.mark.slow

CONFIG = """\
name = "{name}"
backend = "sim"
sample_budget = {budget}
executor = "local"
workdir = "{workdir}"
[scaling]
reference_batch = 64
reference_lr = 0.02
[grid]
batch = {batch}
group_size = 8
seeds = [0, 1]
[sim]
dim = 8
flat_dims = 16
checkpoint_every = 97
[local]
max_parallel = 2
"""
SEED = 20261201
CLI = [sys.executable, "-m", "twoclocks_cli"]


def _config(tmp_path: Path, name: str, budget: int = 32768, batch: str = "[2, 4]") -> str:
    path = tmp_path / f"{name}.toml"
    path.write_text(CONFIG.format(name=name, budget=budget, batch=batch,
                                  workdir=tmp_path / f"runs-{name}"))
    return str(path)


def _rows(url: str) -> list[tuple]:
    """Every metric row as (cell id, step, key, samples, value), one query."""
    import sqlalchemy as sa

    store = Store.open(url)
    try:
        with store.engine.connect() as c:
            return [tuple(r) for r in c.execute(sa.text(
                "SELECT r.cell_id, m.step, m.key, m.samples, m.value FROM metrics m "
                "JOIN runs r ON r.id = m.run_id"))]
    finally:
        store.close()


def _count(url: str) -> int:
    """Metric rows in the store so far (0 before the sweep created it)."""
    import sqlalchemy as sa

    if not Path(url.removeprefix("sqlite:///")).exists():
        return 0
    try:
        store = Store.open(url, migrate=False)
    except Exception:  # not created yet
        return 0
    try:
        with store.engine.connect() as c:
            return int(c.execute(sa.text("SELECT count(*) FROM metrics")).scalar())
    except Exception:  # tables not there yet
        return 0
    finally:
        store.close()


def _runs(url: str, sweep: str) -> dict[str, tuple]:
    store = Store.open(url)
    try:
        return {r.cell_id: (r.status, r.attempts, [e.to_status for e in store.events(r.id)])
                for r in store.list_runs(sweep)}
    finally:
        store.close()


def _sweep(cfg: str, url: str) -> subprocess.Popen:
    return subprocess.Popen([*CLI, "sweep", cfg, "--db", url, "--wait"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_kill9_of_the_whole_tree_then_plain_reruns_equal_an_uninterrupted_sweep(tmp_path):
    cfg = _config(tmp_path, "k9")
    ref_url = f"sqlite:///{tmp_path / 'ref.db'}"
    t0 = time.monotonic()
    ref = twoclocks("sweep", cfg, "--db", ref_url, "--wait", timeout=300)
    ref_s = time.monotonic() - t0
    assert ref.returncode == 0, ref.stderr + ref.stdout
    truth = _rows(ref_url)
    assert len(truth) > 10_000

    url = f"sqlite:///{tmp_path / 'killed.db'}"
    rng = random.Random(SEED)
    # seeded kill points: one early by time (CLI start-up, registration, submission), then
    # three by progress (fraction of the uninterrupted sweep's rows already in the store)
    points = [("time", rng.uniform(0.2, 1.5))] + \
             [("rows", f) for f in sorted(rng.uniform(0.1, 0.9) for _ in range(3))]
    kills = []
    for kind, at in points:
        proc = _sweep(cfg, url)
        deadline = time.monotonic() + 120
        if kind == "time":
            time.sleep(at)
        else:
            while _count(url) < at * len(truth) and proc.poll() is None:
                assert time.monotonic() < deadline, "sweep made no progress"
                time.sleep(0.05)
        if proc.poll() is not None:  # only an error ends a sweep before its last row
            out, err = proc.communicate()
            pytest.fail(f"sweep exited before kill point {kind} {at}: {err[-2000:]}{out}")
        kills.append((kind, round(at, 3), _count(url), kill_tree(proc.pid)))
        proc.communicate(timeout=60)
    final = _sweep(cfg, url)
    out, err = final.communicate(timeout=300)
    assert final.returncode == 0, err + out

    runs = _runs(url, "k9")
    assert [s for s, *_ in runs.values()] == ["completed"] * 4, runs
    assert any("lost" in ev for *_, ev in runs.values()), runs  # the path under test was taken
    got = _rows(url)
    assert len(got) == len(set((c, s, k) for c, s, k, *_ in got))  # no duplicate rows
    want = {(c, s, k): (n, v) for c, s, k, n, v in truth}
    have = {(c, s, k): (n, v) for c, s, k, n, v in got}
    assert set(have) == set(want)
    diff = [(k, want[k], have[k]) for k in want if want[k] != have[k]]
    assert not diff, diff[:5]
    print(f"\nuninterrupted {ref_s:.1f}s, {len(truth)} rows; kills (kind, at, rows, procs): "
          f"{kills}; attempts {[a for _, a, _ in runs.values()]}; {len(got)} rows equal")


def test_a_cell_that_raised_stays_failed_while_a_lost_one_resumes(tmp_path):
    """Three cells: one raises (its workdir is a file), one is killed -9 mid-run, one completes.
    A plain rerun resubmits only the lost one; the failed one needs --retry-failed."""
    from twoclocks_cli.config import load_plan
    from twoclocks_cli.launch import sweeps

    cfg = _config(tmp_path, "mix", budget=150_000, batch="[4]")
    Path(cfg).write_text(Path(cfg).read_text().replace("seeds = [0, 1]", "seeds = [0, 1, 2]"))
    url = f"sqlite:///{tmp_path / 'mix.db'}"
    store = Store.open(url)
    reg = sweeps.register(store, load_plan(Path(cfg)), cfg)  # what `sweep` registers
    cells = sorted(reg.runs)
    bad = cells[0]
    cells_dir = Path(reg.folder) / "cells"
    cells_dir.mkdir(parents=True)
    (cells_dir / bad[:16]).write_text("not a directory")  # the backend cannot make its workdir
    store.close()
    assert twoclocks("sweep", cfg, "--db", url).returncode == 0

    deadline = time.monotonic() + 60
    while len(pids := running_pids(url, "mix", "cell_id")) < 2:
        assert time.monotonic() < deadline, _runs(url, "mix")
        time.sleep(0.2)
    victim = sorted(pids)[0]
    store = Store.open(url)
    victim_id = reg.runs[victim]
    while not store.max_step(victim_id):  # killed after its first checkpointed rows
        assert time.monotonic() < deadline, _runs(url, "mix")
        time.sleep(0.1)
    store.close()
    os.kill(pids[victim], signal.SIGKILL)  # dies without reporting (like the OOM killer)
    deadline = time.monotonic() + 120
    while True:
        status = twoclocks("status", "mix", "--db", url)
        runs = _runs(url, "mix")
        if runs[victim][0] == "lost" and all(s != "running" for s, *_ in runs.values()):
            break
        assert time.monotonic() < deadline, runs
        time.sleep(0.5)
    assert runs[bad][:2] == ("failed", 1)
    assert "lost" in status.stdout and "1 lost cell(s)" in status.stderr
    assert sorted(s for s, *_ in runs.values()) == ["completed", "failed", "lost"]

    again = twoclocks("sweep", cfg, "--db", url, "--wait", timeout=300)
    assert again.returncode == 1, again.stderr  # the failed cell still counts as failed
    assert "submitted 1 via local" in again.stdout
    after = _runs(url, "mix")
    assert after[victim][:2] == ("completed", 2)
    assert after[bad][:2] == ("failed", 1)  # not resubmitted by a plain rerun
    store = Store.open(url)
    try:
        run = next(r for r in store.list_runs("mix") if r.cell_id == victim)
        events = [e.message for e in store.events(run.id) if e.to_status == "running"]
        assert "resuming after step" in events[-1]
    finally:
        store.close()
    retry = twoclocks("sweep", cfg, "--db", url, "--retry-failed", "--wait", timeout=120)
    assert retry.returncode == 1 and "submitted 1 via local" in retry.stdout
    assert _runs(url, "mix")[bad][:2] == ("failed", 2)
