"""Aggregation over seeds, the noise-scale estimator, the slope test (B_crit: `critical`).

Censored clocks enter as +inf: a median that lands on a censored seed is reported as censored
(a lower bound), never averaged as if it were a crossing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from twoclocks_cli.core.codec import Document
from twoclocks_cli.core.numbers import Number

CONF = 0.9  # two-sided interval level for every bootstrap / t interval below


@dataclass
class Aggregate(Document):
    """One clock at one batch size over its seeds."""

    n: int = 0
    n_censored: int = 0
    median: Number | None = None  # None when the median seed is censored
    low: Number | None = None
    high: Number | None = None  # None when the upper bound is censored
    lower_bound: Number | None = None  # when censored: the clock is at least this
    note: str = ""


def _median_inf(x: np.ndarray) -> float:
    return float(np.median(x))  # +inf entries sort last, so this is an order statistic


def aggregate(values: list[float | None], censor_at: list[float], rng, reps=1000) -> Aggregate:
    """Median and bootstrap interval of per-seed clocks (None = censored at censor_at)."""
    n = len(values)
    x = np.array([np.inf if v is None else v for v in values], float)
    n_cens = int(np.isinf(x).sum())
    if n == 0:
        return Aggregate(0, 0, None, None, None, None, "no runs")
    med = _median_inf(x)
    note = "one seed: no interval" if n == 1 else f"{n} seeds"
    if n_cens:
        note += f", {n_cens} censored"
    lb = float(min(censor_at)) if n_cens and censor_at else None
    if n == 1:
        return Aggregate(1, n_cens, _fin(med), None, None, lb, note)
    boots = np.median(x[rng.integers(0, n, size=(reps, n))], axis=1)
    lo, hi = np.quantile(boots, [(1 - CONF) / 2, (1 + CONF) / 2], method="lower")
    return Aggregate(n, n_cens, _fin(med), _fin(lo), _fin(hi), lb, note)


def _fin(v) -> float | None:
    return float(v) if v is not None and np.isfinite(v) else None


def noise_scale(micro_sq, full_sq, micro_size, full_size, ema_alpha=0.05) -> np.ndarray:
    """B_simple = tr(S)/|G|^2 per step from the two-batch estimators, each term EMA-smoothed."""
    b = np.asarray(micro_size, float)
    bb = np.asarray(full_size, float)
    gb = np.asarray(micro_sq, float)
    gbb = np.asarray(full_sq, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        g2 = (bb * gbb - b * gb) / (bb - b)
        trs = (gb - gbb) / (1 / b - 1 / bb)
    ok = np.isfinite(g2) & np.isfinite(trs)
    g2, trs = g2[ok], trs[ok]
    out = np.full(ok.size, np.nan)
    if not ok.any():
        return out
    eg, et = ema(g2, ema_alpha), ema(trs, ema_alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        out[ok] = np.where(eg > 0, et / eg, np.nan)
    return out


def ema(x: np.ndarray, alpha: float) -> np.ndarray:
    """acc_i = alpha*x_i + (1-alpha)*acc_(i-1), started at x_0 (vectorised with lfilter)."""
    from scipy.signal import lfilter

    x = np.asarray(x, float)
    if x.size == 0:
        return x.copy()
    y, _ = lfilter([alpha], [1.0, alpha - 1.0], x, zi=[(1 - alpha) * x[0]])
    return y


def slope_test(batches: list[float], clocks: list[float], margin: float = 0.25) -> dict:
    """OLS slope of log N_fail on log B, t interval; equivalence verdict against 0 (invariant
    per sample) and 1 (invariant per step): the whole interval within +-margin of one of them."""
    from scipy import stats

    x = np.log(np.asarray(batches, float))
    y = np.log(np.asarray(clocks, float))
    if np.unique(x).size < 2:
        return {
            "slope": None,
            "low": None,
            "high": None,
            "n": int(x.size),
            "verdict": "one batch size: no slope possible",
        }
    res = stats.linregress(x, y)
    dof = x.size - 2
    if dof >= 1 and np.isfinite(res.stderr):
        t = stats.t.ppf((1 + CONF) / 2, dof)
        lo, hi = res.slope - t * res.stderr, res.slope + t * res.stderr
    else:
        lo = hi = None
    return {
        "slope": float(res.slope),
        "low": _fin(lo),
        "high": _fin(hi),
        "n": int(x.size),
        "verdict": _verdict(lo, hi, margin),
    }


def _verdict(lo, hi, margin: float = 0.25) -> str:
    """Equivalence against 0 and 1 (inside +-margin: invariant), and exclusion of each (outside:
    not invariant that way) decided apart: an interval that excludes 0 +- margin is a decisive
    non-invariance per sample even while it straddles the edge of 1 +- margin."""
    if lo is None or hi is None:
        return "inconclusive: too few points for an interval; more seeds or batches needed"
    shown = f"[{lo:.2g}, {hi:.2g}]"
    if -margin <= lo and hi <= margin:
        return f"invariant per sample (slope interval inside 0 +- {margin:g})"
    if 1 - margin <= lo and hi <= 1 + margin:
        return f"invariant per step (slope interval inside 1 +- {margin:g})"
    not_sample = lo > margin or hi < -margin
    not_step = lo > 1 + margin or hi < 1 - margin
    if not_sample and not_step:
        return f"neither: the slope interval {shown} excludes 0 and 1 (+- {margin:g})"
    if not_sample:
        return (f"not invariant per sample: the slope interval {shown} excludes 0 +- {margin:g} "
                f"(per step undecided: it overlaps 1 +- {margin:g} without lying inside)")
    if not_step:
        return (f"not invariant per step: the slope interval {shown} excludes 1 +- {margin:g} "
                f"(per sample undecided: it overlaps 0 +- {margin:g} without lying inside)")
    return (f"inconclusive: the slope interval {shown} is wider than the margin "
            f"+- {margin:g}; more seeds or batches needed")
