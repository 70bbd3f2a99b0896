"""PostgreSQL under cluster load: short-lived connections and patient, bounded retries.

A SLURM array of hundreds of cells writes to one server. Each process holds a connection only
while it talks to the server (no pool: `NullPool`), so 256 writers share a server with
`max_connections = 50`. A connection refused because the server is full ("too many clients",
"remaining connection slots are reserved") or starting up / shutting down is retried with
exponential backoff and jitter; once a process has reached the server, "connection refused" and
a dropped connection (a server restart) are retried the same way. A server that does not
answer within `connect_timeout` (10 s; swamped by a burst of job starts) is retried a few times
even before it was reached, so a wrong host still fails within about a minute. Retries stop after
`$TWOCLOCKS_DB_RETRY_S` seconds (default 600), then the caller's one-line StoreError applies. For
arrays much larger than the server's connection limit, put pgbouncer (transaction pooling) in
front of it and point the store URL at pgbouncer.
"""

from __future__ import annotations

import os
import random
import time

RETRY_ENV = "TWOCLOCKS_DB_RETRY_S"
DEFAULT_RETRY_S = 600.0
# server is there but cannot take this connection now: retried from the first attempt
# ("not yet accepting connections": PostgreSQL 16+ while it replays WAL after a restart)
_BUSY = ("too many clients", "remaining connection slots", "the database system is starting up",
         "the database system is shutting down", "the database system is in recovery mode",
         "the database system is not yet accepting connections",
         "the database system is not accepting connections", "cannot connect now")
# the server went away: retried once this process has reached it before (a restart)
_GONE = ("connection refused", "server closed the connection", "terminating connection",
         "connection not open", "consuming input failed", "connection is closed",
         "could not receive data", "could not send data", "ssl syscall error", "eof detected",
         "the connection is lost", "connection reset")
# the server did not answer within connect_timeout: a server swamped by a burst of job starts
# answers later (retried a few times before it was ever reached, so a wrong host fails in
# about a minute; always once it was reached)
_SLOW = ("timeout expired",)
FIRST_CONTACT_TIMEOUTS = 4


def retry_budget() -> float:
    """Seconds of retrying allowed ($TWOCLOCKS_DB_RETRY_S, default 600; 0 = no retry)."""
    try:
        return max(0.0, float(os.environ.get(RETRY_ENV, DEFAULT_RETRY_S)))
    except ValueError:
        return DEFAULT_RETRY_S


def transient(exc: BaseException, reached_before: bool, timeouts_so_far: int = 0) -> bool:
    """Whether `exc` (a driver or SQLAlchemy error) is worth retrying."""
    text = str(getattr(exc, "orig", None) or exc).lower()
    if any(p in text for p in _BUSY):
        return True
    if any(p in text for p in _SLOW):
        return reached_before or timeouts_so_far < FIRST_CONTACT_TIMEOUTS
    return reached_before and any(p in text for p in _GONE)


class Backoff:
    """Sleep times 0.05 s, 0.1 s, ... capped at 5 s, with +-50% jitter, until the budget ends."""

    def __init__(self, budget: float | None = None):
        self.deadline = time.monotonic() + (retry_budget() if budget is None else budget)
        self.attempt = 0
        self.retries = 0

    def wait(self) -> bool:
        """Sleep before the next attempt; False when the budget is spent (give up)."""
        delay = min(0.05 * 2**self.attempt, 5.0) * random.uniform(0.5, 1.5)
        if time.monotonic() + delay > self.deadline:
            return False
        time.sleep(delay)
        self.attempt += 1
        self.retries += 1
        return True


def install(engine) -> None:
    """Connect through a retrying `do_connect` on a PostgreSQL engine (see the module doc)."""
    from sqlalchemy import event

    state = {"reached": False, "retries": 0}  # retries: connection attempts waited out

    @event.listens_for(engine, "do_connect")
    def _connect(dialect, conn_rec, cargs, cparams):
        backoff = Backoff()
        timeouts = 0
        while True:
            try:
                conn = dialect.loaded_dbapi.connect(*cargs, **cparams)
                state["reached"] = True
                return conn
            except dialect.loaded_dbapi.OperationalError as exc:
                if not transient(exc, state["reached"], timeouts) or not backoff.wait():
                    raise
                timeouts += any(p in str(exc).lower() for p in _SLOW)
                state["retries"] += 1

    engine.info_reached = state  # the writer retries dropped connections once this is True
