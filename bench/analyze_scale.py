"""Benchmark: `analyze` on a store of 1,000 runs x 5,000 steps x 6 keys vs a bare SELECT.

Builds a SQLite store (bulk executemany, the writer's upsert statement) whose runs log
reward_mean, drift_abs and the four gradient-noise terms; then times, in the same process,
(a) a bare SELECT of exactly those rows (fetchall through the DB driver) and (b)
`analyze_sweep` with the drift rule on (so it reads all six keys) and prints the ratio a/b.
Target: ratio <= 2.0.

    python bench/analyze_scale.py [--runs 1000] [--steps 5000] [--db FILE]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from twoclocks_cli.clocks import AnalysisOptions, analyze_sweep  # noqa: E402
from twoclocks_cli.store import Run, Store, Sweep  # noqa: E402
from twoclocks_cli.store.writer import SQLITE_UPSERT  # noqa: E402

KEYS = [
    "reward_mean",
    "drift_abs",
    "grad_sq_micro",
    "grad_sq_full",
    "grad_micro_size",
    "grad_full_size",
]
BATCHES = [32, 64, 128, 256, 512]


def build(store: Store, runs: int, steps: int) -> None:
    """One sweep of `runs` runs (5 batch sizes), each logging KEYS at every step."""
    with store.session() as s:
        sw = Sweep(name="bench", backend="grpo", config={})
        s.add(sw)
        s.flush()
        rows = []
        for i in range(runs):
            b = BATCHES[i % len(BATCHES)]
            rows.append(
                Run(
                    sweep_id=sw.id,
                    cell_id=f"c{i}",
                    name=f"r{i}",
                    backend="grpo",
                    batch_prompts=b // 8,
                    group_size=8,
                    batch_samples=b,
                    lr=1e-3,
                    clip_low=0.2,
                    clip_high=0.2,
                    seed=i // len(BATCHES),
                    config={},
                    status="completed",
                )
            )
        s.add_all(rows)
        s.flush()
        ids = [(r.id, r.batch_samples) for r in rows]
    rng = np.random.default_rng(0)
    step = np.arange(1, steps + 1)
    for rid, b in ids:
        x = step * b
        e = 2000 + 15 * b
        reward = (1 - np.exp(-x / e)) * np.where(x > 40 * e, np.exp(-(x - 40 * e) / e), 1.0)
        reward = reward + rng.normal(0, 0.02, steps)
        drift = np.sqrt(x) * 0.01
        g = 1.0 + rng.normal(0, 0.01, steps)
        cols = {
            "reward_mean": reward,
            "drift_abs": drift,
            "grad_sq_micro": 4 * g,
            "grad_sq_full": g,
            "grad_micro_size": np.full(steps, b / 4.0),
            "grad_full_size": np.full(steps, float(b)),
        }
        data = [(rid, int(t), k, int(t * b), float(cols[k][t - 1])) for k in KEYS for t in step]
        with store.engine.begin() as conn:
            conn.exec_driver_sql(SQLITE_UPSERT, data)


def bare_select(store: Store) -> int:
    q = (
        "SELECT run_id, step, samples, value FROM metrics WHERE key IN ({}) ORDER BY run_id, step"
    ).format(",".join(f"'{k}'" for k in KEYS))
    with store.engine.connect() as conn:
        return len(conn.exec_driver_sql(q).fetchall())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--db", help="reuse (or create) this SQLite file")
    args = ap.parse_args()
    path = Path(args.db) if args.db else Path(tempfile.mkdtemp()) / "bench.db"
    fresh = not path.exists()
    store = Store.open(f"sqlite:///{path}")
    if fresh:
        t = time.perf_counter()
        build(store, args.runs, args.steps)
        print(
            f"built {args.runs} runs x {args.steps} steps x {len(KEYS)} keys in "
            f"{time.perf_counter() - t:.1f} s ({path})"
        )
    bare_select(store)  # warm the page cache for both
    t = time.perf_counter()
    n = bare_select(store)
    t_sel = time.perf_counter() - t
    opts = AnalysisOptions(target="0.5", drift_threshold=1e9, theory=False)
    t = time.perf_counter()
    result = analyze_sweep(store, "bench", opts)
    t_an = time.perf_counter() - t
    fit = result.critical.mccandlish.b_crit
    print(
        f"bare SELECT of {n} rows: {t_sel:.2f} s; analyze: {t_an:.2f} s "
        f"(B_crit {fit if fit is None else round(fit, 1)})"
    )
    print(f"ratio analyze / bare SELECT = {t_an / t_sel:.2f} (target <= 2.0)")


if __name__ == "__main__":
    main()
