"""Deleting runs or a sweep safely: reconcile first, refuse busy runs unless forced, cancel
them, then delete in one transaction that refuses any run still busy."""

from __future__ import annotations

from twoclocks_cli.core.errors import ConfigError, LaunchError

BUSY = ("submitted", "running")  # statuses a delete refuses unless --force cancels them


def prepare(store, runs: list, force: bool, alone: bool = True) -> list:
    """Reconcile the runs' jobs, then refuse busy runs (unless `force` and, with `alone`, each
    can be cancelled by itself). Returns the busy runs; nothing is changed on a refusal."""
    from twoclocks_cli.launch import runcancel, sweeps

    for name in sorted({r.sweep.name for r in runs if r.sweep is not None}):
        sweeps.refresh(store, name)  # a job that died is not "running" any more
    runs = [store.get_run(r.id) for r in runs]
    busy = [r for r in runs if r.status in BUSY]
    if busy and not force:
        r = busy[0]
        more = f" (and {len(busy) - 1} more)" if len(busy) > 1 else ""
        raise ConfigError(f"run {r.id} ({r.name}) is {r.status}{more}: not deleted; pass "
                          "--force to cancel it first")
    for r in busy if alone else []:
        reason = runcancel.why_not(r)
        if reason is not None:
            raise LaunchError(f"{reason} (nothing deleted)")
    return busy


def execute(store, busy: list, delete_fn, cancel=None) -> tuple[list[str], dict[str, int]]:
    """Cancel the busy runs (one by one, or with `cancel()` when given), then run
    `delete_fn(refuse)` (one transaction, refusing any run still busy)."""
    from twoclocks_cli.launch import runcancel

    if cancel is not None and busy:
        notes = cancel()
    else:
        notes = [runcancel.cancel_run(store, r) for r in busy]
    return notes, delete_fn(BUSY)


def cancel_sweep(store, name: str) -> list[str]:
    """Stop a whole sweep before it is deleted, as `twoclocks cancel` does (arrays, runners)."""
    from twoclocks_cli.launch import sweeps

    n, problems = sweeps.cancel(store, name)
    if problems:
        raise LaunchError(f"sweep {name}: {n} cell(s) marked cancelled, but stopping their "
                          f"jobs failed: {'; '.join(problems)} (nothing deleted)")
    return [f"sweep {name}: cancelled {n} cell(s)"]
