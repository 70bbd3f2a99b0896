"""Conditional run-status changes: move a run only if it is still in an expected state.

The job, the reconciler and `cancel` race each other; a compare-and-set in one transaction
means a cancelled run is never flipped back to completed, and a finished run is never
claimed dead by a scheduler answer that arrived after the job reported.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select

from twoclocks_cli.store.models import Run, RunStatus, apply_status

ACTIVE = frozenset({RunStatus.planned, RunStatus.submitted, RunStatus.running})
PENDING = frozenset({RunStatus.planned, RunStatus.lost})  # a plain `sweep` (re)submits these
RETRYABLE = frozenset({RunStatus.failed, RunStatus.cancelled})  # only with --retry-failed


def transition(store, run_id: int, to: RunStatus, only_from: Iterable[RunStatus],
               message: str | None = None, job_id_is: str | None = None, **fields) -> bool:
    """Set run `run_id` to `to` (plus columns) iff its status is in `only_from` (and its job id
    is `job_id_is`, when given); log an event. Returns whether it changed."""
    allowed = {RunStatus(s).value for s in only_from}
    with store.session() as s:
        run = s.get(Run, run_id, with_for_update=True)  # row lock on PostgreSQL
        if run is None or run.status not in allowed:
            return False
        if job_id_is is not None and run.job_id != job_id_is:
            return False
        s.add(apply_status(run, to, message, **fields))
        return True


def transition_many(store, run_ids: Iterable[int], to: RunStatus, only_from: Iterable[RunStatus],
                    message: str | None = None, **fields) -> list[int]:
    """`transition` for many runs in ONE transaction; returns the ids that changed."""
    allowed = {RunStatus(s).value for s in only_from}
    ids = list(run_ids)
    changed = []
    with store.session() as s:
        q = select(Run).where(Run.id.in_(ids)).with_for_update().order_by(Run.id)
        for run in s.scalars(q):
            if run.status not in allowed:
                continue
            s.add(apply_status(run, to, message, **fields))
            changed.append(run.id)
    return changed
