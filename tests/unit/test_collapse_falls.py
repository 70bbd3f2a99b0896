"""The drop rule's falls against curves whose dips and collapses are known: a fall that climbs
back is a dip, one that never does is the collapse, and neither is dated before the data falls."""

import numpy as np
import pytest

from twoclocks_cli.clocks import collapse
from twoclocks_cli.clocks.curves import smooth


def _eval_points(batch: int, budget: int = 32768, every: int = 1024) -> np.ndarray:
    """Samples at which a run of `batch` logs an eval: the first step at or past each multiple."""
    steps = np.arange(1, budget // batch + 1) * batch
    marks = np.arange(every, budget + 1, every)
    return np.unique(steps[np.searchsorted(steps, marks)])


def _truth_curve(x, dip=(10000, 17000), collapse_at=24000, noise=0.0, seed=0):
    """Rises to 0.55 by 4k samples, dips to 0.35 over `dip`, climbs to 0.6, collapses to 0.1."""
    y = np.minimum(0.55, 0.1 + 0.45 * x / 4000)
    y = np.where((x >= dip[0]) & (x < dip[1]), 0.35, y)
    y = np.where(x >= dip[1], 0.6, y)
    y = np.where(x >= collapse_at, 0.1, y)
    return y + np.random.default_rng(seed).normal(0, noise, x.size)


@pytest.mark.parametrize("batch", [128, 512, 2048])
def test_a_dip_then_a_collapse_are_told_apart_and_dated_at_the_data(batch):
    x = _eval_points(batch).astype(float)
    y = _truth_curve(x)
    sm = smooth(y, "ma", 5)
    found = collapse.falls(x, sm, float(sm[0]), raw=y, recover=0.5)
    assert [f.dip for f in found] == [True, False], found
    dip, fall = found
    # dated at the first logged point on or after the true fall: never before it
    assert dip.at == x[x >= 10000][0]
    assert fall.at == x[x >= 24000][0]
    assert dip.recovered_at is not None and dip.recovered_at >= 17000
    assert collapse.drop_rule(x, sm, float(sm[0]), raw=y, recover=0.5) == fall.at
    # with dips off, the first fall is the failure (the rule as it was)
    assert collapse.drop_rule(x, sm, float(sm[0]), raw=y, recover=None) == dip.at


def test_noisy_dips_and_collapses_over_many_seeds():
    """Eval noise of 0.02: the dip is a dip and the collapse a collapse in every seed, each dated
    within one eval interval after the truth."""
    x = _eval_points(512).astype(float)
    for seed in range(50):
        y = _truth_curve(x, noise=0.02, seed=seed)
        sm = smooth(y, "ma", 5)
        found = collapse.falls(x, sm, float(sm[0]), raw=y)
        assert [f.dip for f in found] == [True, False], (seed, found)
        assert 10000 <= found[0].at <= 10000 + 1024 + 512
        assert 24000 <= found[1].at <= 24000 + 1024 + 512


def test_a_centred_average_no_longer_dates_collapses_early_at_large_batches():
    """Every run collapses at exactly 20,000 samples (invariant per sample by construction): the
    found clocks are the first logged point at or past it at every batch, so log N_fail on log B
    has no slope bias (a centred window dated them up to two points early, more samples at
    larger batches)."""
    batches, clocks = [], []
    for batch in (128, 256, 512, 1024, 2048):
        x = _eval_points(batch).astype(float)
        y = np.where(x < 20000, np.minimum(0.6, x / 10000), 0.1)
        sm = smooth(y, "ma", 5)
        at = collapse.drop_rule(x, sm, float(sm[0]), raw=y)
        assert at == x[x >= 20000][0], (batch, at)
        early = collapse.drop_rule(x, sm, float(sm[0]))  # dated on the smoothed curve alone
        assert early < 20000
        batches.append(batch)
        clocks.append(at)
    slope = np.polyfit(np.log(batches), np.log(clocks), 1)[0]
    assert abs(slope) < 0.01, slope


def test_the_falls_of_a_prefix_are_the_falls_of_the_whole_run_up_to_there():
    """Causal: what a live reader finds with the data so far never changes later, except that
    the last fall may yet recover (a collapse so far becoming a dip)."""
    x = _eval_points(256).astype(float)
    y = _truth_curve(x, noise=0.01, seed=3)
    sm = np.asarray([y[max(0, i - 4):i + 1].mean() for i in range(y.size)])  # trailing: causal
    whole = collapse.falls(x, sm, float(sm[0]), raw=y)
    for n in range(5, x.size):
        part = collapse.falls(x[:n], sm[:n], float(sm[0]), raw=y[:n])
        seen = [f for f in whole if f.at <= x[n - 1]]
        assert [f.at for f in part] == [f.at for f in seen][:len(part)], n
        for got, want in zip(part[:-1], seen, strict=False):
            assert got == want
        if part and part[-1].dip:
            assert part[-1] == seen[len(part) - 1]


def test_a_fall_at_the_end_of_the_run_that_has_not_recovered_is_a_collapse():
    x = np.arange(1, 41) * 1000.0
    y = np.where(x < 36000, np.minimum(0.6, x / 10000), 0.2)
    found = collapse.falls(x, y, 0.1, raw=y)
    assert len(found) == 1 and not found[0].dip and found[0].at == 36000
