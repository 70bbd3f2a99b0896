"""Benchmark: N writer processes against a local PostgreSQL with a low `max_connections`.

Prints rows/s, p50/p99 flush latency, retries and lost/duplicate rows (must be 0/0) for the
constrained server, and the same load against a server with a connection for every writer (the
baseline, measured in the same run); the ratio is constrained / baseline throughput.

    python bench/store_load.py [--procs 256] [--steps 2000] [--keys 10] [--flush-every 100]
                               [--max-connections 50] [--restart]

Needs PostgreSQL 15's initdb/pg_ctl (Debian: postgresql-15; `$TWOCLOCKS_PG_BIN`). Measure on an
idle machine: the writers are processes and share the cores.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from tests.support.pgserver import PgServer  # noqa: E402
from tests.support.storeload import make_runs, run_load  # noqa: E402


def one(max_connections: int, args, restart: bool):
    server = PgServer(max_connections=max_connections).start()
    try:
        url = server.url()
        ids = make_runs(url, args.procs, "bench")
        during = None
        if restart:
            def during():
                def go():
                    time.sleep(5.0)
                    server.restart(down_s=2.0)
                threading.Thread(target=go, daemon=True).start()
        return run_load(url, ids, args.steps, args.keys, args.flush_every, during=during)
    finally:
        server.stop()


def show(label, r) -> None:
    lost = r.rows_expected - r.rows_found
    print(f"{label}: {r.procs} writers, {r.rows_found:,} rows in {r.wall_s:.1f} s = "
          f"{r.rows_per_s:,.0f} rows/s; flush p50 {r.p50_s * 1000:.0f} ms, p99 "
          f"{r.p99_s * 1000:.0f} ms; retries {r.retries}; lost {lost}, duplicates "
          f"{r.duplicates}; failed writers {r.failed} {r.errors or ''}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=256)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--keys", type=int, default=10)
    ap.add_argument("--flush-every", type=int, default=100)
    ap.add_argument("--max-connections", type=int, default=50)
    ap.add_argument("--restart", action="store_true", help="restart the constrained server once")
    args = ap.parse_args()
    base = one(args.procs + 10, args, restart=False)
    show(f"baseline (max_connections {args.procs + 10})", base)
    low = one(args.max_connections, args, restart=args.restart)
    show(f"constrained (max_connections {args.max_connections}"
         + (", one restart" if args.restart else "") + ")", low)
    print(f"ratio constrained/baseline rows/s: {low.rows_per_s / base.rows_per_s:.2f}")
    if low.rows_found != low.rows_expected or low.duplicates or low.failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
