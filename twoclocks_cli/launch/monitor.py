"""Watching sweeps: one reconciled snapshot of the cells' states, and polling until none runs."""

from __future__ import annotations

import time


def snapshot(store, sweep: str | None) -> dict:
    """Reconcile once, then read: per-sweep counts, and the runs of `sweep` when given."""
    from twoclocks_cli.launch import sweeps
    from twoclocks_cli.store.records import run_record

    if sweep is not None:
        store.get_sweep(sweep)
    ref = sweeps.refresh(store, sweep)
    out = {"queries": ref.queries, "reconciled": ref.fixed, "problems": ref.problems,
           "sweeps": {k: dict(v) for k, v in store.status_counts(sweep).items()}}
    if sweep is not None:
        runs = store.list_runs(sweep)
        steps = store.last_steps([r.id for r in runs])
        out["runs"] = [{**run_record(r), "last_step": steps.get(r.id)} for r in runs]
    else:  # runs of `twoclocks train` (no sweep) are shown too
        alone = [r for r in store.list_runs() if r.sweep_id is None]
        steps = store.last_steps([r.id for r in alone])
        out["standalone"] = [{**run_record(r), "last_step": steps.get(r.id)} for r in alone]
    return out


def waiting(snap: dict, sweep: str | None) -> bool:
    """Any run still submitted or running?"""
    tables = [snap["sweeps"].get(sweep, {})] if sweep else list(snap["sweeps"].values())
    return any(c.get("submitted") or c.get("running") for c in tables)


def poll(store, sweep: str | None, interval: float = 2.0, on_snapshot=None) -> dict:
    """Snapshots every `interval` seconds until nothing of `sweep` is submitted or running;
    each one, the first included, goes to `on_snapshot` (when given); returns the last."""
    while True:
        snap = snapshot(store, sweep)
        if on_snapshot is not None:
            on_snapshot(snap)
        if not waiting(snap, sweep):
            return snap
        time.sleep(interval)


def watcher(store, sweep: str | None, interval: float = 2.0):
    """`poll` of `sweep` as a function of its `on_snapshot` alone: what a live view is given,
    so that it never reads the store itself."""
    return lambda on_snapshot: poll(store, sweep, interval, on_snapshot)
