"""Stored analyses: save a result, fetch the latest one of a sweep (ORM only, no raw SQL)."""

from __future__ import annotations

from sqlalchemy import select

from twoclocks_cli.store.models import Analysis


def save_analysis(store, sweep_name: str, result: dict) -> int:
    """Store one analysis result of `sweep_name`; returns its id. An analysis identical to the
    sweep's latest stored one (same options, same result) is not stored again: its id is
    returned, so re-running `analyze` on an unchanged sweep adds no row."""
    sweep = store.get_sweep(sweep_name)
    result = {k: v for k, v in result.items() if k != "analysis_id"}
    with store.session() as s:
        latest = s.scalar(select(Analysis).where(Analysis.sweep_id == sweep.id)
                          .order_by(Analysis.created_at.desc(), Analysis.id.desc()).limit(1))
        if latest is not None and latest.result == result:
            return latest.id
        row = Analysis(sweep_id=sweep.id, options=result.get("options", {}), result=result)
        s.add(row)
        s.flush()
        return row.id


def latest_analysis(store, sweep_name: str) -> dict | None:
    """The newest stored analysis of `sweep_name`, or None."""
    sweep = store.get_sweep(sweep_name)
    with store.session() as s:
        q = (
            select(Analysis)
            .where(Analysis.sweep_id == sweep.id)
            .order_by(Analysis.created_at.desc(), Analysis.id.desc())
            .limit(1)
        )
        row = s.scalar(q)
        return None if row is None else {**row.result, "analysis_id": row.id}


def is_current(store, sweep_name: str, stored: dict) -> bool:
    """Whether `stored` still describes the sweep: the same runs with the same statuses, none of
    them still running (a running run's curve has grown since)."""
    then = {r["run_id"]: r.get("status") for r in stored.get("runs", [])}
    if any(r.get("partial") for r in stored.get("runs", [])):
        return False
    now = {r.id: r.status for r in store.list_runs(sweep_name)}
    return now == then


def analysis_for(store, sweep_name: str, options: dict | None = None) -> tuple[dict, str]:
    """The analysis a `schedule` or `report` should use, and how it was obtained.

    With `options` (AnalysisOptions fields; `{}` = the defaults) the sweep is analysed afresh.
    Without, the latest stored analysis is reused while it is current ('reused'); a stale one is
    redone with its own options ('refreshed'), and a sweep never analysed gets the defaults
    ('analysed'). A new result is stored. Raises AnalysisError when the data cannot answer.
    """
    from twoclocks_cli.clocks.analysis import analyze_sweep
    from twoclocks_cli.clocks.options import AnalysisOptions

    how = "analysed"
    if options is None:
        stored = latest_analysis(store, sweep_name)
        if stored is not None and is_current(store, sweep_name, stored):
            return stored, "reused"
        if stored is not None:
            options, how = stored.get("options") or {}, "refreshed"
    known = AnalysisOptions.__dataclass_fields__
    opts = AnalysisOptions(**{k: v for k, v in (options or {}).items() if k in known})
    result = analyze_sweep(store, sweep_name, opts).to_json()
    result["analysis_id"] = save_analysis(store, sweep_name, result)
    return result, how
