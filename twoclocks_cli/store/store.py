"""The store facade: one object per database that hands out sessions, writers and queries."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
from sqlalchemy import Engine, func, select
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from twoclocks_cli.errors import NotFoundError, StoreError
from twoclocks_cli.store.engine import describe_db_error, make_engine, mask_url, resolve_url
from twoclocks_cli.store.migrate import ensure_schema
from twoclocks_cli.store.models import (
    Metric,
    Run,
    RunEvent,
    RunStatus,
    Sweep,
    apply_status,
)
from twoclocks_cli.store.writer import MetricWriter


@dataclass(frozen=True)
class Series:
    """One metric of one run, ordered by step: the arrays the clocks work on (NaN kept)."""

    steps: np.ndarray
    samples: np.ndarray
    values: np.ndarray


class Store:
    """A connected, schema-checked database. Build with `Store.open(url)`."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @classmethod
    def open(cls, url: str | None = None, migrate: bool = True) -> Store:
        """Connect to `url` (resolved: --db > $TWOCLOCKS_DB > sqlite:///twoclocks.db).

        An empty database is migrated on first use; an out-of-date one raises StoreError.
        """
        engine = make_engine(resolve_url(url))
        if migrate:
            ensure_schema(engine)
        return cls(engine)

    @property
    def url(self) -> str:
        return mask_url(self.engine.url)

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """A session that commits on success and rolls back on error; DB errors → StoreError."""
        session = self._sessions()
        try:
            yield session
            session.commit()
        except (OperationalError, DBAPIError) as exc:
            session.rollback()
            raise StoreError(describe_db_error(exc, self.engine.url)) from None
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def metric_writer(self, run_id: int, batch_rows: int = 10_000) -> MetricWriter:
        """A buffered, idempotent writer of step metrics for one run."""
        return MetricWriter(self.engine, run_id, batch_rows=batch_rows)

    def close(self) -> None:
        self.engine.dispose()

    # -- sweeps and runs -------------------------------------------------------------------

    def get_sweep(self, name: str) -> Sweep:
        with self.session() as s:
            sweep = s.scalar(select(Sweep).where(Sweep.name == name))
            if sweep is None:
                names = s.scalars(select(Sweep.name).order_by(Sweep.name)).all()
                known = ", ".join(names) if names else "none yet"
                raise NotFoundError(f"no sweep named {name!r} (sweeps: {known})")
            return sweep

    def list_runs(self, sweep: str | None = None) -> list[Run]:
        """Runs, optionally of one sweep, in id order."""
        with self.session() as s:
            query = select(Run).order_by(Run.id)
            if sweep is not None:
                query = query.where(Run.sweep_id == self.get_sweep(sweep).id)
            return list(s.scalars(query).all())

    def get_run(self, run_id: int) -> Run:
        with self.session() as s:
            run = s.get(Run, run_id)
            if run is None:
                raise NotFoundError(f"no run with id {run_id}")
            return run

    def set_status(
        self, run_id: int, status: RunStatus | str, message: str | None = None, **fields
    ) -> Run:
        """Move a run to `status`, set extra columns (job_id, host, error, ...), log an event."""
        with self.session() as s:
            run = s.get(Run, run_id)
            if run is None:
                raise NotFoundError(f"no run with id {run_id}")
            s.add(apply_status(run, RunStatus(status), message, **fields))
            return run

    def events(self, run_id: int) -> list[RunEvent]:
        with self.session() as s:
            q = select(RunEvent).where(RunEvent.run_id == run_id).order_by(RunEvent.id)
            return list(s.scalars(q).all())

    # -- metrics --------------------------------------------------------------------------

    def metric_keys(self, run_ids: Iterable[int]) -> list[str]:
        """Every metric key logged by any of `run_ids`, sorted."""
        ids = list(run_ids)
        with self.session() as s:
            q = select(Metric.key).where(Metric.run_id.in_(ids)).distinct().order_by(Metric.key)
            return list(s.scalars(q).all())

    def load_metric(self, run_ids: Iterable[int], key: str) -> dict[int, Series]:
        """Metric `key` for each run, ordered by step; runs without it are absent."""
        ids = list(run_ids)
        out: dict[int, Series] = {}
        if not ids:
            return out
        q = (
            select(Metric.run_id, Metric.step, Metric.samples, Metric.value)
            .where(Metric.key == key, Metric.run_id.in_(ids))
            .order_by(Metric.run_id, Metric.step)
        )
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(q).all()
        except (OperationalError, DBAPIError) as exc:
            raise StoreError(describe_db_error(exc, self.engine.url)) from None
        if not rows:
            return out
        arr = np.array(
            [(r[0], r[1], r[2], np.nan if r[3] is None else r[3]) for r in rows], dtype=float
        )
        cuts = np.flatnonzero(np.diff(arr[:, 0])) + 1
        for chunk in np.split(arr, cuts):
            out[int(chunk[0, 0])] = Series(
                steps=chunk[:, 1].astype(np.int64),
                samples=chunk[:, 2].astype(np.int64),
                values=chunk[:, 3].copy(),
            )
        return out

    def max_step(self, run_id: int) -> int | None:
        """The last step with any metric of this run (where a resumed run continues)."""
        with self.session() as s:
            return s.scalar(select(func.max(Metric.step)).where(Metric.run_id == run_id))

    def count_metrics(self, run_id: int | None = None) -> int:
        with self.session() as s:
            q = select(func.count()).select_from(Metric)
            if run_id is not None:
                q = q.where(Metric.run_id == run_id)
            return int(s.scalar(q))
