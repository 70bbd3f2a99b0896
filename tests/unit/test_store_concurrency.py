"""Many writer processes into one database: exact row counts, no duplicates, no lock errors."""

import subprocess
import sys
import time

import pytest
from sqlalchemy import text

from twoclocks_cli.store import Run, Store

pytestmark = pytest.mark.subprocess

PROCS, STEPS, KEYS = 16, 2_000, 10


def _runs(store, n):
    with store.session() as s:
        runs = [Run(cell_id=f"c{i}", name=f"w{i}", backend="sim", config={}) for i in range(n)]
        s.add_all(runs)
        s.flush()
        return [r.id for r in runs]


@pytest.mark.slow
def test_sixteen_writers(db_url):
    store = Store.open(db_url)
    run_ids = _runs(store, PROCS)
    start_at = f"{time.time() + 4.0:.3f}"
    procs = [
        subprocess.Popen([sys.executable, "-m", "tests.support.workers", "write", db_url,
                          str(rid), str(STEPS), str(KEYS), start_at],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rid in run_ids
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    errors = [o[1] for p, o in zip(procs, outs, strict=True) if p.returncode != 0]
    assert not errors, errors[0]
    assert not any("locked" in o[1] for o in outs)
    assert store.count_metrics() == PROCS * STEPS * KEYS
    with store.engine.connect() as conn:
        dupes = conn.execute(text(
            "SELECT COUNT(*) FROM (SELECT run_id, step, key FROM metrics "
            "GROUP BY run_id, step, key HAVING COUNT(*) > 1) d")).scalar()
    assert dupes == 0
    series = store.load_metric([run_ids[3]], "k2")[run_ids[3]]
    assert len(series.steps) == STEPS and series.values[10] == pytest.approx(10.2)


def test_atexit_flushes_unclosed_writer(db_url):
    store = Store.open(db_url)
    (rid,) = _runs(store, 1)
    proc = subprocess.run([sys.executable, "-m", "tests.support.workers", "log_without_close",
                           db_url, str(rid)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert store.count_metrics(rid) == 7
