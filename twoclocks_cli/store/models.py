"""SQLAlchemy 2 models of the experiment store: sweeps, runs, step metrics, run events.

Metric values: SQLite turns a bound NaN into NULL, so the schema fixes the encoding on every
backend: `value IS NULL` means NaN (a metric that was not logged has no row at all); ±inf are
stored as themselves. The writer and the queries apply this rule; nothing else touches it.
"""

from __future__ import annotations

import enum
from datetime import datetime, timezone

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from twoclocks_cli.core.limits import NAME_CHARS


def utcnow() -> datetime:
    """Timezone-aware now, the only clock the store uses."""
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    pass


class RunStatus(str, enum.Enum):
    """Lifecycle: planned → submitted → running → completed | failed | diverged | cancelled,
    or `lost`: the job vanished without reporting (killed, node lost, out of memory); a lost
    run is not finished — a plain `twoclocks sweep` resubmits it and it resumes from its
    checkpoint. `incomplete`: an imported log that does not end as a finished run's (no exit
    record: killed, or still being written). `status` is a String(16) column without an enum
    constraint (no migration)."""

    planned = "planned"
    submitted = "submitted"
    running = "running"
    completed = "completed"
    failed = "failed"
    diverged = "diverged"
    cancelled = "cancelled"
    lost = "lost"
    incomplete = "incomplete"

    @property
    def finished(self) -> bool:
        return self in FINISHED


FINISHED = frozenset(
    {RunStatus.completed, RunStatus.failed, RunStatus.diverged, RunStatus.cancelled}
)


class Sweep(Base):
    """A named set of cells that share a config file (one `twoclocks sweep` or an ingest)."""

    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_CHARS), unique=True)
    backend: Mapped[str] = mapped_column(String(32))
    config: Mapped[dict] = mapped_column(JSON, default=dict)
    executor: Mapped[str | None] = mapped_column(String(32))
    folder: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    runs: Mapped[list[Run]] = relationship(back_populates="sweep")


class Run(Base):
    """One training run (a sweep cell, a `twoclocks train`, or an ingested log)."""

    __tablename__ = "runs"
    __table_args__ = (
        UniqueConstraint("sweep_id", "cell_id", name="uq_runs_sweep_cell"),
        Index("ix_runs_sweep_status", "sweep_id", "status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))
    cell_id: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(NAME_CHARS))
    backend: Mapped[str] = mapped_column(String(32))
    batch_prompts: Mapped[int | None] = mapped_column(Integer)
    group_size: Mapped[int | None] = mapped_column(Integer)
    batch_samples: Mapped[int | None] = mapped_column(Integer)
    lr: Mapped[float | None] = mapped_column(Float)
    clip_low: Mapped[float | None] = mapped_column(Float)
    clip_high: Mapped[float | None] = mapped_column(Float)
    seed: Mapped[int | None] = mapped_column(Integer)
    config: Mapped[dict] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(16), default=RunStatus.planned.value)
    job_id: Mapped[str | None] = mapped_column(String(64))
    host: Mapped[str | None] = mapped_column(String(255))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    submitted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, onupdate=utcnow
    )

    sweep: Mapped[Sweep | None] = relationship(back_populates="runs")


class Metric(Base):
    """One logged value: (run, step, key) is unique; `samples` is the clock's x axis."""

    __tablename__ = "metrics"
    __table_args__ = (
        # serves "metric K for every run of sweep S ordered by samples"
        Index("ix_metrics_key_run_samples", "key", "run_id", "samples"),
    )

    run_id: Mapped[int] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    samples: Mapped[int] = mapped_column(BigInteger)
    value: Mapped[float | None] = mapped_column(Float)  # NULL means NaN (see module doc)


class RunEvent(Base):
    """A state change of a run, with when and why; the audit trail behind `status`."""

    __tablename__ = "run_events"
    __table_args__ = (Index("ix_run_events_run", "run_id", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    from_status: Mapped[str | None] = mapped_column(String(16))
    to_status: Mapped[str] = mapped_column(String(16))
    message: Mapped[str | None] = mapped_column(Text)


class Analysis(Base):
    """A stored `twoclocks analyze` result (options and result JSON), reused by schedule/report."""

    __tablename__ = "analyses"
    __table_args__ = (Index("ix_analyses_sweep_created", "sweep_id", "created_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    options: Mapped[dict] = mapped_column(JSON, default=dict)
    result: Mapped[dict] = mapped_column(JSON, default=dict)


def apply_status(run: Run, status: RunStatus, message: str | None = None, **fields) -> RunEvent:
    """Move `run` to `status` in memory (timestamps, extra columns); return the event to add.

    The one place that knows which timestamp a status sets; callers own the transaction.
    """
    now = utcnow()
    previous = run.status
    run.status = status.value
    for name, value in fields.items():
        setattr(run, name, value)
    if status is RunStatus.submitted:
        run.submitted_at = now
    elif status is RunStatus.running:
        run.started_at = now
    elif status.finished:
        run.finished_at = now
    return RunEvent(run_id=run.id, at=now, from_status=previous, to_status=status.value,
                    message=message)
