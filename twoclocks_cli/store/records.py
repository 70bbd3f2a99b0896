"""The store's rows as plain JSON-ready values: what `runs list`, `runs show`, `status` and
`sweep --json` print, built in one place so their schemas agree."""

from __future__ import annotations

from twoclocks_cli.core.errors import NotFoundError


def run_record(run) -> dict:
    """A run as plain JSON-ready values (the --json schema of `runs list`)."""
    return {
        "id": run.id,
        "sweep_id": run.sweep_id,
        "sweep": run.sweep.name if run.sweep is not None else None,
        "cell_id": run.cell_id,
        "name": run.name,
        "backend": run.backend,
        "batch_prompts": run.batch_prompts,
        "group_size": run.group_size,
        "batch_samples": run.batch_samples,
        "lr": run.lr,
        "clip_low": run.clip_low,
        "clip_high": run.clip_high,
        "seed": run.seed,
        "status": run.status,
        "job_id": run.job_id,
        "host": run.host,
        "attempts": run.attempts,
        "error": run.error,
        "created_at": run.created_at.isoformat() if run.created_at else None,
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
    }


def check_keys(store, run_ids: list[int], keys: list[str] | None, what: str) -> list[str]:
    """The keys to use: all logged ones, or `keys` after checking each was logged."""
    known = store.metric_keys(run_ids)
    if keys is None:
        return known
    unknown = [k for k in keys if k not in known]
    if unknown:
        shown = ", ".join(known[:30]) + (" ..." if len(known) > 30 else "")
        raise NotFoundError(f"--keys {unknown[0]!r}: not logged by {what} "
                            f"(keys: {shown or 'none'})")
    return keys


def show_record(store, run, keys: list[str] | None) -> dict:
    """Everything `runs show` prints: the run, its config, status history, metric summary."""
    keys = check_keys(store, [run.id], keys, f"run {run.id}")
    events = [{"at": e.at.isoformat(), "from": e.from_status, "to": e.to_status,
               "message": e.message} for e in store.events(run.id)]
    summary = store.metric_summary(run.id, keys) if keys else {}
    return {"run": run_record(run), "config": run.config or {}, "events": events,
            "metrics": summary}
