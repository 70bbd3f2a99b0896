"""The experiment store: SQLAlchemy 2 over SQLite (default) or PostgreSQL, Alembic-migrated."""

from twoclocks_cli.store.models import FINISHED, Metric, Run, RunEvent, RunStatus, Sweep
from twoclocks_cli.store.store import Series, Store
from twoclocks_cli.store.writer import MetricWriter

__all__ = [
    "FINISHED",
    "Metric",
    "MetricWriter",
    "Run",
    "RunEvent",
    "RunStatus",
    "Series",
    "Store",
    "Sweep",
]
