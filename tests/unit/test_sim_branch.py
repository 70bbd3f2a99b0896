"""The sim backend's branch runner (`twoclocks_cli.adaptive.sim_branch`), called directly with a
real controller, against what the quadratic model gives: by hand where the noise is negligible,
and the exact expected loss (`theory.closed_form.expected_loss`) where it is not.

SGD under linear lr scaling keeps c = lr / B fixed, so a branch of n steps at batch B moves
each curved coordinate by r^n with r = 1 - c B h, and its expected loss is the closed form's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainer.adaptive.config import AdaptiveConfig
from twoclocks_cli.adaptive import sim_branch
from twoclocks_cli.adaptive.controller import Controller
from twoclocks_cli.theory.closed_form import expected_loss
from twoclocks_cli.theory.model import ModelConfig
from twoclocks_cli.theory.simulate import SimState

G = 4  # group size: prompts p run batches of 4p samples
LR1 = 0.02  # lr at 1 prompt; linear scaling: c = LR1 / G per sample at every batch


def _ctl(drift_key: str = "drift_abs") -> Controller:
    """A branch-rule controller at 1 prompt whose lr grows linearly with the batch."""
    cfg = AdaptiveConfig(rule="branch", batch_max=16, scaling="linear", drift_key=drift_key)
    return Controller(cfg, G, 1, LR1)


def _model(sigma: float, eval_samples: int = 512) -> ModelConfig:
    return ModelConfig(optimizer="sgd", dim=8, flat_dims=0, h_min=0.1, h_max=1.0, sigma=sigma,
                       drift_threshold=math.inf, eval_samples=eval_samples)


def _run(state: SimState, ctl: Controller, tried: list[int], each: int, seed: int = 0,
         budget: float = 1e9):
    """The runner's results and the branches it left."""
    out: dict = {}
    runner = sim_branch.brancher(state, ctl, out, seed=seed, group_size=G, cap=None,
                                 norm0=float(np.linalg.norm(state.theta0)), budget=budget)
    return runner(tried, each), out


@pytest.mark.parametrize("drift_key", ["drift_abs", "drift_rel"])
def test_branches_follow_the_hand_computed_descent(drift_key):
    """sigma 1e-9: each branch's steps, samples, end loss and drift are r^k theta0 to 1e-7;
    its gain is the progress it made, read on 20,000 shared uniform draws (within 4 sd), and
    since both branches read the same draws, the branch that progressed more gains no less."""
    cfg = _model(1e-9, eval_samples=20_000)
    state = SimState.start(cfg, 1, seed=3)
    theta0 = state.theta[0].copy()
    h, norm0 = cfg.h, float(np.linalg.norm(theta0))
    each = 64
    results, out = _run(state, _ctl(drift_key), [2, 4], each)
    assert [r.prompts for r in results] == [2, 4] and sorted(out) == [2, 4]
    progress = {}
    for res in results:
        batch, lr = res.prompts * G, LR1 * res.prompts
        n = each // batch
        r = 1 - lr * h
        branch = out[res.prompts]
        assert res.samples == branch.samples == each == branch.end.samples[0]
        assert [s.samples for s in branch.steps] == [batch * k for k in range(1, n + 1)]
        for k, s in enumerate(branch.steps, 1):
            assert s.loss == pytest.approx(0.5 * np.sum(h * (theta0 * r**k) ** 2), rel=1e-7)
        drift = float(np.linalg.norm(theta0 * (r**n - 1)))
        assert res.drift == pytest.approx(drift / (norm0 if drift_key == "drift_rel" else 1),
                                          rel=1e-7)
        progress[res.prompts] = 1 - np.sum(h * (theta0 * r**n) ** 2) / np.sum(h * theta0**2)
        sd = math.sqrt(progress[res.prompts] * (1 - progress[res.prompts]) / cfg.eval_samples)
        assert abs(res.gain - progress[res.prompts]) <= 4 * sd  # progress 0 at the start
        assert state.samples[0] == 0 and np.array_equal(state.theta[0], theta0)  # untouched
    # (1 - 2x) < (1 - x)^2: half the steps at twice the lr take off more of the loss
    assert progress[4] > progress[2] and results[1].gain >= results[0].gain


def test_branch_losses_average_to_the_closed_form():
    """sigma 1: over 400 decisions from fresh states, each branch's mean end loss is the exact
    expected loss of SGD at its batch after its samples (within 4 standard errors), and the two
    branches of one decision share their noise draws: their end losses correlate, where
    independent draws would leave the correlation within 0.2 of 0."""
    cfg = _model(1.0)
    each, decisions = 64, 400
    ends = {2: [], 4: []}
    for seed in range(decisions):
        state = SimState.start(cfg, 1, seed=seed)
        results, out = _run(state, _ctl(), [2, 4], each, seed=seed)
        for p in ends:
            ends[p].append(sim_branch.scalar_loss(out[p].end))
    for p, losses in ends.items():
        want = expected_loss(LR1 / G, cfg.sigma, cfg.h, cfg.theta0, p * G, each)
        losses = np.asarray(losses)
        err = losses.std(ddof=1) / math.sqrt(decisions)
        assert abs(losses.mean() - want) <= 4 * err, (p, losses.mean(), want, err)
    assert np.corrcoef(ends[2], ends[4])[0, 1] > 0.3


def test_no_branch_runs_past_the_budget():
    """Two branches of 64 samples from 100 samples: a budget of 228 pays for them, 227 does
    not (None, and no branch left behind)."""
    state = SimState.start(_model(1.0), 1, seed=0)
    state.samples += 100
    assert _run(state, _ctl(), [2, 4], 64, budget=227) == (None, {})
    results, out = _run(state, _ctl(), [2, 4], 64, budget=228)
    assert len(results) == 2 and sorted(out) == [2, 4]


def test_adopt_continues_from_the_chosen_branch_with_the_other_charged():
    """The kept branch's state and steps come back with the other branch's 64 samples charged
    before them; a batch no branch ran (the guard's jump) keeps the run's own state, charged
    both branches."""
    cfg = _model(1.0)
    state = SimState.start(cfg, 1, seed=1)
    state.samples += 1000
    _, out = _run(state, _ctl(), [2, 4], 64)
    kept, steps = sim_branch.adopt(out, 4, state)
    assert kept is out[4].end and kept.samples[0] == 1000 + 64 + 64
    assert [s.samples for s in steps] == [1000 + 64 + 16 * k for k in range(1, 5)]
    _, out = _run(state, _ctl(), [2, 4], 64)
    theta = state.theta.copy()
    same, steps = sim_branch.adopt(out, 16, state)
    assert same is state and steps == [] and state.samples[0] == 1000 + 128
    assert np.array_equal(state.theta, theta)


def test_scalar_progress_is_the_vector_one():
    """The runner's one-row progress equals SimState.progress, before and after a collapse."""
    cfg = ModelConfig(dim=8, flat_dims=16, drift_threshold=0.5, collapse_samples=100.0)
    state = SimState.start(cfg, 1, seed=2)
    for _ in range(40):
        state.step(8, 0.05)
        loss = sim_branch.scalar_loss(state)
        vector = float(state.progress(0.5 * np.sum(cfg.h * state.theta**2, axis=1))[0])
        assert sim_branch.scalar_progress(state, loss) == pytest.approx(vector, rel=1e-12)
    assert not math.isnan(state.collapsed_at[0])  # the decay after a collapse was compared
