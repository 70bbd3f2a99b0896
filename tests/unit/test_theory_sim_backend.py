"""The sim backend: metrics it writes, phases, divergence, bad cells (its resume after a hard kill:
tests/integration/test_sim_resume_after_kill.py)."""

import numpy as np
import pytest

from twoclocks_cli.backends import run_cell
from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.store import Run, RunStatus, Store, Sweep

COMMON = {
    "prompts_per_batch": 2,
    "group_size": 2,
    "lr": 0.005,
    "clip_eps_low": 0.2,
    "clip_eps_high": 0.2,
    "seed": 3,
}


def _run_row(store, cell, name):
    with store.session() as s:
        sw = Sweep(name=name, backend="sim", config={})
        s.add(sw)
        s.flush()
        r = Run(
            sweep_id=sw.id,
            cell_id=name,
            name=name,
            backend="sim",
            batch_prompts=2,
            group_size=2,
            batch_samples=4,
            lr=cell["lr"],
            seed=3,
            config=cell,
        )
        s.add(r)
        s.flush()
        return r.id


def _all_metrics(store, rid):
    out = {}
    for key in store.metric_keys([rid]):
        s = store.load_metric([rid], key)[rid]
        out[key] = (s.steps.tolist(), s.samples.tolist(), np.nan_to_num(s.values, nan=-1).tolist())
    return out


def test_writes_the_common_keys_and_runs_phases(sqlite_url, tmp_path):
    store = Store.open(sqlite_url)
    cell = {
        **COMMON,
        "sample_budget": 4000,
        "sim": {"eval_every": 5},
        "phases": [
            {"until_samples": 2000, "prompts_per_batch": 2, "lr": 0.005},
            {"prompts_per_batch": 8, "lr": 0.01, "clip_eps_low": 0.1},
        ],
    }
    rid = _run_row(store, cell, "phased")
    assert run_cell(store, rid, tmp_path / "w") == RunStatus.completed
    keys = set(store.metric_keys([rid]))
    assert keys >= {
        "reward_mean",
        "eval_accuracy",
        "drift_abs",
        "drift_rel",
        "loss",
        "lr",
        "batch_samples",
        "phase",
        "grad_sq_micro",
        "grad_sq_full",
        "grad_micro_size",
        "grad_full_size",
        "nonfinite",
    }
    b = store.load_metric([rid], "batch_samples")[rid]
    assert b.values[b.samples <= 2000].max() == 4 and b.values[-1] == 16
    assert b.samples[-1] == 4000 and np.all(np.diff(b.samples) > 0)
    r = store.load_metric([rid], "reward_mean")[rid].values
    assert 0 <= r.min() and r.max() <= 1 and r[-10:].mean() > r[:10].mean()
    ev = store.load_metric([rid], "eval_accuracy")[rid]
    assert ev.steps.size == pytest.approx(b.steps.size / 5, abs=1)


def test_nonfinite_returns_diverged(sqlite_url, tmp_path):
    store = Store.open(sqlite_url)
    cell = {**COMMON, "lr": 1e6, "sample_budget": 4000, "sim": {"optimizer": "sgd"}}
    rid = _run_row(store, cell, "boom")
    assert run_cell(store, rid, tmp_path / "w") == RunStatus.diverged
    flag = store.load_metric([rid], "nonfinite")[rid]
    assert flag.values[-1] == 1.0 and (flag.values[:-1] == 0).all()


@pytest.mark.parametrize(
    "bad,needle",
    [
        ({"sim": {"flat": 3}}, "unknown key"),
        ({"prompts_per_batch": None}, "prompts_per_batch"),
        ({"phases": "fast"}, "phases"),
        ({"sample_budget": "lots"}, "sample_budget"),
    ],
)
def test_bad_cells_raise_config_errors(sqlite_url, tmp_path, bad, needle):
    store = Store.open(sqlite_url)
    cell = {**COMMON, "sample_budget": 400, **bad}
    rid = _run_row(store, cell, "bad")
    with pytest.raises(ConfigError, match=needle):
        run_cell(store, rid, tmp_path / "w")
    assert store.count_metrics(rid) == 0
