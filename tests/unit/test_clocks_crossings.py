"""Crossings and collapse rules on synthetic curves whose answers are known in closed form."""

import math

import numpy as np
import pytest

from twoclocks_cli.clocks import collapse
from twoclocks_cli.clocks.curves import clean, first_crossing, smooth

DX = 64.0  # samples per logged point


def _grid(n):
    return np.arange(1, n + 1) * DX


def test_rising_curve_crosses_within_one_interval():
    x = _grid(200)
    y = 1 - np.exp(-x / 3000)
    truth = -3000 * math.log(1 - 0.6)
    got = first_crossing(x, smooth(y, "ma", 5), 0.6)
    assert abs(got - truth) <= DX


def test_noisy_curve_crosses_within_one_interval():
    rng = np.random.default_rng(3)
    x = _grid(400)
    y = np.clip(x / 20000, 0, 1) + rng.normal(0, 0.005, x.size)  # smoothed noise < one point's rise
    got = first_crossing(x, smooth(y, "ma", 9), 0.5)
    assert abs(got - 10000) <= DX


def test_plateau_below_target_is_censored_at_last_sample():
    x = _grid(100)
    y = 0.4 * (1 - np.exp(-x / 500))
    assert first_crossing(x, smooth(y, "ma", 5), 0.5) is None
    c = clean(np.arange(100), x, y)
    assert c.samples[-1] == x[-1]  # the censoring point


def test_never_reaching_and_exact_hit_at_first_point():
    x = _grid(10)
    assert first_crossing(x, np.zeros(10), 0.1) is None
    assert first_crossing(x, np.ones(10), 0.5) == x[0]


def test_rise_then_collapse_both_clocks():
    x = _grid(300)
    rise = 0.9 * (1 - np.exp(-x / 2000))
    collapse_at = 12000.0
    y = np.where(x < collapse_at, rise, rise * np.exp(-(x - collapse_at) / 1000))
    sm = smooth(y, "ma", 5)
    prog = first_crossing(x, sm, 0.5)
    assert abs(prog - (-2000 * math.log(1 - 0.5 / 0.9))) <= DX
    # drop floor: peak - 0.3 * (peak - 0): y falls below 0.7 * peak at collapse + 1000*ln(1/0.7)
    fail = collapse.drop_rule(x, sm, float(sm[0]), rho=0.3, delta=0.05, k=3)
    assert abs(fail - (collapse_at + 1000 * math.log(1 / 0.7))) <= 2 * DX


def test_drop_needs_k_consecutive_points_and_delta():
    x = _grid(20)
    y = np.full(20, 0.5)
    y[10:12] = 0.3  # two points only: k=3 does not fire
    assert collapse.drop_rule(x, y, 0.5, k=3) is None
    y2 = np.full(20, 0.5)
    y2[8:] = 0.47  # a fall smaller than delta never fires
    assert collapse.drop_rule(x, y2, 0.5, delta=0.05) is None
    y3 = np.full(20, 0.5)
    y3[8:] = 0.44  # never rose, but lost more than delta below its start: fires
    assert collapse.drop_rule(x, y3, 0.5, delta=0.05) == x[8]


def test_rules_and_earliest():
    x = _grid(10)
    assert collapse.above_rule(x, np.arange(10), 4.5) == x[5]
    assert collapse.band_rule(x, np.linspace(2, 0, 10), 0.5, 3) == x[7]  # 0.444 < 0.5
    assert collapse.nonfinite_rule(x, [0] * 7 + [1, 0, 0]) == x[7]
    assert collapse.earliest({"drop": 500.0, "drift": 300.0, "nonfinite": None}) == (300.0, "drift")
    assert collapse.earliest({"drop": None}) == (None, None)


def test_clean_sorts_dedupes_and_drops_nan():
    c = clean([3, 1, 2, 2, 4], [30, 10, 20, 21, 40], [0.3, 0.1, 0.2, 0.25, math.nan])
    assert list(c.steps) == [1, 2, 3]
    assert list(c.values) == [0.1, 0.25, 0.3]  # the last value of the duplicated step wins


@pytest.mark.parametrize("method", ["ma", "ema", "none"])
def test_smoothing_keeps_length_and_constants(method):
    y = np.full(17, 0.25)
    out = smooth(y, method, 5)
    assert out.shape == y.shape and np.allclose(out, 0.25)
