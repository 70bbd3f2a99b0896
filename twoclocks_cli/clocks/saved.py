"""Stored analyses: which one a `schedule` or `report` uses (the SQL is the Store's)."""

from __future__ import annotations


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
        stored = store.latest_analysis(sweep_name)
        if stored is not None and is_current(store, sweep_name, stored):
            return stored, "reused"
        if stored is not None:
            options, how = stored.get("options") or {}, "refreshed"
    known = AnalysisOptions.__dataclass_fields__
    opts = AnalysisOptions(**{k: v for k, v in (options or {}).items() if k in known})
    result = analyze_sweep(store, sweep_name, opts).to_json()
    result["analysis_id"] = store.save_analysis(sweep_name, result)
    return result, how
