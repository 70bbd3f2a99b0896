"""Registering a planned sweep in the store (SQLite and PostgreSQL): all or nothing, idempotent."""

from __future__ import annotations

import pytest

from twoclocks_cli.config import parse_config, plan
from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.launch import sweeps
from twoclocks_cli.launch.debug import DebugExecutor
from twoclocks_cli.store import Run, Sweep


def _plan(tmp_path, backend="sim", seeds=(0, 1)):
    return plan(parse_config({
        "name": "reg", "backend": backend, "sample_budget": 512, "workdir": str(tmp_path),
        "scaling": {"reference_batch": 16, "reference_lr": 0.01},
        "grid": {"batch": [1, 2], "group_size": 8, "seeds": list(seeds)},
        **({"sim": {"dim": 4, "flat_dims": 4}} if backend == "sim" else {})}))


def _count(store):
    with store.session() as s:
        return s.query(Sweep).count(), s.query(Run).count()


def test_register_submit_run_and_rerun(store, db_url, tmp_path):
    p = _plan(tmp_path)
    reg = sweeps.register(store, p, "t.toml")
    assert (reg.new, reg.existing) == (4, 0) and _count(store) == (1, 4)
    runs = sweeps.to_submit(store, reg, retry_failed=False)
    sent = sweeps.submit(store, reg, runs, DebugExecutor(), db_url)
    assert len(sent) == 4
    assert [r.status for r in store.list_runs("reg")] == ["completed"] * 4
    again = sweeps.register(store, p, "t.toml")
    assert (again.new, again.existing) == (0, 4)
    assert sweeps.to_submit(store, again, retry_failed=True) == []
    grown = sweeps.register(store, _plan(tmp_path, seeds=(0, 1, 2)), "t.toml")
    assert (grown.new, grown.existing) == (2, 4) and _count(store) == (1, 6)


def test_a_conflicting_config_writes_nothing(store, tmp_path):
    sweeps.register(store, _plan(tmp_path), "t.toml")
    before = _count(store)
    with pytest.raises(ConfigError, match="already exists with backend 'sim'"):
        sweeps.register(store, _plan(tmp_path, backend="grpo", seeds=(5, 6)), "t.toml")
    assert _count(store) == before
