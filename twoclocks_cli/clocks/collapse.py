"""Collapse rules of the failure clock; each returns the samples at which it fires, or None."""

from __future__ import annotations

import numpy as np


def drop_rule(samples, smoothed, initial: float, rho=0.3, delta=0.05, k=3) -> float | None:
    """Smoothed metric below peak - max(rho*(peak-initial), delta) for k consecutive points.

    The peak is the running maximum so far; the failure time is the first of the k points.
    """
    smoothed = np.asarray(smoothed, float)
    if smoothed.size < k:
        return None
    peak = np.maximum.accumulate(smoothed)
    floor = peak - np.maximum(rho * (peak - initial), delta)
    below = smoothed < floor
    run = 0
    for i, b in enumerate(below):
        run = run + 1 if b else 0
        if run >= k:
            return float(samples[i - k + 1])
    return None


def above_rule(samples, values, bound: float) -> float | None:
    """First point whose value is >= bound (drift, length, truncated fraction)."""
    hit = np.flatnonzero(np.asarray(values, float) >= bound)
    return float(samples[hit[0]]) if hit.size else None


def band_rule(samples, values, low: float | None, high: float | None) -> float | None:
    """First point whose value leaves [low, high] (entropy collapse or explosion)."""
    values = np.asarray(values, float)
    out = np.zeros(values.size, bool)
    if low is not None:
        out |= values < low
    if high is not None:
        out |= values > high
    hit = np.flatnonzero(out)
    return float(samples[hit[0]]) if hit.size else None


def nonfinite_rule(samples, flags) -> float | None:
    """First step flagged non-finite (the backend writes nonfinite = 1 there)."""
    flags = np.asarray(flags, float)
    hit = np.flatnonzero(flags >= 0.5)
    return float(samples[hit[0]]) if hit.size else None


def earliest(fired: dict[str, float | None]) -> tuple[float | None, str | None]:
    """The earliest firing rule and its time (ties: the first in `fired`'s order)."""
    best, name = None, None
    for rule, at in fired.items():
        if at is not None and (best is None or at < best):
            best, name = at, rule
    return best, name
