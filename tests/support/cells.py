"""Helpers for tests that run a stored training cell the way a sweep job does: a run row, the
cell in a subprocess (so it can be SIGKILLed), and the metrics it stored."""

from __future__ import annotations

import subprocess
import sys
import time

# wall-clock metrics: the only ones a resumed run may log differently
TIMING = {"time_gen_s", "time_reward_s", "time_update_s", "tokens_per_s"}

RUN_CELL = (
    "import sys; from pathlib import Path; from twoclocks_cli.store import Store; "
    "from twoclocks_cli.backends import run_cell; "
    "print('STATUS', run_cell(Store.open(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])).value)"
)


def store_run(url: str, cell: dict) -> int:
    """A new grpo run row with `cell` as its config; its id."""
    from twoclocks_cli.store import Store
    from twoclocks_cli.store.models import Run

    with Store.open(url).session() as s:
        run = Run(cell_id=f"c{time.monotonic_ns()}", name="t", backend="grpo", config=cell)
        s.add(run)
        s.flush()
        return run.id


def run_cell(url: str, run_id: int, workdir, **popen) -> subprocess.Popen:
    """The entry point a sweep job calls, in a subprocess (so it can be SIGKILLed)."""
    return subprocess.Popen([sys.executable, "-c", RUN_CELL, url, str(run_id), str(workdir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def finish(proc: subprocess.Popen, timeout: float = 900) -> None:
    """Wait for a cell's process; it must report the run completed."""
    out, err = proc.communicate(timeout=timeout)
    assert "STATUS completed" in out, err[-3000:]


def step_metrics(url: str, run_id: int) -> dict[tuple[int, str], tuple[int, float]]:
    """{(step, key): (samples, value)} of a run, each (run, step, key) stored once."""
    import sqlalchemy as sa

    from twoclocks_cli.store import Store

    with Store.open(url).engine.connect() as c:
        rows = c.execute(sa.text("SELECT step, key, samples, value FROM metrics "
                                 "WHERE run_id = :r"), {"r": run_id}).all()
    out = {(s, k): (n, v) for s, k, n, v in rows}
    assert len(out) == len(rows)  # no duplicate rows
    return out
