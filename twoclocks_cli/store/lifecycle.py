"""The queries of a run's life after registration: status changes, reconciliation, counts.

The job, the reconciler and `cancel` race each other; each status change is a compare-and-set in
one transaction, so a cancelled run is never flipped back to completed and a finished run is
never claimed dead by a scheduler answer that arrived after the job reported.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from sqlalchemy import func, select

from twoclocks_cli.store.models import Metric, Run, RunEvent, RunStatus, Sweep, apply_status


def _values(statuses: Iterable[RunStatus]) -> set[str]:
    return {RunStatus(s).value for s in statuses}


class LifecycleQueries:
    """Store methods for run status (mixed into `Store`; they use its `session`)."""

    def transition(self, run_id: int, to: RunStatus, only_from: Iterable[RunStatus],
                   message: str | None = None, job_id_is: str | None = None, **fields) -> bool:
        """Set run `run_id` to `to` (plus columns) iff its status is in `only_from` (and its job
        id is `job_id_is`, when given); log an event. Returns whether it changed."""
        allowed = _values(only_from)
        with self.session() as s:
            run = s.get(Run, run_id, with_for_update=True)  # row lock on PostgreSQL
            if run is None or run.status not in allowed:
                return False
            if job_id_is is not None and run.job_id != job_id_is:
                return False
            s.add(apply_status(run, to, message, **fields))
            return True

    def record_note(self, run_id: int, message: str) -> bool:
        """Add an event with `message` at the run's current status (a note, such as an adaptive
        controller's decision), once: a note already recorded (a replayed step after a resume)
        is not added again. False when the run does not exist or the note was there."""
        with self.session() as s:
            run = s.get(Run, run_id)
            if run is None:
                return False
            seen = s.scalar(select(RunEvent.id).where(RunEvent.run_id == run_id,
                                                      RunEvent.message == message).limit(1))
            if seen is not None:
                return False
            s.add(RunEvent(run_id=run_id, from_status=run.status, to_status=run.status,
                           message=message))
            return True

    def transition_many(self, run_ids: Iterable[int], to: RunStatus,
                        only_from: Iterable[RunStatus], message: str | None = None,
                        **fields) -> list[int]:
        """`transition` for many runs in ONE transaction; returns the ids that changed."""
        allowed = _values(only_from)
        changed = []
        with self.session() as s:
            q = select(Run).where(Run.id.in_(list(run_ids))).with_for_update().order_by(Run.id)
            for run in s.scalars(q):
                if run.status in allowed:
                    s.add(apply_status(run, to, message, **fields))
                    changed.append(run.id)
        return changed

    def runs_with_status(self, run_ids: Iterable[int], statuses: Iterable[RunStatus]) -> list[Run]:
        """The runs among `run_ids` whose status is one of `statuses`, by id."""
        with self.session() as s:
            q = select(Run).where(Run.id.in_(list(run_ids)), Run.status.in_(_values(statuses)))
            return list(s.scalars(q.order_by(Run.id)))

    def record_jobs(self, sweep: str, executor: str, job_ids: dict[int, str],
                    placeholder: str) -> None:
        """Store the executor's job ids of submitted runs still holding `placeholder` (a run
        cancelled or reconciled meanwhile keeps what it has), and the sweep's executor."""
        with self.session() as s:
            s.scalar(select(Sweep).where(Sweep.name == sweep)).executor = executor
            for rid, jid in job_ids.items():
                run = s.get(Run, rid)
                if run.status == RunStatus.submitted.value and run.job_id == placeholder:
                    run.job_id = jid

    def jobs_with_status(self, statuses: Iterable[RunStatus], sweep: str | None = None,
                         submitted_only: bool = False) -> list:
        """(id, job_id, status, submitted_at) of the runs in `statuses` (of one sweep or all;
        only those with a job id when `submitted_only`): what the reconciler and `cancel` ask
        the schedulers about."""
        with self.session() as s:
            q = select(Run.id, Run.job_id, Run.status, Run.submitted_at).where(
                Run.status.in_(_values(statuses)))
            if submitted_only:
                q = q.where(Run.job_id.is_not(None))
            if sweep is not None:
                q = q.join(Sweep, Run.sweep_id == Sweep.id).where(Sweep.name == sweep)
            return list(s.execute(q.order_by(Run.id)).all())

    def status_counts(self, sweep: str | None = None) -> dict[str, Counter]:
        """Run counts by status, per sweep name."""
        with self.session() as s:
            q = (select(Sweep.name, Run.status, func.count()).join(Run, Run.sweep_id == Sweep.id)
                 .group_by(Sweep.name, Run.status))
            if sweep is not None:
                q = q.where(Sweep.name == sweep)
            out: dict[str, Counter] = {}
            for name, status, n in s.execute(q):
                out.setdefault(name, Counter())[status] = n
        return out

    def last_steps(self, run_ids: list[int]) -> dict[int, int]:
        """The last logged step of each run (one query)."""
        if not run_ids:
            return {}
        with self.session() as s:
            q = (select(Metric.run_id, func.max(Metric.step)).where(Metric.run_id.in_(run_ids))
                 .group_by(Metric.run_id))
            return {rid: step for rid, step in s.execute(q)}
