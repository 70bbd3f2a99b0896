"""Which run statuses the launcher moves between (the compare-and-set itself is
`Store.transition`, twoclocks_cli/store/lifecycle.py)."""

from __future__ import annotations

from twoclocks_cli.store.models import RunStatus

ACTIVE = frozenset({RunStatus.planned, RunStatus.submitted, RunStatus.running})
PENDING = frozenset({RunStatus.planned, RunStatus.lost})  # a plain `sweep` (re)submits these
RETRYABLE = frozenset({RunStatus.failed, RunStatus.cancelled})  # only with --retry-failed

