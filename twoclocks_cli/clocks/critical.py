"""The critical batch size, evidence first: E(B_crit) = 2 E_min from the measured progress clocks.

Input: per batch size, the per-seed progress clocks in samples (None = censored). Estimates:
- `empirical`: model-free. E_min is the data's minimum when the data have one: where median
  E(B) falls and then rises (a U: under the sqrt rule from a fixed lr0 the smallest batches get
  the smallest lr and are often the slowest), E_min is the measured minimum, B_crit is where E
  first reaches 2 E_min above it, and the batches left of the minimum are reported as slower
  under this lr rule. Only where E grows from the smallest batch is E_min the small-batch limit
  (B = 1 sample), extrapolated down the power fit, or the smallest batch's clock (an upper bound)
  when no fit holds. B_crit is where the monotone (running-max) interpolation of median E(B) in
  log-log first reaches 2 E_min. A crossing between a finite batch and a censored one is a
  wall: the bracket between them.
- `power`: E(B) = E0 (1 + (B/B_k)^a) fitted in log space, exponent a reported.
- `linear`: McCandlish's E = E_min + S_min B (kept for comparison; wrong under Adam).
A result outside the grid is a bound ("lower": B_crit >= the largest batch; "upper": <= the
smallest), never "no estimate". Intervals: bootstrap over seeds within each batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from twoclocks_cli.core.codec import Document
from twoclocks_cli.core.numbers import Number

CONF = 0.9  # two-sided interval level of the fits
# The model-free B_crit's interval is 95%: with 3 seeds a 90% bootstrap covered the theory's
# truth in only 75-100% of replicate sweeps (measured, tests/integration/test_critical_truth.py)
CONF_B_CRIT = 0.95
FIT_REPS = 200  # bootstrap replicates of the fits' intervals (comparison only; each is a refit)
MIN_GAIN_FOR_FIT = 1.05  # E(B_max)/E(B_min) below this: E(B) does not grow (no fit)


@dataclass
class Estimate(Document):
    """One B_crit estimate: a point or a bound, its interval and where it came from."""

    source: str | None = None  # empirical | power | linear | noise_scale | sign_noise_scale | ...
    b_crit: Number | None = None  # the point, or the bound's value
    low: Number | None = None
    high: Number | None = None
    bound: str | None = None  # None (a point or a bracket), "lower" (>= b_crit), "upper" (<=)
    e_min: Number | None = None
    exponent: Number | None = None  # the power fit's a (linear: 1)
    placement: str | None = None  # interpolated | extrapolated | bracketed | bound
    seeds: int = 0  # seeds per batch used (minimum over batches)
    batches: list[Number] = field(default_factory=list)
    rel_residuals: list[Number] | None = None  # (median - fit) / median per batch (fits)
    note: str = ""
    e_min_at: Number | None = None  # the batch whose clock is E_min (None: below the grid)
    slower: list[Number] = field(default_factory=list)  # batches left of a measured minimum
    low_bound: bool = False  # the interval's low end is a bound: B_crit <= low in some resamples

    def covers(self, value: float) -> bool:
        """Whether `value` is consistent with this estimate (interval, or the bound's side)."""
        if self.bound == "lower":
            return value >= self.b_crit
        if self.bound == "upper":
            return value <= self.b_crit
        if self.low is None:
            return False
        return self.low <= value <= (math.inf if self.high is None else self.high)

    def minimum_text(self) -> str | None:
        """Where E_min is a measured minimum, that and the batches left of it (else None)."""
        from twoclocks_cli.core.numbers import num

        if self.e_min_at is None:
            return None
        slower = ", ".join(num(b) for b in self.slower)
        return (f"E_min is the measured minimum at B={num(self.e_min_at)}; B={slower} took more "
                "samples: slower under this lr rule (their lr is smaller)")

    def text(self) -> str:
        """'>= 512', '<= 8', '36 [30, 41]', '10,240' (samples; thousands separated)."""
        from twoclocks_cli.core.numbers import num

        if self.b_crit is None:
            return "unknown"
        if self.bound == "lower":
            return f">= {num(self.b_crit)}"
        if self.bound == "upper":
            return f"<= {num(self.b_crit)}"
        if self.low is not None:
            high = "open" if self.high is None else num(self.high)
            low = f"<= {num(self.low)}" if self.low_bound else num(self.low)
            return f"{num(self.b_crit)} [{low}, {high}]"
        return num(self.b_crit)


# -- the per-batch table --------------------------------------------------------------------


def _table(per_batch: dict[float, list[float | None]]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Sorted batches and their per-seed clocks (censored = +inf)."""
    bs = np.array(sorted(b for b, v in per_batch.items() if v), float)
    vals = [np.array([np.inf if x is None else x for x in per_batch[b]], float) for b in bs]
    return bs, vals


def _medians(vals: list[np.ndarray]) -> np.ndarray:
    return np.array([float(np.median(v)) for v in vals])


# -- the fits --------------------------------------------------------------------------------


def fit_power(bs: np.ndarray, meds: np.ndarray, start=None) -> tuple[float, float, float] | None:
    """Least squares of log E = log E0 + log(1 + (B/B_k)^a) on finite medians: (E0, B_k, a).

    Five starting points along the grid, or one at `start` (a previous fit: the bootstrap).
    The same medians fitted again (the empirical estimate, the power estimate and a stability
    resample all ask) are answered from a cache.
    """
    key = (np.asarray(bs, float).tobytes(), np.asarray(meds, float).tobytes(),
           None if start is None else tuple(start))
    return _fit_power_cached(key)


@lru_cache(maxsize=4096)
def _fit_power_cached(key) -> tuple[float, float, float] | None:
    from scipy.optimize import least_squares

    bs, meds = np.frombuffer(key[0]), np.frombuffer(key[1])
    start = key[2]
    ok = np.isfinite(meds)
    b, e = bs[ok], meds[ok]
    if b.size < 3 or e[-1] / e[0] < MIN_GAIN_FOR_FIT:
        return None
    lb, le = np.log(b), np.log(e)

    def resid(p):
        return p[0] + np.log1p(np.exp(p[2] * (lb - p[1]))) - le

    def jac(p):
        # d/dp of log1p(exp(z)), z = a (log B - log B_k): the logistic of z times dz/dp
        z = p[2] * (lb - p[1])
        w = 0.5 * (1 + np.tanh(z / 2))  # exp(z) / (1 + exp(z)) without overflow
        return np.column_stack([np.ones_like(lb), -p[2] * w, (lb - p[1]) * w])

    best = None
    if start is not None:
        starts = [[math.log(start[0]), float(np.clip(math.log(start[1]), lb[0] - 7, lb[-1] + 7)),
                   float(np.clip(start[2], 0.06, 2.9))]]
    else:
        starts = [[le[0] - 0.1, k0, 0.5] for k0 in np.linspace(lb[0] - 1, lb[-1] + 1, 5)]
    for p0 in starts:
        try:
            bounds = ([-np.inf, lb[0] - 8, 0.05], [np.inf, lb[-1] + 8, 3])
            r = least_squares(resid, p0, jac=jac, bounds=bounds)
        except ValueError:
            continue
        if best is None or r.cost < best.cost:
            best = r
    if best is None:
        return None
    return float(np.exp(best.x[0])), float(np.exp(best.x[1])), float(best.x[2])


def _refit_level(bs, meds, shape):
    """The power form with `shape`'s B_k and exponent, its level E0 refitted to `meds` in
    closed form (the bootstrap's fast path: a full refit per replicate costs ~4 ms)."""
    ok = np.isfinite(meds)
    if ok.sum() < 3:
        return None
    _, bk, a = shape
    log_e0 = float(np.mean(np.log(meds[ok]) - np.log1p((bs[ok] / bk) ** a)))
    return math.exp(log_e0), bk, a


def power_eval(params, b) -> np.ndarray:
    e0, bk, a = params
    return e0 * (1 + (np.asarray(b, float) / bk) ** a)


def power_b_crit(params, e_min: float) -> float | None:
    """The B at which the power form reaches 2 E_min (None: never)."""
    e0, bk, a = params
    ratio = 2 * e_min / e0 - 1
    if ratio <= 0:
        return None
    return float(bk * ratio ** (1 / a))


def fit_linear(bs: np.ndarray, meds: np.ndarray) -> tuple[float, float] | None:
    """Least squares E = E_min + S_min*B with both coefficients >= 0 (scipy nnls)."""
    from scipy.optimize import nnls

    ok = np.isfinite(meds)
    b, e = bs[ok], meds[ok]
    if np.unique(b).size < 2:
        return None
    coef, _ = nnls(np.column_stack([np.ones_like(b), b]), e)
    return float(coef[0]), float(coef[1])


def _log_rms(resid: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.log1p(-resid) ** 2))) if resid.size else math.inf


# -- the model-free estimate -----------------------------------------------------------------


@dataclass
class _Point:
    b_crit: float | None
    low: float | None  # bracket edges (walls), else None
    high: float | None
    bound: str | None
    e_min: float | None
    placement: str
    note: str
    e_min_at: float | None = None
    slower: tuple = ()


def _small_batch_limit(bs, meds, start=None) -> tuple[float, float, float, str]:
    """E_min at B = 1 sample (the smallest batch there is): (point, low, high, how).

    Measured when the grid starts at 1. Otherwise the point is the power fit's value at B = 1
    (on McCandlish's form with E_min 4,000, B_crit 600 and a grid of 128-2,048 it is within 1%,
    where the geometric mean with the smallest batch's clock was 10% high), the high end the
    smallest batch's own clock (E(B) only grows). The low end is the fit's limit B -> 0, E0: a
    fit whose curvature the grid sets can put its B = 1 value above the true E(1) (SGD on a
    noisy quadratic, grid 4-256), while no power form of E lies below E0.
    """
    if bs[0] <= 1:
        return float(meds[0]), float(meds[0]), float(meds[0]), "E_min measured at B=1"
    params = _refit_level(bs, meds, start) if start is not None else fit_power(bs, meds)
    if params is not None:
        e1 = float(power_eval(params, 1.0))
        if 0 < e1 <= meds[0]:
            return e1, float(params[0]), float(meds[0]), (
                f"E_min = the power fit at B=1 (its interval from the fit's limit B -> 0 to the "
                f"clock at B={bs[0]:g})"
            )
    return float(meds[0]), float(meds[0]), float(meds[0]), (
        f"E_min = the clock at B={bs[0]:g} (an upper bound: B_crit may be high)"
    )


def empirical_point(bs: np.ndarray, vals: list[np.ndarray]) -> _Point:
    """B_crit where the running-max median E(B) first reaches 2 E_min, in log-log."""
    return empirical_points(bs, vals)[0]


def empirical_points(bs: np.ndarray, vals: list[np.ndarray], start=None,
                     which=(0, 1, 2)) -> list[_Point | None]:
    """The estimate for each E_min of `_e_min`: [point, its low end, its high end] (only those
    in `which`; None for the others). `start`: a power fit whose shape is kept."""
    meds = _medians(vals)
    finite = np.isfinite(meds)
    if not finite.any():
        return [_Point(None, None, None, None, None, "none", "no batch reached the target")
                if i in which else None for i in range(3)]
    first = int(np.argmax(finite))
    lowest = int(np.nanargmin(np.where(finite, meds, np.nan)))
    # E(B) is read from its minimum up: a batch left of it is slower, not a smaller E_min
    sub_b, sub_m = bs[lowest:], meds[lowest:]
    ok = np.isfinite(sub_m)
    if lowest > first:
        lim, at = _measured_minimum(bs, meds, first, lowest), float(bs[lowest])
    else:
        lim, at = _small_batch_limit(sub_b[ok], sub_m[ok], start), None
    how = lim[3]
    if first > 0:
        how += f"; batches below B={bs[first]:g} never reached the target"
    slower = tuple(float(b) for b, m in zip(bs[:lowest], meds[:lowest], strict=True)
                   if np.isfinite(m))
    run = np.maximum.accumulate(np.where(ok, sub_m, np.inf))
    out = []
    for i, e_min in enumerate(lim[:3]):
        p = _point_for(sub_b, run, e_min, how) if i in which else None
        if p is not None:
            p.e_min_at, p.slower = at, slower
        out.append(p)
    return out


def _measured_minimum(bs, meds, first: int, lowest: int) -> tuple[float, float, float, str]:
    """E_min where median E(B) falls and then rises: the measured minimum (its interval comes
    from the seed bootstrap that reruns this rule)."""
    e = float(meds[lowest])
    left = ", ".join(f"{b:g} ({m:,.0f})" for b, m in zip(bs[first:lowest], meds[first:lowest],
                                                        strict=True) if np.isfinite(m))
    return e, e, e, (
        f"E_min = the measured minimum {e:,.0f} at B={bs[lowest]:g}; B={left} took more samples "
        "(slower under this lr rule: their lr is smaller)"
    )


def _point_for(sub_b, run, e_min, how) -> _Point:
    goal = 2 * e_min
    if run[0] >= goal:
        return _Point(
            float(sub_b[0]), None, None, "upper", e_min, "bound",
            f"E at the smallest batch is already >= 2 E_min ({how})",
        )
    hit = np.flatnonzero(run >= goal)
    if hit.size == 0:
        return _Point(
            float(sub_b[-1]), None, None, "lower", e_min, "bound",
            f"E(B) stays below 2 E_min up to the largest batch ({how})",
        )
    i = int(hit[0])
    if not np.isfinite(run[i]):
        return _Point(
            float(math.sqrt(sub_b[i - 1] * sub_b[i])), float(sub_b[i - 1]), float(sub_b[i]),
            None, e_min, "bracketed",
            f"wall: B={sub_b[i - 1]:g} reached the target, B={sub_b[i]:g} did not ({how})",
        )
    return _Point(_cross(sub_b, run, goal, i), None, None, None, e_min, "interpolated", how)


def _cross(bs: np.ndarray, run: np.ndarray, goal: float, i: int) -> float:
    """B in [bs[i-1], bs[i]] where the monotone (PCHIP, log-log) interpolant of E reaches goal."""
    from scipy.interpolate import PchipInterpolator
    from scipy.optimize import brentq

    fin = np.isfinite(run)
    x, y = np.log(bs[fin]), np.log(run[fin])
    keep = np.append(np.diff(y) > 0, True)  # strictly increasing knots (ties: the last one)
    x, y = x[keep], y[keep]
    x0, x1 = np.log(bs[i - 1]), np.log(bs[i])
    if x.size < 3 or not (x[0] <= x0 and x1 <= x[-1]):
        y0, y1 = np.log(run[i - 1]), np.log(run[i])
        frac = (np.log(goal) - y0) / (y1 - y0) if y1 > y0 else 1.0
        return float(np.exp(x0 + frac * (x1 - x0)))
    f = PchipInterpolator(x, y)
    g = np.log(goal)
    if not f(x0) <= g <= f(x1):
        return float(np.exp(x1))
    return float(np.exp(brentq(lambda t: f(t) - g, x0, x1)))


def _bootstrap(bs, vals, fn, rng, reps) -> list[float]:
    """fn(bs, resampled vals) over `reps` parametric resamples of the seeds of each batch.

    Each batch's clocks are redrawn log-normally around its own median with a spread borrowed
    from all batches (`_log_spreads`: three seeds alone say little about their spread).
    Censored seeds are redrawn censored at the batch's observed rate.
    """
    spreads, dof = _log_spreads(bs, vals)
    out = []
    for _ in range(reps):
        res = []
        # the spread itself is known from `dof` degrees of freedom only: redraw it as well
        widen = math.sqrt(dof / rng.chisquare(dof)) if dof else 1.0
        for v, sd in zip(vals, spreads * widen, strict=True):
            fin = v[np.isfinite(v)]
            if fin.size == 0 or sd == 0:
                res.append(v[rng.integers(0, v.size, v.size)])
                continue
            shift = np.clip(sd * rng.standard_normal(v.size), -30, 30)
            draw = np.exp(np.log(np.median(fin)) + shift)
            cens = rng.random(v.size) < (v.size - fin.size) / v.size
            res.append(np.where(cens, np.inf, draw))
        x = fn(bs, res)
        if x is not None:
            out.append(x)
    return out


def _log_spreads(bs, vals) -> tuple[np.ndarray, int]:
    """Per batch, the seed-to-seed sd of log clocks: a line in log B fitted to every batch's
    own sd (noise shrinks with B), weighted by degrees of freedom; pooled when too few."""
    x, y, w = [], [], []
    for b, v in zip(bs, vals, strict=True):
        f = np.log(v[np.isfinite(v)])
        if f.size >= 2:
            x.append(math.log(b))
            y.append(float(np.sum((f - f.mean()) ** 2)))
            w.append(f.size - 1)
    if not w:
        return np.zeros(len(vals)), 0
    x, ss, w = np.array(x), np.array(y), np.array(w, float)
    pooled = math.sqrt(ss.sum() / w.sum())
    if x.size < 3 or np.unique(x).size < 3:
        return np.full(len(vals), pooled), int(w.sum())
    sd = np.sqrt(np.maximum(ss / w, 1e-12))
    slope, icpt = np.polyfit(x, np.log(sd), 1, w=np.sqrt(w))
    # rescale so the fitted spreads reproduce the pooled variance (log of sd is biased low)
    fit = np.exp(icpt + slope * x)
    scale = math.sqrt(ss.sum() / np.sum(w * fit**2))
    return scale * np.exp(icpt + slope * np.log(np.asarray(bs, float))), int(w.sum()) - 2


def _interval(samples: list[float], conf: float = CONF) -> tuple[float | None, float | None]:
    if not samples:
        return None, None
    with np.errstate(invalid="ignore"):  # between two infinite replicates: inf - inf
        lo, hi = np.quantile(np.array(samples, float), [(1 - conf) / 2, (1 + conf) / 2])
    return (float(lo) if not np.isnan(lo) else math.inf), (float(hi) if not np.isnan(hi)
                                                            else math.inf)


def empirical(per_batch: dict[float, list[float | None]], rng, reps: int = 1000) -> Estimate:
    """The model-free estimate with its bootstrap interval (bounds stay bounds)."""
    bs, vals = _table(per_batch)
    seeds = min((v.size for v in vals), default=0)
    if bs.size == 0:
        return Estimate("empirical", None, note="no batch size analysed")
    if bs.size == 1:
        return Estimate("empirical", None, seeds=seeds, batches=bs.tolist(),
                        note=f"one batch size (B={bs[0]:g}): E(B) cannot be compared")
    pt = empirical_point(bs, vals)
    est = Estimate("empirical", pt.b_crit, bound=pt.bound, e_min=pt.e_min, placement=pt.placement,
                   seeds=seeds, batches=bs.tolist(), note=pt.note, e_min_at=pt.e_min_at,
                   slower=list(pt.slower))
    if pt.b_crit is None:
        return est
    if pt.placement == "bracketed":
        est.low, est.high = pt.low, pt.high
        return est
    if pt.bound is not None:
        return est

    params = fit_power(bs, _medians(vals))

    def ends(b, v):
        """B_crit at E_min's low and high end for one resample (bounds as 0 / inf)."""
        out = []
        for p in empirical_points(b, v, params, which=(1, 2))[1:]:
            if p.b_crit is None:
                return None
            out.append(math.inf if p.bound == "lower" else 0.0 if p.bound == "upper" else p.b_crit)
        return tuple(out)

    # the interval spans the sampling spread at both ends of E_min's range
    boots = _bootstrap(bs, vals, ends, rng, reps)
    est.low = _interval([b[0] for b in boots], CONF_B_CRIT)[0]
    est.high = _interval([b[1] for b in boots], CONF_B_CRIT)[1]
    if est.low is not None and est.low <= 0:
        # the low quantile fell on resamples whose B_crit is an upper bound (<= the smallest
        # batch): the interval's low end is that bound, never a B_crit of 0
        est.low, est.low_bound = float(bs[0]), True
        est.note += f"; in some resamples B_crit <= {bs[0]:g} (an upper bound)"
    if seeds < 2:
        est.note += "; one seed per batch: the interval is degenerate"
    if est.high is not None and not math.isfinite(est.high):
        est.high = None
    return est


def power(per_batch, rng, reps: int = 1000) -> Estimate:
    """The free-exponent fit E = E0 (1 + (B/B_k)^a); B_crit where it doubles from B = 1."""
    bs, vals = _table(per_batch)
    meds = _medians(vals)
    seeds = min((v.size for v in vals), default=0)
    params = fit_power(bs, meds)
    if params is None:
        return _no_fit("power", bs, meds, seeds)

    def point(b, v):
        p = fit_power(b, _medians(v), params)
        return None if p is None else power_b_crit(p, float(power_eval(p, 1.0)))

    e_min = float(power_eval(params, 1.0))
    b_crit = power_b_crit(params, e_min)
    ok = np.isfinite(meds)
    resid = (meds[ok] - power_eval(params, bs[ok])) / meds[ok]
    lo, hi = _interval(_bootstrap(bs, vals, point, rng, min(reps, FIT_REPS)))
    return Estimate(
        "power", b_crit, lo, hi, None, e_min, params[2], _placement(b_crit, bs[ok]), seeds,
        bs[ok].tolist(), [float(r) for r in resid],
        f"E = E0 (1 + (B/{params[1]:.4g})^{params[2]:.2f}), log-RMS residual {_log_rms(resid):.3f}",
    )


def linear(per_batch, rng, reps: int = 1000) -> Estimate:
    """McCandlish's E = E_min + S_min B, B_crit = E_min / S_min (a straight line in B)."""
    bs, vals = _table(per_batch)
    meds = _medians(vals)
    seeds = min((v.size for v in vals), default=0)
    ok = np.isfinite(meds)
    if ok.sum() < 2 or meds[ok][-1] / meds[ok][0] < MIN_GAIN_FOR_FIT:
        return _no_fit("linear", bs, meds, seeds)
    e_min, s_min = fit_linear(bs, meds)
    if s_min <= 0:
        return _no_fit("linear", bs, meds, seeds)

    def point(b, v):
        f = fit_linear(b, _medians(v))
        return None if f is None or f[1] <= 0 else f[0] / f[1]

    b_crit = e_min / s_min
    resid = (meds[ok] - (e_min + s_min * bs[ok])) / meds[ok]
    lo, hi = _interval(_bootstrap(bs, vals, point, rng, min(reps, FIT_REPS)))
    return Estimate(
        "linear", b_crit, lo, hi, None, e_min, 1.0, _placement(b_crit, bs[ok]), seeds,
        bs[ok].tolist(), [float(r) for r in resid],
        f"E = {e_min:.4g} + {s_min:.4g} B, log-RMS residual {_log_rms(resid):.3f}",
    )


def _no_fit(source, bs, meds, seeds) -> Estimate:
    ok = np.isfinite(meds)
    if ok.sum() >= 2 and meds[ok][-1] / meds[ok][0] < MIN_GAIN_FOR_FIT:
        return Estimate(source, float(bs[ok][-1]), bound="lower", placement="bound", seeds=seeds,
                        batches=bs[ok].tolist(),
                        note="E(B) does not grow with B on this grid: B_crit above the largest "
                        "batch that reached the target")
    need = 3 if source == "power" else 2
    return Estimate(source, None, seeds=seeds, batches=bs[ok].tolist(),
                    note=f"{int(ok.sum())} batch size(s) with an uncensored median: no fit "
                    f"possible (the fit needs {need})")


def _placement(b, grid) -> str:
    if b is None or grid.size == 0:
        return "none"
    return "interpolated" if grid[0] <= b <= grid[-1] else "extrapolated"


# -- the recommendation ----------------------------------------------------------------------


def recommend(ests: dict[str, Estimate | None]) -> tuple[Estimate | None, str]:
    """The estimate to act on and why. Measured clocks first (empirical, a bound included),
    then the fits when the empirical one is missing, then the theory, then noise scales."""
    emp = ests.get("empirical")
    if emp is not None and emp.b_crit is not None:
        why = "measured clocks (model-free E(B) = 2 E_min)"
        if emp.bound:
            why += f": {article(emp.bound)} {emp.bound} bound, the grid does not reach B_crit"
        return emp, why
    for name in ("power", "linear", "theory", "sign_noise_scale", "noise_scale"):
        e = ests.get(name)
        if e is not None and e.b_crit is not None:
            return e, f"no model-free estimate ({emp.note if emp else 'no clocks'}); {name} next"
    return None, "no estimate: " + (emp.note if emp else "no clocks")


def article(word: str) -> str:
    """'a' or 'an' before `word` ('an upper bound')."""
    return "an" if word[:1] in "aeiou" else "a"


def disagreement(ests: dict[str, Estimate | None], chosen: Estimate | None) -> list[str]:
    """Estimates whose point differs from the chosen one by more than 2x (bounds compared by
    side: a lower bound disagrees with a point below it)."""
    if chosen is None or chosen.b_crit is None:
        return []
    out = []
    for name, e in ests.items():
        if e is None or e is chosen or e.b_crit is None or not e.b_crit > 0:
            continue
        if chosen.bound == "lower" and e.bound is None and e.b_crit * 2 < chosen.b_crit:
            out.append(f"{name} says {e.text()}, below the measured lower bound {chosen.text()}")
        elif chosen.bound == "upper" and e.bound is None and e.b_crit > 2 * chosen.b_crit:
            out.append(f"{name} says {e.text()}, above the measured upper bound {chosen.text()}")
        elif chosen.bound is None and e.bound is None:
            r = e.b_crit / chosen.b_crit if chosen.b_crit > 0 else math.inf
            if r > 2 or r < 0.5:
                out.append(f"{name} says {e.text()}, {r:.2g}x the recommended {chosen.text()}")
    return out
