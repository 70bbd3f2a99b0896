"""Collapse rules of the failure clock; each returns the samples at which it fires, or None."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Fall:
    """One fall of a metric by the drop rule: where it is dated, the level it fell from, and
    where it climbed back (None: not within the data, so a collapse)."""

    at: float  # samples: the first observed point below the floor (never before it)
    peak: float  # the pre-fall level: the smoothed metric's running maximum at the fall
    recovered_at: float | None = None

    @property
    def dip(self) -> bool:
        return self.recovered_at is not None

    def to_json(self) -> dict:
        return {"at": self.at, "peak": self.peak, "recovered_at": self.recovered_at}


def falls(samples, smoothed, initial: float, rho=0.3, delta=0.05, k=3, raw=None,
          recover: float | None = 0.5) -> list[Fall]:
    """Every fall of the drop rule in order: dips (the smoothed metric climbs back above
    peak - recover x allowance later in the data), then at most one collapse (it never does),
    after which the curve is not read.

    The floor is peak - allowance, allowance = max(rho (peak - initial), delta), peak the running
    maximum of `smoothed`; a fall fires at k consecutive points below it. It is dated at the
    first `raw` point at or after the smoothed run's start that is itself below the floor: a
    centred average falls before the data does, and a collapse is never placed before an
    observed one. `recover` None: no fall is a dip (every fall is a collapse).

    Causal in this sense: the falls found in a prefix of the data are the falls of the whole
    data up to there; only whether the last of them recovers can change as data arrive.
    """
    samples = np.asarray(samples, float)
    smoothed = np.asarray(smoothed, float)
    raw = smoothed if raw is None else np.asarray(raw, float)
    if smoothed.size < k:
        return []
    peak = np.maximum.accumulate(smoothed)
    allowance = np.maximum(rho * (peak - initial), delta)
    floor = peak - allowance
    out: list[Fall] = []
    run, i = 0, 0
    while i < smoothed.size:
        run = run + 1 if smoothed[i] < floor[i] else 0
        if run < k:
            i += 1
            continue
        start = i - k + 1
        below = np.flatnonzero(raw[start:] < floor[start])
        at = float(samples[start + below[0]]) if below.size else float(samples[start])
        back = None
        if recover is not None:
            level = peak[start] - recover * allowance[start]
            up = np.flatnonzero(smoothed[i + 1:] >= level)
            back = None if not up.size else i + 1 + int(up[0])
        out.append(Fall(at, float(peak[start]),
                        None if back is None else float(samples[back])))
        if back is None:
            return out
        run, i = 0, back + 1
    return out


def drop_rule(samples, smoothed, initial: float, rho=0.3, delta=0.05, k=3, raw=None,
              recover: float | None = None) -> float | None:
    """The collapse time by the drop rule (`falls`): the first fall that does not recover, or
    None. recover None (the default here): the first fall of any kind."""
    found = [f for f in falls(samples, smoothed, initial, rho, delta, k, raw, recover)
             if not f.dip]
    return found[0].at if found else None


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
