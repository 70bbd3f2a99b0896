"""Run events that are not status changes: notes such as an adaptive controller's decisions."""

from __future__ import annotations

from sqlalchemy import select

from twoclocks_cli.store.models import Run, RunEvent


def record_note(store, run_id: int, message: str) -> bool:
    """Add an event with `message` at the run's current status, once: a note already recorded
    (a replayed step after a resume) is not added again. False when the run does not exist or
    the note was there."""
    with store.session() as s:
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
