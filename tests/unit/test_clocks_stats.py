"""Aggregation with censoring, the McCandlish fit, the noise-scale estimator, the slope test."""

import numpy as np
import pytest

from twoclocks_cli.clocks.critical import linear
from twoclocks_cli.clocks.stats import aggregate, noise_scale, slope_test


def test_aggregate_censoring_and_one_seed():
    rng = np.random.default_rng(0)
    a = aggregate([100.0, 120.0, None], [500.0], rng)
    assert a.median == 120.0 and a.n_censored == 1 and a.lower_bound == 500.0
    b = aggregate([None, None, 100.0], [400.0, 500.0], rng)
    assert b.median is None and b.lower_bound == 400.0  # never averaged as a crossing
    c = aggregate([42.0], [], rng)
    assert c.median == 42.0 and c.low is None and "one seed" in c.note


def test_mccandlish_recovers_exact_line_and_refuses_one_batch():
    rng = np.random.default_rng(0)
    e_min, s_min = 2000.0, 40.0
    data = {b: [e_min + s_min * b * f for f in (0.97, 1.0, 1.03)] for b in (8, 16, 32, 64, 128)}
    fit = linear(data, rng, reps=200)
    assert abs(fit.b_crit - e_min / s_min) / (e_min / s_min) < 0.05
    assert fit.low <= fit.b_crit <= fit.high
    one = linear({16: [1.0, 2.0]}, rng)
    assert one.b_crit is None and "no fit possible" in one.note


def test_noise_scale_estimator_is_unbiased_on_a_known_gradient():
    rng = np.random.default_rng(1)
    d, sigma, b, bb = 50, 2.0, 8, 64
    g = np.full(d, 0.1)
    micro, full = [], []
    for _ in range(4000):
        zb = rng.normal(0, sigma / np.sqrt(b), d)
        zr = rng.normal(0, sigma / np.sqrt(bb - b), d)
        micro.append(np.sum((g + zb) ** 2))
        full.append(np.sum((g + (b * zb + (bb - b) * zr) / bb) ** 2))
    est = noise_scale(micro, full, [b] * 4000, [bb] * 4000, ema_alpha=0.001)[-1]
    truth = d * sigma**2 / np.sum(g**2)
    assert abs(est - truth) / truth < 0.2


def test_slope_verdicts():
    b = [16, 16, 32, 32, 64, 64, 128, 128]
    flat = slope_test(b, [1e4 * (1 + 0.01 * (i % 2)) for i in range(8)])
    assert abs(flat["slope"]) < 0.05 and flat["verdict"].startswith("invariant per sample")
    step = slope_test(b, [10.0 * x * (1 + 0.01 * (i % 2)) for i, x in enumerate(b)])
    assert abs(step["slope"] - 1) < 0.05 and step["verdict"].startswith("invariant per step")
    assert slope_test([16, 16], [1.0, 2.0])["slope"] is None


def test_mccandlish_reports_residuals_and_extrapolation():
    rng = np.random.default_rng(0)
    concave = {b: [1000 * np.sqrt(1 + b / 8)] * 2 for b in (8, 16, 32, 64, 128)}
    fit = linear(concave, rng, reps=50)
    assert max(abs(r) for r in fit.rel_residuals) > 0.1  # sqrt-like, not a straight line
    flat = {b: [1000 + b * 0.5] * 2 for b in (8, 16, 32)}  # B_crit = 2000: far above the grid
    # a 1.2% rise over the grid is no growth: a lower bound at the largest batch, not 2000
    nogrowth = linear(flat, rng, reps=50)
    assert nogrowth.bound == "lower" and nogrowth.b_crit == 32
    mild = {b: [1000 + b * 5.0] * 2 for b in (8, 16, 32)}  # B_crit = 200, fitted from 8..32
    assert linear(mild, rng, reps=50).placement == "extrapolated"


def test_empirical_b_crit_on_a_known_curve_wall_and_falling_clocks():
    """Hand truth: E(B) = 1000 (1 + (B/40)^0.6) doubles from E(1) = 1110 at B = 40 * ((2220 /
    1000 - 1))^(1/0.6) = 55.7; a censored batch after finite ones is a wall bracket."""
    from twoclocks_cli.clocks.critical import empirical

    rng = np.random.default_rng(0)
    e = lambda b: 1000 * (1 + (b / 40) ** 0.6)  # noqa: E731
    curve = {b: [e(b) * f for f in (0.99, 1.0, 1.01)] for b in (1, 2, 4, 8, 16, 32, 64, 128)}
    truth = 40 * ((2 * e(1) / 1000) - 1) ** (1 / 0.6)
    est = empirical(curve, rng, 200)
    assert est.placement == "interpolated" and abs(est.b_crit / truth - 1) < 0.03, (est, truth)
    assert est.covers(truth)
    wall = {1: [100.0] * 3, 2: [101.0] * 3, 4: [103.0] * 3, 8: [None] * 3}
    w = empirical(wall, rng, 50)
    assert w.placement == "bracketed" and (w.low, w.high) == (4.0, 8.0)
    falling = {8: [None] * 3, 16: [900.0, 950.0, 1000.0], 32: [700.0, 720.0, 740.0]}
    f = empirical(falling, rng, 50)
    assert f.bound == "lower" and f.b_crit == 32


def test_a_slope_interval_that_excludes_one_hypothesis_is_decisive_against_it():
    """Exclusion of 0 +- m (or 1 +- m) is decided apart from the other edge: the three
    intervals below were once all called inconclusive."""
    from twoclocks_cli.clocks.stats import _verdict

    assert _verdict(0.63, 0.80).startswith("not invariant per sample")
    assert _verdict(0.8, 1.4).startswith("not invariant per sample")
    assert _verdict(0.0004, 0.26).startswith("not invariant per step")
    assert _verdict(-0.1, 0.2).startswith("invariant per sample")
    assert _verdict(0.8, 1.2).startswith("invariant per step")
    assert _verdict(0.3, 0.7).startswith("neither")
    assert _verdict(-0.3, 0.9).startswith("inconclusive")  # overlaps both margins


def test_the_slope_verdict_on_clocks_with_a_known_slope_of_0_7():
    """N_fail = c B^0.7 with 1% scatter: the fitted interval sits near 0.7, so the verdict must
    reject per-sample invariance (and per-step too)."""
    b = [16, 16, 32, 32, 64, 64, 128, 128]
    fit = slope_test(b, [100.0 * x**0.7 * (1 + 0.01 * (i % 2)) for i, x in enumerate(b)])
    assert abs(fit["slope"] - 0.7) < 0.02
    assert fit["verdict"].startswith("neither"), fit


@pytest.mark.slow
def test_b_crit_interval_covers_sgd_truth_when_the_grid_starts_above_one():
    """SGD on a noisy quadratic: E(B) = E_min (1 + B / 7.6) exactly, so E(B) = 2 E(1) at
    B = 9.6 (the truth, E_min at B = 1 sample). Grid 4-256, 3 seeds, 10% log-normal seed noise,
    40 replicate sweeps: the 95% interval covers 9.6 in >= 90% of them (the fit's value at B = 1
    as E_min's low end covered it in 82%)."""
    from twoclocks_cli.clocks import critical

    rng, hits = np.random.default_rng(1), 0
    grid = (4, 8, 16, 32, 64, 128, 256)
    for rep in range(40):
        per = {b: [1e4 * (1 + b / 7.6) * float(np.exp(0.1 * rng.standard_normal()))
                   for _ in range(3)] for b in grid}
        est = critical.empirical(per, np.random.default_rng(rep), 300)
        hits += est.covers(9.6)
    assert hits >= 36, hits
