"""Many writer processes against one PostgreSQL store (the test and `bench/store_load.py`).

Each process opens the store, logs `steps` x `keys` values for its own run and flushes every
`flush_every` steps, timing each flush; it prints its latencies and retries as one JSON line.
The caller may restart the server while they write. Afterwards every row is counted in SQL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

WORKER = r"""
import json, sys, time
from twoclocks_cli.store import Store
url, run_id, steps, keys, flush_every = sys.argv[1], *map(int, sys.argv[2:6])
store = Store.open(url, migrate=False)
lat = []
with store.metric_writer(run_id, batch_rows=10**9) as w:
    for step in range(steps):
        w.log(step, step * 64, {f"k{j}": step + j / 10 for j in range(keys)})
        if (step + 1) % flush_every == 0:
            t = time.perf_counter(); w.flush(); lat.append(time.perf_counter() - t)
    retries = w.retries_used + store.engine.info_reached["retries"]
print(json.dumps({"lat": lat, "retries": retries}))
"""


@dataclass
class LoadResult:
    """What the writers did and what landed."""

    procs: int
    rows_expected: int
    rows_found: int
    duplicates: int
    failed: int  # writer processes that exited non-zero
    retries: int
    wall_s: float
    p50_s: float
    p99_s: float
    errors: list

    @property
    def rows_per_s(self) -> float:
        return self.rows_found / self.wall_s if self.wall_s else 0.0


def make_runs(url: str, n: int, sweep: str) -> list[int]:
    """One sweep with `n` runs (the writers' targets)."""
    from twoclocks_cli.store import Run, Store, Sweep

    store = Store.open(url)
    with store.session() as s:
        sw = Sweep(name=sweep, backend="sim", config={})
        s.add(sw)
        s.flush()
        runs = [Run(sweep_id=sw.id, cell_id=f"{sweep}-{i}", name=f"w{i}", backend="sim",
                    status="running", config={}) for i in range(n)]
        s.add_all(runs)
        s.flush()
        ids = [r.id for r in runs]
    store.close()
    return ids


def run_load(url: str, run_ids: list[int], steps: int, keys: int, flush_every: int,
             during=None, start_gap_s: float = 0.0) -> LoadResult:
    """Start one writer per run, call `during()` (e.g. a server restart) while they write, wait
    for all, and count what landed."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    t0 = time.monotonic()
    procs = []
    for rid in run_ids:
        procs.append(subprocess.Popen(
            [sys.executable, "-c", WORKER, url, str(rid), str(steps), str(keys),
             str(flush_every)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env))
        if start_gap_s:
            time.sleep(start_gap_s)
    if during is not None:
        during()
    lat, retries, failed, errors = [], 0, 0, []
    for p in procs:
        out, err = p.communicate(timeout=3600)
        if p.returncode != 0:
            failed += 1
            errors.append(err.strip().splitlines()[-1] if err.strip() else f"rc {p.returncode}")
            continue
        doc = json.loads(out.strip().splitlines()[-1])
        lat += doc["lat"]
        retries += doc["retries"]
    wall = time.monotonic() - t0
    found, dup = _count(url, run_ids)
    lat.sort()
    pick = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]) if lat else (lambda q: 0.0)
    return LoadResult(len(run_ids), len(run_ids) * steps * keys, found, dup, failed, retries,
                      wall, pick(0.5), pick(0.99), errors[:3])


def _count(url: str, run_ids: list[int]) -> tuple[int, int]:
    """(rows of these runs, (run, step, key) groups holding more than one row)."""
    from sqlalchemy import text

    from twoclocks_cli.store.engine import make_engine

    engine = make_engine(url)
    ids = ",".join(str(i) for i in run_ids)
    with engine.connect() as c:
        found = c.execute(text(f"SELECT count(*) FROM metrics WHERE run_id IN ({ids})")).scalar()
        dup = c.execute(text(
            f"SELECT count(*) FROM (SELECT run_id, step, key FROM metrics WHERE run_id IN ({ids})"
            " GROUP BY run_id, step, key HAVING count(*) > 1) d")).scalar()
    engine.dispose()
    return int(found), int(dup)
