"""The queries of stored analyses: save one result of a sweep (reusing an identical one), fetch
its newest.

A result is the JSON document `clocks.result.Analysis.to_json` writes (`clocks.saved` turns it
back into an Analysis); the store stands below the clocks, so it keeps the document as it is and
reads only its `options`, filed in their own column, and its `analysis_id`, which is the row's id
and not content."""

from __future__ import annotations

from datetime import timedelta, timezone

from sqlalchemy import func, select

from twoclocks_cli.store.models import Analysis, utcnow


class AnalysisQueries:
    """Store methods for analyses (mixed into `Store`; they use its `session`)."""

    def _newest_analysis(self, s, sweep_id: int) -> Analysis | None:
        q = (select(Analysis).where(Analysis.sweep_id == sweep_id)
             .order_by(Analysis.created_at.desc(), Analysis.id.desc()).limit(1))
        return s.scalar(q)

    def _identical_analysis(self, s, sweep_id: int, result: dict) -> Analysis | None:
        """A stored analysis of the sweep equal to `result` (options compared first, so only
        the rows with the same options have their result read)."""
        options = result.get("options", {})
        ids = [i for i, o in s.execute(select(Analysis.id, Analysis.options)
                                       .where(Analysis.sweep_id == sweep_id)
                                       .order_by(Analysis.id.desc())) if o == options]
        for i in ids:
            row = s.get(Analysis, i)
            if row.result == result:
                return row
        return None

    def save_analysis(self, sweep_name: str, result: dict) -> int:
        """Store one analysis result of `sweep_name`; returns its id. One identical to a stored
        analysis of the sweep is not stored again: that row is reused (made the newest, so
        `schedule` and `report` take it) and its id returned."""
        sweep = self.get_sweep(sweep_name)
        result = {k: v for k, v in result.items() if k != "analysis_id"}
        with self.session() as s:
            latest = self._newest_analysis(s, sweep.id)
            if latest is not None and latest.result == result:
                return latest.id
            same = self._identical_analysis(s, sweep.id, result)
            if same is not None:
                same.created_at = _after(latest.created_at)
                return same.id
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

    def count_analyses(self, sweep_name: str | None = None) -> int:
        """How many analyses are stored (of one sweep, or all)."""
        q = select(func.count()).select_from(Analysis)
        if sweep_name is not None:
            q = q.where(Analysis.sweep_id == self.get_sweep(sweep_name).id)
        with self.session() as s:
            return int(s.scalar(q))


def _after(then):
    """Now, or just after `then` if the clock has not moved past it (SQLite returns naive UTC)."""
    then = then if then.tzinfo is not None else then.replace(tzinfo=timezone.utc)
    return max(utcnow(), then + timedelta(microseconds=1))
