"""Stored analyses: saving one, loading the newest, and which one a `schedule` or `report` uses
(the SQL is the Store's).

The analyses table holds JSON documents; here an `Analysis` is written as one
(`Analysis.to_json`) and read back from one (`Analysis.from_json`), so every other reader gets
the typed analysis.
"""

from __future__ import annotations

from twoclocks_cli.clocks.options import AnalysisOptions
from twoclocks_cli.clocks.result import Analysis


def save_analysis(store, sweep_name: str, analysis: Analysis) -> int:
    """Store `analysis` of `sweep_name` (an identical stored one is reused); sets and returns
    its `analysis_id`."""
    analysis.analysis_id = store.save_analysis(sweep_name, analysis.to_json())
    return analysis.analysis_id


def latest_analysis(store, sweep_name: str) -> Analysis | None:
    """The newest stored analysis of `sweep_name` (with its `analysis_id`), or None."""
    doc = store.latest_analysis(sweep_name)
    return None if doc is None else Analysis.from_json(doc)


def is_current(store, sweep_name: str, stored: Analysis) -> bool:
    """Whether `stored` still describes the sweep: the same runs with the same statuses, none of
    them still running (a running run's curve has grown since)."""
    then = {r.run_id: r.status for r in stored.runs}
    if any(r.partial for r in stored.runs):
        return False
    now = {r.id: r.status for r in store.list_runs(sweep_name)}
    return now == then


def analysis_for(store, sweep_name: str, options: AnalysisOptions | dict | None = None
                 ) -> tuple[Analysis, str]:
    """The analysis a `schedule` or `report` should use, and how it was obtained.

    With `options` (AnalysisOptions, or a dict of its fields; `{}` = the defaults) the sweep is
    analysed afresh. Without, the latest stored analysis is reused while it is current
    ('reused'); a stale one is redone with its own options ('refreshed'), and a sweep never
    analysed gets the defaults ('analysed'). A new result is stored. Raises AnalysisError when
    the data cannot answer.
    """
    from twoclocks_cli.clocks.analysis import analyze_sweep

    how = "analysed"
    if options is None:
        stored = latest_analysis(store, sweep_name)
        if stored is not None and is_current(store, sweep_name, stored):
            return stored, "reused"
        if stored is not None:
            options, how = stored.options, "refreshed"
    if not isinstance(options, AnalysisOptions):
        options = AnalysisOptions.from_json(options)
    result = analyze_sweep(store, sweep_name, options)
    save_analysis(store, sweep_name, result)
    return result, how
