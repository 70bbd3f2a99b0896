"""Buffered, idempotent metric writer: the only path by which step metrics enter the store.

Rows are buffered per (step, key) (the last value logged wins) and written in batches as an
upsert on (run, step, key), so a retried or replayed batch — a requeued job, a resumed run —
never duplicates a row. NaN is written as NULL (the schema's NaN), ±inf as themselves.
PostgreSQL batches go through COPY into a temporary staging table, then one upsert.
"""

from __future__ import annotations

import atexit
import math
import time
from collections.abc import Mapping

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, OperationalError

from twoclocks_cli.core.errors import StoreError
from twoclocks_cli.store.engine import describe_db_error
from twoclocks_cli.store.pgretry import Backoff, transient

SQLITE_UPSERT = (
    "INSERT INTO metrics (run_id, step, key, samples, value) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (run_id, step, key) DO UPDATE SET samples = excluded.samples, "
    "value = excluded.value"
)
PG_STAGE = (
    "CREATE TEMP TABLE IF NOT EXISTS metrics_stage (run_id integer, step integer, "
    "key varchar(128), samples bigint, value double precision) ON COMMIT DELETE ROWS"
)
PG_UPSERT = (
    "INSERT INTO metrics (run_id, step, key, samples, value) "
    "SELECT run_id, step, key, samples, value FROM metrics_stage "
    "ON CONFLICT (run_id, step, key) DO UPDATE SET samples = EXCLUDED.samples, "
    "value = EXCLUDED.value"
)


def encode_value(value: float) -> float | None:
    """The store's encoding of a metric value: NaN → NULL, everything else as a float."""
    v = float(value)
    return None if v != v else v


def decode_value(value: float | None) -> float:
    return math.nan if value is None else value


class MetricWriter:
    """Buffer metrics of one run and upsert them in batches of `batch_rows`.

    Flushes when the buffer is full, on `flush()`, on `close()` / leaving a `with` block, and at
    interpreter exit. A failed batch is retried (`retries` times, with backoff) before raising.
    """

    def __init__(self, engine: Engine, run_id: int, batch_rows: int = 10_000, retries: int = 5):
        self.engine = engine
        self.run_id = int(run_id)
        self.batch_rows = batch_rows
        self.retries = retries
        self.rows_written = 0
        self.retries_used = 0  # failed attempts that were retried (a full or restarting server)
        self._buf: dict[tuple[int, str], tuple[int, float | None]] = {}
        self._closed = False
        self._postgres = engine.dialect.name == "postgresql"
        # A strong reference on purpose: an unclosed writer lives until exit and is flushed then.
        atexit.register(self.close)

    def log(self, step: int, samples: int, values: Mapping[str, float]) -> None:
        """Record `values` (key → number) at `step`, which had consumed `samples` samples."""
        if self._closed:
            raise StoreError(f"metric writer for run {self.run_id} is closed")
        buf = self._buf
        step = int(step)
        samples = int(samples)
        for key, value in values.items():
            v = float(value)
            buf[(step, key)] = (samples, None if v != v else v)
        if len(buf) >= self.batch_rows:
            self.flush()

    def flush(self) -> None:
        """Write every buffered row now (one transaction), retrying transient failures."""
        if not self._buf:
            return
        run_id = self.run_id
        rows = [(run_id, step, key, s, v) for (step, key), (s, v) in self._buf.items()]
        backoff, attempt = Backoff(), 0
        while True:
            try:
                self._write(rows)  # one transaction: a failed batch wrote nothing
                break
            except (OperationalError, DBAPIError) as exc:
                # a full or restarting server: keep the buffer and wait (bounded); anything
                # else gets the short retry it always had
                reached = getattr(self.engine, "info_reached", {}).get("reached", False)
                patient = self._postgres and transient(exc, reached)
                attempt += 1
                if not (backoff.wait() if patient else attempt <= self.retries):
                    raise StoreError(
                        f"writing {len(rows)} metric rows of run {run_id} failed: "
                        + describe_db_error(exc, self.engine.url)
                    ) from None
                if not patient:
                    time.sleep(min(0.1 * 2 ** (attempt - 1), 5.0))
        self.retries_used += attempt  # failed attempts before this batch landed
        self.rows_written += len(rows)
        self._buf.clear()

    def _write(self, rows: list[tuple]) -> None:
        with self.engine.begin() as conn:
            if self._postgres:
                cur = conn.connection.driver_connection.cursor()
                cur.execute(PG_STAGE)
                with cur.copy(
                    "COPY metrics_stage (run_id, step, key, samples, value) FROM STDIN"
                ) as copy:
                    for row in rows:
                        copy.write_row(row)
                cur.execute(PG_UPSERT)
            else:
                conn.exec_driver_sql(SQLITE_UPSERT, rows)

    def close(self) -> None:
        """Flush and stop accepting rows. Safe to call twice."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            atexit.unregister(self.close)

    def __enter__(self) -> MetricWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and not issubclass(exc_type, Exception):
            # Ctrl-C / SIGINT / SystemExit while writing: the interrupted transaction may still
            # hold SQLite's write lock in this process, and a flush now would wait on it for the
            # whole busy timeout (a `cancel` of a debug sweep hung so). The buffered rows are
            # after the last checkpoint (backends flush before they checkpoint), so a resume
            # replays them: drop them rather than risk the wait.
            self._buf.clear()
            self._closed = True
            atexit.unregister(self.close)
            return
        self.close()
