"""The store facade: one object per database that hands out sessions, writers and queries."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
from sqlalchemy import Engine, delete, func, or_, select
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, selectinload, sessionmaker

from twoclocks_cli.core.errors import ConfigError, NotFoundError, StoreError
from twoclocks_cli.core.limits import INT64_MAX
from twoclocks_cli.store.analyses import AnalysisQueries
from twoclocks_cli.store.engine import describe_db_error, make_engine, mask_url, resolve_url
from twoclocks_cli.store.lifecycle import LifecycleQueries
from twoclocks_cli.store.migrate import ensure_schema
from twoclocks_cli.store.models import (
    Analysis,
    Metric,
    Run,
    RunEvent,
    RunStatus,
    Sweep,
    apply_status,
)
from twoclocks_cli.store.registry import RegistryQueries
from twoclocks_cli.store.writer import MetricWriter


@dataclass(frozen=True)
class Series:
    """One metric of one run, ordered by step: the arrays the clocks work on (NaN kept)."""

    steps: np.ndarray
    samples: np.ndarray
    values: np.ndarray


class Store(RegistryQueries, LifecycleQueries, AnalysisQueries):
    """A connected, schema-checked database. Build with `Store.open(url)`.

    The Store owns every query and write; the mixins group them by concept (registry: creating
    sweeps and runs; lifecycle: status changes and reconciliation; analyses)."""

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
        """Runs with their sweep loaded, optionally of one sweep (NotFoundError when there is
        no such sweep), in id order."""
        with self.session() as s:
            query = select(Run).options(selectinload(Run.sweep)).order_by(Run.id)
            if sweep is not None:
                query = query.where(Run.sweep_id == self.get_sweep(sweep).id)
            return list(s.scalars(query).all())

    def get_run(self, run_id: int) -> Run:
        if not 0 < run_id <= INT64_MAX:  # no row can hold it; SQLite would overflow on it
            raise NotFoundError(f"no run with id {run_id}")
        with self.session() as s:
            run = s.get(Run, run_id, options=[selectinload(Run.sweep)])
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

    # -- runs show, export, delete ------------------------------------------------------

    def find_run(self, ref: str) -> Run:
        """A run named by the user: its id, or a run name that only one run has."""
        ref = ref.strip()
        if ref.isdigit():
            return self.get_run(int(ref))
        with self.session() as s:
            q = select(Run).options(selectinload(Run.sweep)).where(Run.name == ref)
            runs = list(s.scalars(q.order_by(Run.id)))
        if len(runs) == 1:
            return runs[0]
        if not runs:
            raise NotFoundError(f"no run with id or name {ref!r}")
        ids = ", ".join(str(r.id) for r in runs[:10])
        raise NotFoundError(f"{len(runs)} runs are named {ref!r} (ids {ids}); name one by id")

    def metric_summary(self, run_id: int, keys: list[str] | None = None) -> dict[str, dict]:
        """Per key of one run: n points (n_nan of them NaN), first/last step and samples, and
        min/max over the non-NaN values, last value (two queries, whatever the run's length)."""
        agg = (
            select(Metric.key, func.count().label("n"), func.count(Metric.value).label("n_val"),
                   func.min(Metric.step).label("first"), func.max(Metric.step).label("last"),
                   func.min(Metric.value).label("lo"), func.max(Metric.value).label("hi"))
            .where(Metric.run_id == run_id)
            .group_by(Metric.key)
        )
        if keys is not None:
            agg = agg.where(Metric.key.in_(keys))
        sub = agg.subquery()
        ends = (
            select(Metric.key, Metric.step, Metric.samples, Metric.value)
            .join(sub, Metric.key == sub.c.key)
            .where(Metric.run_id == run_id,
                   or_(Metric.step == sub.c.first, Metric.step == sub.c.last))
        )
        with self.session() as s:
            out = {r.key: {"n": r.n, "n_nan": r.n - r.n_val, "first_step": r.first,
                           "last_step": r.last, "min": r.lo, "max": r.hi}
                   for r in s.execute(agg.order_by(Metric.key))}
            for key, step, samples, value in s.execute(ends):
                row = out[key]
                value = float("nan") if value is None else value
                if step == row["first_step"]:
                    row["first_samples"] = samples
                if step == row["last_step"]:
                    row["last_samples"], row["last"] = samples, value
        return out

    def iter_metrics(self, run_ids: list[int], keys: list[str] | None = None,
                     chunk: int = 20_000) -> Iterator[tuple[int, int, int, str, float]]:
        """(run_id, step, samples, key, value) of `run_ids`, ordered by run, step, key; NaN is
        a float NaN. Streams the rows (a server-side cursor on PostgreSQL)."""
        if not run_ids:
            return
        q = (
            select(Metric.run_id, Metric.step, Metric.samples, Metric.key, Metric.value)
            .where(Metric.run_id.in_(run_ids))
            .order_by(Metric.run_id, Metric.step, Metric.key)
        )
        if keys is not None:
            q = q.where(Metric.key.in_(keys))
        nan = float("nan")
        try:
            with self.engine.connect() as conn:
                result = conn.execution_options(stream_results=True, yield_per=chunk).execute(q)
                for rid, step, samples, key, value in result:
                    yield rid, step, samples, key, nan if value is None else value
        except (OperationalError, DBAPIError) as exc:
            raise StoreError(describe_db_error(exc, self.engine.url)) from None

    def delete_runs(self, run_ids: list[int], refuse: Iterable[str] = ()) -> dict[str, int]:
        """Delete runs with their metrics, events and the analyses that used them, in ONE
        transaction; a run whose status is in `refuse` (checked under a row lock) aborts it all.

        Returns the number of rows deleted per table."""
        ids = sorted(set(run_ids))
        with self.session() as s:
            runs = list(s.scalars(select(Run).where(Run.id.in_(ids)).with_for_update()))
            missing = sorted(set(ids) - {r.id for r in runs})
            if missing:
                raise NotFoundError(f"no run with id {missing[0]}")
            _refuse_active(runs, set(refuse))
            sweep_ids = {r.sweep_id for r in runs if r.sweep_id is not None}
            used = [a.id for a in s.scalars(select(Analysis).where(
                Analysis.sweep_id.in_(sweep_ids))) if _uses_runs(a.result, set(ids))]
            return _delete_rows(s, ids, used)

    def delete_sweep(self, name: str, refuse: Iterable[str] = ()) -> dict[str, int]:
        """Delete sweep `name`, its runs (metrics, events) and analyses, in ONE transaction;
        a run whose status is in `refuse` aborts it all. Returns rows deleted per table."""
        with self.session() as s:
            sweep = s.scalar(select(Sweep).where(Sweep.name == name).with_for_update())
            if sweep is None:
                names = s.scalars(select(Sweep.name).order_by(Sweep.name)).all()
                raise NotFoundError(f"no sweep named {name!r} (sweeps: "
                                    f"{', '.join(names) if names else 'none yet'})")
            runs = list(s.scalars(select(Run).where(Run.sweep_id == sweep.id)
                                  .with_for_update()))
            _refuse_active(runs, set(refuse))
            used = list(s.scalars(select(Analysis.id).where(Analysis.sweep_id == sweep.id)))
            counts = _delete_rows(s, [r.id for r in runs], used)
            s.execute(delete(Sweep).where(Sweep.id == sweep.id))
            return {**counts, "sweeps": 1}

    def count_metrics_of(self, run_ids: list[int]) -> int:
        """Metric rows of all `run_ids` together (one query)."""
        with self.session() as s:
            q = select(func.count()).select_from(Metric).where(Metric.run_id.in_(run_ids))
            return int(s.scalar(q))

    def table_counts(self) -> dict[str, int]:
        """Rows in every table of the store (what a delete must leave consistent)."""
        with self.session() as s:
            return {m.__tablename__: int(s.scalar(select(func.count()).select_from(m)))
                    for m in (Sweep, Run, Metric, RunEvent, Analysis)}


def _refuse_active(runs: list[Run], refuse: set[str]) -> None:
    """Raise ConfigError naming the first run whose status is in `refuse`."""
    busy = [r for r in runs if r.status in refuse]
    if busy:
        r = busy[0]
        more = f" (and {len(busy) - 1} more)" if len(busy) > 1 else ""
        raise ConfigError(f"run {r.id} ({r.name}) is {r.status}{more}: not deleted; "
                          "pass --force to cancel it first")


def _uses_runs(result: dict, ids: set[int]) -> bool:
    """Whether a stored analysis result was computed from any of `ids`.

    The store stands below the clocks and cannot import their `Analysis`: like the options it
    files in their own column (store.analyses), the run ids under `runs` are part of what the
    store knows of the document it keeps, so deleting a run deletes the analyses resting on it."""
    return any(r.get("run_id") in ids for r in (result or {}).get("runs") or [])


def _delete_rows(s: Session, run_ids: list[int], analysis_ids: list[int]) -> dict[str, int]:
    """Delete metrics, events, analyses and runs explicitly (no reliance on FK cascades)."""
    counts = {}
    for name, stmt in (
        ("metrics", delete(Metric).where(Metric.run_id.in_(run_ids))),
        ("run_events", delete(RunEvent).where(RunEvent.run_id.in_(run_ids))),
        ("analyses", delete(Analysis).where(Analysis.id.in_(analysis_ids))),
        ("runs", delete(Run).where(Run.id.in_(run_ids))),
    ):
        counts[name] = s.execute(stmt).rowcount
    return counts
