"""The one per-run clock function: a metric curve (+ collapse signals) -> typed `RunClocks`.

`analyze`, `schedule`, `compare` and `report` all get their per-run numbers from `run_clocks`, so
a rule added here reaches every command. Honest by construction: a run that starts at or above
the target is flagged (not a crossing at its first point), a crossing always lies between two
logged points that bracket it (one below the target, the next at or above), it is read on the
curve before the failure only, progress cut short by a collapse says so, and a failure at the
first or second eval point is flagged "at eval resolution".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from twoclocks_cli.clocks import collapse
from twoclocks_cli.clocks.curves import Curve, bracketed_crossing, clean, smooth_curve
from twoclocks_cli.clocks.options import AnalysisOptions
from twoclocks_cli.core.codec import Document
from twoclocks_cli.core.numbers import Number

GRAD_KEYS = ("grad_sq_micro", "grad_sq_full", "grad_micro_size", "grad_full_size")
SIGN_KEYS = ("grad_l1_micro", "grad_l1_full", "grad_sign_dot", "grad_micro_size", "grad_full_size")
TIME_KEYS = ("time_gen_s", "time_reward_s", "time_update_s")  # summed: wall-clock per step


@dataclass
class Clock(Document):
    """One clock of one run, in samples (and steps, prompts, seconds beside)."""

    samples: Number | None = None  # the crossing / collapse; None when censored or flagged
    censored: bool = True  # True: not reached by `censored_at`
    censored_at: Number | None = None
    steps: Number | None = None
    prompts: Number | None = None
    seconds: Number | None = None
    reason: str | None = None  # why there is no number, in words (or a flag on a number)
    rule: str | None = None  # failure clock: the rule that fired first
    rules: dict = field(default_factory=dict)  # failure clock: every rule's firing time
    at_eval_resolution: bool = False  # failure at the first or second logged point
    collapsed: bool = False  # progress clock: censored by a collapse before the target
    drift: Number | None = None  # failure clock: the drift (opts.drift_key) logged at the failure
    # failure clock: the falls of the drop rule that recovered (collapse.Fall.to_json each)
    dips: list = field(default_factory=list)


@dataclass
class RunClocks(Document):
    """Both clocks of one run under one set of options."""

    run_id: int
    points: int
    first_samples: float | None
    last_samples: float | None
    initial: float | None  # smoothed metric at the first point
    final: float | None  # smoothed metric at the last point
    best: float | None
    progress: Clock
    failure: Clock
    started_above: bool = False  # the run began at or above the target: no progress clock
    noise_scale: float | None = None  # B_simple where the progress clock is (else last point)
    sign_noise_scale: float | None = None


@dataclass
class RunSignals:
    """The series `run_clocks` reads for one run (None where not logged)."""

    metric: object | None
    nonfinite: object | None = None
    drift: object | None = None
    entropy: object | None = None
    length: object | None = None
    truncated: object | None = None
    drop_metric: object | None = None  # the held-out drop rule's metric (opts.drop_metric)
    grads: dict = field(default_factory=dict)
    sign: dict = field(default_factory=dict)
    times: list = field(default_factory=list)
    eval_n: float | None = None  # held-out set size behind each eval_accuracy point (logged)


def load_signals(store, run_ids: list[int], metric: str, opts: AnalysisOptions) -> dict:
    """Every series the clocks need for `run_ids`, one query per key: {run_id: RunSignals}."""
    cache: dict[str, dict] = {}

    def load(key, on=True):
        """One query per distinct key (the gradient sizes serve both noise scales)."""
        if not key or not on:
            return {}
        if key not in cache:
            cache[key] = store.load_metric(run_ids, key)
        return cache[key]

    m = load(metric)
    drift = load(opts.drift_key)  # the drift rule's signal, and the drift at every failure
    ent = load(opts.entropy_key, opts.entropy_low is not None or opts.entropy_high is not None)
    length = load("resp_len_mean", opts.length_max is not None)
    trunc = load("truncated_frac", opts.truncated_max is not None)
    nonf = load("nonfinite")
    second = load(opts.drop_metric, opts.drop_metric is not None)
    grads = {k: load(k) for k in GRAD_KEYS}
    sign = {k: load(k) for k in SIGN_KEYS}
    times = [load(k) for k in TIME_KEYS]
    eval_n = load("eval_n")
    return {
        rid: RunSignals(
            metric=m.get(rid),
            nonfinite=nonf.get(rid),
            drift=drift.get(rid),
            entropy=ent.get(rid),
            length=length.get(rid),
            truncated=trunc.get(rid),
            drop_metric=second.get(rid),
            grads={k: v.get(rid) for k, v in grads.items()},
            sign={k: v.get(rid) for k, v in sign.items()},
            times=[t[rid] for t in times if rid in t],
            eval_n=float(np.nanmin(eval_n[rid].values)) if rid in eval_n else None,
        )
        for rid in run_ids
    }


def prepare(series) -> Curve | None:
    """The cleaned curve of a metric series (None when absent or without finite values)."""
    if series is None:
        return None
    c = clean(series.steps, series.samples, series.values)
    return None if c.empty else c


def _interp_steps(curve: Curve, samples):
    return None if samples is None else float(np.interp(samples, curve.samples, curve.steps))


def _seconds_at(times: list, samples):
    """Training seconds spent up to `samples` (cumulated time_* metrics), None if not logged."""
    if samples is None or not times:
        return None
    total = 0.0
    for s in times:
        ok = np.isfinite(s.values)
        if ok.any():
            total += float(np.interp(samples, s.samples[ok], np.cumsum(s.values[ok])))
    return total


def _drop_falls(curve: Curve, sm: np.ndarray, opts: AnalysisOptions) -> list:
    """The drop rule's falls on one smoothed curve (dated at observed points; dips when on)."""
    return collapse.falls(curve.samples, sm, float(sm[0]), opts.drop_rho, opts.drop_delta,
                          opts.drop_k, raw=curve.values,
                          recover=opts.dip_recover if opts.dips else None)


def _collapse_of(found: list) -> float | None:
    """The collapse among the falls: the one that never recovered (at most one, the last)."""
    return next((f.at for f in found if not f.dip), None)


def _fired(curve: Curve, sm: np.ndarray, sig: RunSignals, opts: AnalysisOptions,
           dips: list | None = None) -> dict:
    """Every collapse rule's firing time (None: did not fire, or its signal is not logged);
    the drop rule's dips are appended to `dips` when given."""
    fired = {}
    s = sig.nonfinite
    fired["nonfinite"] = collapse.nonfinite_rule(s.samples, s.values) if s else None
    if opts.drop:
        found = _drop_falls(curve, sm, opts)
        fired["drop"] = _collapse_of(found)
        if dips is not None:
            dips.extend(f for f in found if f.dip)
    if opts.drop_metric is not None:
        fired["heldout_drop"] = _heldout_drop(sig.drop_metric, opts)
    if opts.drift_threshold is not None:
        s = sig.drift
        fired["drift"] = (
            collapse.above_rule(s.samples, s.values, opts.drift_threshold) if s else None
        )
    if opts.entropy_low is not None or opts.entropy_high is not None:
        s = sig.entropy
        fired["entropy"] = (
            collapse.band_rule(s.samples, s.values, opts.entropy_low, opts.entropy_high)
            if s
            else None
        )
    if opts.length_max is not None or opts.truncated_max is not None:
        hits = []
        for s, bound in ((sig.length, opts.length_max), (sig.truncated, opts.truncated_max)):
            if bound is not None and s:
                hits.append(collapse.above_rule(s.samples, s.values, bound))
        fired["length"] = min([h for h in hits if h is not None], default=None)
    return fired


def _heldout_drop(series, opts: AnalysisOptions) -> float | None:
    """The drop rule on the second metric's own smoothed curve, from its own first value."""
    curve = prepare(series)
    if curve is None:
        return None
    return _collapse_of(_drop_falls(curve, smooth_curve(curve, opts), opts))


def _before(curve: Curve, at: float | None) -> Curve:
    """The points logged before `at` samples (the whole curve when `at` is None)."""
    if at is None:
        return curve
    keep = curve.samples < at
    return Curve(curve.steps[keep], curve.samples[keep], curve.values[keep])


def _crossing(curve: Curve, sm: np.ndarray, tau: float) -> float | None:
    """The progress crossing of one curve and its smoothing (`bracketed_crossing`)."""
    return None if curve.empty else bracketed_crossing(curve.samples, curve.values, sm, tau)


def _crossing_before(curve: Curve, sm: np.ndarray, tau: float, n_fail: float | None,
                     opts: AnalysisOptions) -> float | None:
    """The crossing on the curve before the failure, smoothed on its own: a centred average
    over the whole run would drag the collapsed points into the ones before the fall."""
    head = _before(curve, n_fail)
    if head.values.size == curve.values.size:
        return _crossing(curve, sm, tau)
    return None if head.empty else _crossing(head, smooth_curve(head, opts), tau)


def _value_at(series, at: float | None) -> float | None:
    """The series' last finite value logged at or before `at` samples (None: none yet)."""
    if series is None or at is None:
        return None
    ok = np.isfinite(series.values) & (series.samples <= at)
    return float(series.values[ok][-1]) if ok.any() else None


def _noise_at(series: dict, keys, fn, at, opts) -> float | None:
    g = [series.get(k) for k in keys]
    if not all(s is not None for s in g) or len({s.values.size for s in g}) != 1:
        return None
    values = fn(*(s.values for s in g), ema_alpha=opts.noise_ema)
    if values.size == 0:
        return None
    idx = min(int(np.searchsorted(g[0].samples, at, side="left")), values.size - 1)
    return float(values[idx]) if np.isfinite(values[idx]) else None


def run_clocks(run_id: int, sig: RunSignals, tau: float, opts: AnalysisOptions,
               group_size: int | None = None) -> RunClocks | None:
    """Both clocks of one run; None when its metric has no finite values.

    Progress is read on the points logged before the metric's own collapse (the drop rule's),
    smoothed on their own, and must come before the failure by any rule (`n_fail`).
    Where that smoothed curve first reaches `tau` chooses the observed upward crossing nearest
    it (a point below `tau`, the next at or above); the clock is where the straight line between
    those two points meets `tau`. So it never lies before the last point below the target
    preceding the first point at or above it, nor is it held at the next point on a coarse eval
    grid (median error within 2% on known curves evaluated every 2,048 and 1,024 samples with a
    250-problem eval set, within 6% every 256: tests/unit/test_crossing_truth.py). No crossing
    before the failure but one after it: censored at the failure, `collapsed`.
    """
    from twoclocks_cli.clocks.noise import sign_noise_scale
    from twoclocks_cli.clocks.stats import noise_scale

    curve = prepare(sig.metric)
    if curve is None:
        return None
    sm = smooth_curve(curve, opts)
    first, last = float(curve.samples[0]), float(curve.samples[-1])
    started_above = bool(sm[0] >= tau)
    dips: list = []
    fired = _fired(curve, sm, sig, opts, dips)
    n_fail, rule = collapse.earliest(fired)
    # a dip after the collapse another rule dated is part of that failure, not a recovery
    dips = [f.to_json() for f in dips if n_fail is None or f.at < n_fail]
    n_prog, reason, collapsed = None, None, False
    if started_above:
        reason = f"started at or above the target ({curve.values[0]:.4g} >= {tau:.4g})"
    else:
        # the metric's own collapse is what a centred average would drag back across the
        # crossing; another rule (drift, entropy) can fire while the metric still rises, and a
        # cut there would only shorten the curve's smoothed end
        n_prog = _crossing_before(curve, sm, tau, fired.get("drop"), opts)
        if n_prog is not None and n_fail is not None and n_fail < n_prog:
            n_prog = None
        if n_prog is None and n_fail is not None and _crossing(curve, sm, tau) is not None:
            reason = f"collapsed at {n_fail:,.0f} samples ({rule}) before the target"
            collapsed = True
        elif n_prog is None:
            reason = f"never reached the target {tau:.4g} by {last:,.0f} samples"
    group = group_size or 1
    # no number means censored (a flagged start included: its reason says why)
    prog_censored = n_prog is None
    prog_at = n_fail if collapsed else first if started_above else last
    progress = Clock(
        samples=n_prog,
        censored=prog_censored,
        censored_at=prog_at if prog_censored else None,
        steps=_interp_steps(curve, n_prog),
        prompts=n_prog / group if n_prog is not None else None,
        seconds=_seconds_at(sig.times, n_prog),
        reason=reason,
        collapsed=collapsed,
    )
    early = n_fail is not None and curve.samples.size >= 2 and n_fail <= float(curve.samples[1])
    failure = Clock(
        samples=n_fail,
        censored=n_fail is None,
        censored_at=last if n_fail is None else None,
        steps=_interp_steps(curve, n_fail),
        prompts=n_fail / group if n_fail is not None else None,
        seconds=_seconds_at(sig.times, n_fail),
        reason=(f"at eval resolution: fired at the first or second logged point ({n_fail:,.0f} "
                "samples); it measures the eval spacing, not the run") if early else None,
        rule=rule,
        rules=fired,
        at_eval_resolution=early,
        drift=_value_at(sig.drift, n_fail),
        dips=dips,
    )
    at = n_prog if n_prog is not None else last
    return RunClocks(
        run_id=run_id,
        points=int(curve.values.size),
        first_samples=first,
        last_samples=last,
        initial=float(sm[0]),
        final=float(sm[-1]),
        best=float(sm.max()),
        progress=progress,
        failure=failure,
        started_above=started_above,
        noise_scale=_noise_at(sig.grads, GRAD_KEYS, noise_scale, at, opts),
        sign_noise_scale=_noise_at(sig.sign, SIGN_KEYS, sign_noise_scale, at, opts),
    )
