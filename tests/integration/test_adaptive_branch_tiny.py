"""The branch rule in real GRPO on `builtin:tiny-arith`: at a decision the trainer runs the
current batch and twice it from one copy of its state and continues from the chosen branch.

The truth is a run without branching: a two-phase run (the run's batch up to the decision,
then the chosen batch at the lr the controller gave it) goes through the same states, so every
row after the decision equals it value for value, on a sample axis shifted by exactly the
other branch's samples. A kill -9 and resume replays the same rows and decisions."""

from __future__ import annotations

import signal
import time

import pytest

from tests.integration.test_adaptive_tiny import _events
from tests.support.cells import TIMING, finish, run_cell, step_metrics, store_run

pytestmark = [pytest.mark.slow, pytest.mark.tiny_model, pytest.mark.one_worker]


BASE = dict(
    prompts_per_batch=2,  # the reference batch of the lr rule
    group_size=8,
    lr=2e-4,
    sample_budget=224,
    seed=5,
    eval_every_samples=16,  # every step: the decision's step evaluates on the branches' seed
    eval_size=32,
    checkpoint_every_steps=2,
    micro_batch_size=32,
    max_new_tokens=12,
    threads=2,
    noise_every=1,
)
# the first decision at the first step (16 samples): branches of 2 and 4 prompts, 64 samples
# each (two steps of 32). The run is then at 144 samples, too close to the budget for the two
# branches of a second one (or at batch_max, with nothing to branch)
ADAPTIVE = {"rule": "branch", "batch_min": 2, "batch_max": 4, "adapt_every": 16,
            "branch_samples": 64}
# the rows that differ by construction: the controller's own, the phase index, timings
OWN = ("adaptive_", "phase", "eval_")


def _rows(url, run_id):
    rows = step_metrics(url, run_id)
    return {k: v for k, v in rows.items()
            if k[1] not in TIMING and not k[1].startswith(OWN)}


@pytest.fixture(scope="module")
def branched(tiny_model, tmp_path_factory):
    """(store url, id) of one uninterrupted branching run, shared by the tests below."""
    folder = tmp_path_factory.mktemp("branched")
    url = f"sqlite:///{folder / 's.db'}"
    run_id = store_run(url, {**BASE, "batch_schedule": "adaptive", "adaptive": ADAPTIVE})
    finish(run_cell(url, run_id, folder / "adaptive"))
    return url, run_id


def test_the_kept_branch_is_the_run_it_would_have_been_and_the_other_is_charged(
        branched, tmp_path):
    url, run_id = branched
    rows = step_metrics(url, run_id)
    events = _events(url, run_id)
    assert "branches 2 and 4 prompts, 64 samples each" in events[0]
    assert not any("samples each" in e for e in events[1:])
    chosen = int(rows[(1, "adaptive_next_prompts")][1])
    assert chosen in (2, 4)
    lr_after = rows[(2, "lr")][1]
    assert lr_after == pytest.approx(2e-4 * (chosen / 2) ** 0.5, rel=1e-12)

    truth_cfg = {**BASE, "phases": [
        {"until_samples": 16, "prompts_per_batch": 2, "lr": rows[(1, "lr")][1]},
        {"prompts_per_batch": chosen, "lr": lr_after}]}
    truth_id = store_run(url, truth_cfg)
    finish(run_cell(url, truth_id, tmp_path / "truth"))
    got, want = _rows(url, run_id), _rows(url, truth_id)

    charged = 64  # the branch not taken
    steps_got = sorted({s for s, _ in got})
    assert rows[(1, "batch_samples")][1] == 16
    for step in steps_got:
        keys = {k for s, k in got if s == step}
        assert keys == {k for s, k in want if s == step}, step
        for key in keys:
            n_got, v_got = got[(step, key)]
            n_want, v_want = want[(step, key)]
            assert v_got == v_want, (step, key, v_got, v_want)
            assert n_got == n_want + (charged if step > 1 else 0), (step, key)
    # the run ends at the budget on its own clock: the truth's steps less the charged samples
    last = max(steps_got)
    assert got[(last, "batch_samples")][0] >= BASE["sample_budget"]
    assert max(s for s, _ in want) > last
    # the decision's measurements: each branch's gain is its held-out accuracy after it minus
    # before, the drift its last step's
    gain_b = rows[(1, "adaptive_branch_gain_b")][1]
    gain_2b = rows[(1, "adaptive_branch_gain_2b")][1]
    kept_end = 1 + 64 // (8 * chosen)
    acc, acc0 = rows[(kept_end, "eval_accuracy")][1], rows[(1, "eval_accuracy")][1]
    assert acc - acc0 == pytest.approx(gain_b if chosen == 2 else gain_2b, abs=1e-12)


def test_a_branching_run_killed_and_resumed_equals_an_uninterrupted_one(branched, tmp_path):
    url, ref_id = branched
    killed_id = store_run(url, {**BASE, "batch_schedule": "adaptive", "adaptive": ADAPTIVE})
    victim = run_cell(url, killed_id, tmp_path / "killed")
    from twoclocks_cli.store import Store

    store = Store.open(url)
    deadline = time.monotonic() + 900
    # killed while it branches (the decision's row is written first) or just after
    while (store.max_step(killed_id) or 0) < 1 and victim.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL
    finish(run_cell(url, killed_id, tmp_path / "killed"))
    a, b = step_metrics(url, ref_id), step_metrics(url, killed_id)
    assert set(a) == set(b)
    diff = [(k, a[k], b[k]) for k in a if k[1] not in TIMING and a[k] != b[k]]
    assert not diff, diff[:5]
    assert _events(url, ref_id) == _events(url, killed_id)
