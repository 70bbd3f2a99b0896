"""Curve preparation and the progress crossing: clean, smooth, interpolate, censor."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Curve:
    """A cleaned metric curve: strictly increasing steps, finite values only, with samples."""

    steps: np.ndarray
    samples: np.ndarray
    values: np.ndarray

    @property
    def empty(self) -> bool:
        return self.values.size == 0


def clean(steps, samples, values) -> Curve:
    """Sort by step, keep the last value of a duplicated step, drop NaN/inf points."""
    steps = np.asarray(steps, np.int64)
    samples = np.asarray(samples, float)
    values = np.asarray(values, float)
    order = np.argsort(steps, kind="stable")
    steps, samples, values = steps[order], samples[order], values[order]
    if steps.size:
        last = np.append(steps[1:] != steps[:-1], True)  # the last of each run of equal steps
        steps, samples, values = steps[last], samples[last], values[last]
    ok = np.isfinite(values)
    return Curve(steps[ok], samples[ok], values[ok])


def smooth(values: np.ndarray, method: str = "ma", window: int = 5, ema_alpha: float = 0.3):
    """Centred moving average over `window` points (shrinking at the ends), EMA, or none."""
    values = np.asarray(values, float)
    if method == "none" or values.size == 0 or (method == "ma" and window <= 1):
        return values.copy()
    if method == "ema":
        from twoclocks_cli.clocks.stats import ema

        return ema(values, ema_alpha)
    half = window // 2
    csum = np.concatenate([[0.0], np.cumsum(values)])
    idx = np.arange(values.size)
    lo = np.maximum(idx - half, 0)
    hi = np.minimum(idx + (window - 1 - half) + 1, values.size)
    return (csum[hi] - csum[lo]) / (hi - lo)


def first_crossing(samples: np.ndarray, smoothed: np.ndarray, target: float) -> float | None:
    """Samples where the curve first reaches `target`, linearly interpolated; None if never."""
    hit = np.flatnonzero(smoothed >= target)
    if hit.size == 0:
        return None
    i = int(hit[0])
    if i == 0:
        return float(samples[0])
    y0, y1 = smoothed[i - 1], smoothed[i]
    x0, x1 = samples[i - 1], samples[i]
    frac = (target - y0) / (y1 - y0) if y1 != y0 else 1.0
    return float(x0 + frac * (x1 - x0))


def smooth_span(samples: np.ndarray, values: np.ndarray, span: float) -> np.ndarray:
    """Centred moving average over the points within +-span/2 samples of each point.

    A window in logged points spans more samples at larger batches; a span in samples smooths
    every batch size over the same stretch of training.
    """
    samples = np.asarray(samples, float)
    values = np.asarray(values, float)
    csum = np.concatenate([[0.0], np.cumsum(values)])
    lo = np.searchsorted(samples, samples - span / 2, side="left")
    hi = np.searchsorted(samples, samples + span / 2, side="right")
    return (csum[hi] - csum[lo]) / np.maximum(hi - lo, 1)


def smooth_curve(curve: Curve, opts) -> np.ndarray:
    """The curve smoothed as `opts` (AnalysisOptions) says: a span in samples when given."""
    if getattr(opts, "span_samples", None):
        return smooth_span(curve.samples, curve.values, opts.span_samples)
    return smooth(curve.values, opts.smoothing, opts.window, opts.ema_alpha)
