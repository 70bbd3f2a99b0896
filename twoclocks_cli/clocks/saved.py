"""Stored analyses: save a result, fetch the latest one of a sweep (ORM only, no raw SQL)."""

from __future__ import annotations

from sqlalchemy import select

from twoclocks_cli.store.models import Analysis


def save_analysis(store, sweep_name: str, result: dict) -> int:
    """Store one analysis result of `sweep_name`; returns its id."""
    sweep = store.get_sweep(sweep_name)
    with store.session() as s:
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
