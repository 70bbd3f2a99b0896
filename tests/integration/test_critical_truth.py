"""The recommended B_crit against the theory model's ground truth (dense simulation).

Truth: `predict_critical_batch` — E_min = median samples-to-target at B = 1 over 256 seeds, then
the batch where the median over 64 seeds reaches 2 E_min (a factor-2 ladder, refined on six
batches inside the bracket). The estimator sees what a sweep sees: per-seed progress clocks of
3 seeds on a 64x grid (the vectorised simulator, noise-free progress p = 1 - L/L0, target 0.9).
`flat_dims = 0`: flat directions do not touch progress (Adam and SGD act per coordinate, no cap),
so they are left out to keep the test fast; the sim-backend test below runs the default model.
Replicate 0 is "the sweep" (point within +-25%); replicates 1..20 test the interval's coverage.
"""

from __future__ import annotations

import numpy as np
import pytest

from twoclocks_cli.clocks import critical
from twoclocks_cli.theory import ModelConfig, predict_critical_batch
from twoclocks_cli.theory.closed_form import scaled_lr
from twoclocks_cli.theory.sweep import simulate_sweep

pytestmark = pytest.mark.slow

TARGET, B0, SEEDS, REPLICATES = 0.9, 64, 3, 20
ADAM_GRID = 2.0 ** np.arange(1, 8)  # 2..128 samples
SGD_GRID = 2.0 ** np.arange(0, 7)  # 1..64 samples
CASES = [
    ("adam", 0.02, ADAM_GRID),
    ("adam", 0.04, ADAM_GRID),
    ("adam", 0.08, ADAM_GRID),
    ("sgd", 0.025, SGD_GRID),
    ("sgd", 0.05, SGD_GRID),
    ("sgd", 0.1, SGD_GRID),
]


def _replicates(cfg, lr0, grid, n, seed, budget):
    """n replicate sweeps of SEEDS seeds each: [{batch: [clock or None per seed]}]."""
    res = simulate_sweep(
        cfg, grid, scaled_lr(lr0, B0, grid), SEEDS * n, budget, TARGET, seed=seed,
        stop_at_target=True,
    )
    out = []
    for k in range(n):
        sweep = {}
        for b in grid:
            v = res.n_prog[res.batch == b][SEEDS * k : SEEDS * (k + 1)]
            sweep[float(b)] = [None if np.isnan(x) else float(x) for x in v]
        out.append(sweep)
    return out


def _recommended(per_batch, k):
    rng = np.random.default_rng(k)
    ests = {
        "empirical": critical.empirical(per_batch, rng, 200),
        "power": critical.power(per_batch, rng, 50),
        "mccandlish": critical.linear(per_batch, rng, 50),
    }
    rec, _ = critical.recommend(ests)
    return rec, ests


@pytest.mark.parametrize(
    ("optimizer", "lr0", "grid"), CASES, ids=[f"{o}-{lr}" for o, lr, _ in CASES]
)
def test_recommended_b_crit_matches_dense_simulation(optimizer, lr0, grid):
    cfg = ModelConfig(optimizer=optimizer, flat_dims=0)
    truth = predict_critical_batch(cfg, lr0, B0, TARGET, 0.5, None, seeds=64)
    assert truth["b_crit"] is not None and grid[0] < truth["b_crit"] < grid[-1], truth
    sweeps = _replicates(cfg, lr0, grid, REPLICATES + 1, seed=2026, budget=20 * truth["e_min"])
    rec, ests = _recommended(sweeps[0], 0)
    report = {k: e.text() for k, e in ests.items()}
    print(f"{optimizer} lr0={lr0}: truth {truth['b_crit']:.3g}; " + "; ".join(
        f"{k} {v}" for k, v in report.items()))
    assert rec.source == "empirical" and rec.bound is None, (rec, truth)
    assert abs(rec.b_crit / truth["b_crit"] - 1) <= 0.25, (report, truth["b_crit"])
    covered = sum(_recommended(s, k)[0].covers(truth["b_crit"]) for k, s in
                  enumerate(sweeps[1:], start=1))
    print(f"  interval covers the truth in {covered}/{REPLICATES} replicate sweeps")
    assert covered >= 16, covered


def test_a_grid_below_b_crit_gives_the_right_lower_bound():
    cfg = ModelConfig(optimizer="adam", flat_dims=0)
    truth = predict_critical_batch(cfg, 0.04, B0, TARGET, 0.5, None, seeds=64)
    grid = 2.0 ** np.arange(1, 5)  # 2..16: E(B) has not doubled yet
    sweep = _replicates(cfg, 0.04, grid, 1, seed=7, budget=20 * truth["e_min"])[0]
    rec, _ = _recommended(sweep, 0)
    assert rec.bound == "lower" and rec.b_crit == 16.0, rec
    assert rec.covers(truth["b_crit"]), (rec, truth)


def test_a_wall_gives_the_bracket_that_holds_the_truth():
    """The idealised normaliser: E(B) flat, then never (the noise floor passes the target)."""
    cfg = ModelConfig(optimizer="normalized", flat_dims=0)
    lr0, b0, target = 0.05, 32, 0.97
    truth = predict_critical_batch(cfg, lr0, b0, target, 0.5, None, seeds=16)
    assert truth["mechanism"].startswith("curvature wall"), truth
    grid = truth["b_crit"] * 2.0 ** np.arange(-4, 3)  # 64x, the wall inside (where is the test)
    res = simulate_sweep(cfg, grid, scaled_lr(lr0, b0, grid), SEEDS, 16 * truth["e_min"], target,
                         seed=3, stop_at_target=True)
    sweep = {float(b): [None if np.isnan(x) else float(x) for x in res.n_prog[res.batch == b]]
             for b in grid}
    rec, _ = _recommended(sweep, 0)
    assert rec.placement == "bracketed", rec
    assert rec.low <= truth["b_crit"] <= rec.high, (rec, truth)
