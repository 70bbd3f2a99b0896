"""The queries of stored analyses: save one result of a sweep, fetch its newest."""

from __future__ import annotations

from sqlalchemy import select

from twoclocks_cli.store.models import Analysis


class AnalysisQueries:
    """Store methods for analyses (mixed into `Store`; they use its `session`)."""

    def _newest_analysis(self, s, sweep_id: int) -> Analysis | None:
        q = (select(Analysis).where(Analysis.sweep_id == sweep_id)
             .order_by(Analysis.created_at.desc(), Analysis.id.desc()).limit(1))
        return s.scalar(q)

    def save_analysis(self, sweep_name: str, result: dict) -> int:
        """Store one analysis result of `sweep_name`; returns its id. One identical to the
        sweep's newest stored analysis is not stored again: that one's id is returned."""
        sweep = self.get_sweep(sweep_name)
        result = {k: v for k, v in result.items() if k != "analysis_id"}
        with self.session() as s:
            latest = self._newest_analysis(s, sweep.id)
            if latest is not None and latest.result == result:
                return latest.id
            row = Analysis(sweep_id=sweep.id, options=result.get("options", {}), result=result)
            s.add(row)
            s.flush()
            return row.id

    def latest_analysis(self, sweep_name: str) -> dict | None:
        """The newest stored analysis of `sweep_name` (with its `analysis_id`), or None."""
        sweep = self.get_sweep(sweep_name)
        with self.session() as s:
            row = self._newest_analysis(s, sweep.id)
            return None if row is None else {**row.result, "analysis_id": row.id}
