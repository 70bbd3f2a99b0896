"""Worker processes for the store's concurrency tests: `python -m tests.support.workers ...`."""

from __future__ import annotations

import sys
import time


def _wait_until(start_at: float) -> None:
    while time.time() < start_at:
        time.sleep(0.001)


def migrate(url: str, start_at: str) -> None:
    """Open the store at the same instant as the other workers; report who migrated."""
    from twoclocks_cli.store.engine import make_engine
    from twoclocks_cli.store.migrate import ensure_schema

    engine = make_engine(url)
    _wait_until(float(start_at))
    print("MIGRATED" if ensure_schema(engine) else "SKIPPED")


def write(url: str, run_id: str, steps: str, keys: str, start_at: str) -> None:
    """Log `steps` × `keys` metrics for one run through the MetricWriter."""
    from twoclocks_cli.store import Store

    store = Store.open(url)
    _wait_until(float(start_at))
    names = [f"k{i}" for i in range(int(keys))]
    with store.metric_writer(int(run_id), batch_rows=5_000) as writer:
        for step in range(int(steps)):
            writer.log(step, step * 64, {name: step + i / 10 for i, name in enumerate(names)})
    print("DONE")


def log_without_close(url: str, run_id: str) -> None:
    """Log a few rows and exit without closing: the atexit hook must flush them."""
    from twoclocks_cli.store import Store

    writer = Store.open(url).metric_writer(int(run_id))
    for step in range(7):
        writer.log(step, step, {"x": float(step)})


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
