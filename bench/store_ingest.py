"""Benchmark: 1,000,000 metric rows through the MetricWriter vs a plain executemany, same run.

Prints rows/s for both on SQLite and on a throwaway PostgreSQL server, and the ratio
writer / executemany. Target: ratio >= 0.7 on both backends.

    python bench/store_ingest.py [--rows 1000000] [--pg-url URL]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from twoclocks_cli.store import Run, Store  # noqa: E402

KEYS = [f"k{i}" for i in range(10)]
BATCH = 10_000


def _new_run(store: Store, name: str) -> int:
    with store.session() as s:
        run = Run(cell_id=name, name=name, backend="bench", config={})
        s.add(run)
        s.flush()
        return run.id


def _steps(rows: int) -> int:
    return rows // len(KEYS)


def bench_writer(store: Store, rows: int) -> float:
    """Rows/s logging every step through the writer (buffer + upsert, COPY on PostgreSQL)."""
    run_id = _new_run(store, "writer")
    t0 = time.perf_counter()
    with store.metric_writer(run_id, batch_rows=BATCH) as w:
        for step in range(_steps(rows)):
            w.log(step, step * 64, {k: step * 0.001 + i for i, k in enumerate(KEYS)})
    return rows / (time.perf_counter() - t0)


def bench_executemany(store: Store, rows: int) -> float:
    """Rows/s of a plain INSERT executemany of the same rows, BATCH rows per transaction."""
    run_id = _new_run(store, "executemany")
    pg = store.engine.dialect.name == "postgresql"
    sql = ("INSERT INTO metrics (run_id, step, key, samples, value) VALUES "
           + ("(%s, %s, %s, %s, %s)" if pg else "(?, ?, ?, ?, ?)"))
    t0 = time.perf_counter()
    buf = []
    for step in range(_steps(rows)):
        for i, k in enumerate(KEYS):
            buf.append((run_id, step, k, step * 64, step * 0.001 + i))
        if len(buf) >= BATCH:
            with store.engine.begin() as conn:
                conn.exec_driver_sql(sql, buf)
            buf = []
    if buf:
        with store.engine.begin() as conn:
            conn.exec_driver_sql(sql, buf)
    return rows / (time.perf_counter() - t0)


def run_backend(label: str, url: str, rows: int) -> float:
    store = Store.open(url)
    base = bench_executemany(store, rows)
    writer = bench_writer(store, rows)
    assert store.count_metrics() == 2 * rows, "row count mismatch"
    ratio = writer / base
    print(f"{label:10s} writer {writer:10,.0f} rows/s   executemany {base:10,.0f} rows/s   "
          f"ratio {ratio:.2f}  ({'ok' if ratio >= 0.7 else 'BELOW TARGET 0.7'})")
    store.close()
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--pg-url", default=None,
                        help="use this PostgreSQL instead of starting one")
    args = parser.parse_args()
    print(f"{args.rows:,} rows ({len(KEYS)} keys per step), {BATCH:,} rows per transaction")
    with tempfile.TemporaryDirectory() as tmp:
        run_backend("sqlite", f"sqlite:///{tmp}/bench.db", args.rows)
    if args.pg_url:
        run_backend("postgres", args.pg_url, args.rows)
    else:
        from tests.support.pgserver import PgServer

        server = PgServer().start()
        try:
            run_backend("postgres", server.create_database("bench"), args.rows)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
