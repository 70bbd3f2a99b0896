"""Collapse rules of the failure clock; each returns the samples at which it fires, or None."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from twoclocks_cli.core.codec import Document


@dataclass(frozen=True)
class Fall(Document):
    """One fall of a metric by the drop rule: where it is dated, the level it fell from, and
    where it climbed back (None: not within the data, so a collapse)."""

    at: float  # samples: the first observed point below the floor (never before it)
    peak: float  # the pre-fall level: the smoothed metric's running maximum at the fall
    recovered_at: float | None = None

    @property
    def dip(self) -> bool:
        return self.recovered_at is not None


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


def trailing(values, window: int = 5) -> np.ndarray:
    """Trailing mean of the last `window` points (fewer at the start): the causal smoothing of
    the live drop rule; a point's value never changes as later data arrive."""
    values = np.asarray(values, float)
    return np.array([_mean(values[max(0, i - window + 1):i + 1]) for i in range(values.size)])


def _mean(values) -> float:
    """The mean `trailing` and `LiveFalls` share, so both give the same bits."""
    return math.fsum(values) / len(values)


@dataclass
class LiveFalls:
    """The drop rule of `falls` fed one evaluation at a time, on the trailing mean of the last
    `window` raw values (`trailing`); its state is JSON-able, for a checkpoint.

    After each point, `falls()` is what `falls` gives on the data so far smoothed by
    `trailing`. A live collapse is declared `patience` evaluations after a fall fires (k
    consecutive smoothed points below the floor) when no smoothed point since has climbed back
    to the recovery level (peak - recover x allowance), and only once (`collapsed_at`, the
    samples of that evaluation). So a dip whose smoothed metric is back at the recovery level
    within `patience` evaluations of firing never stops a run; one that stays down longer is a
    collapse to the live rule, which cannot wait for the rest of the run. A collapse is declared
    k - 1 + patience evaluations after its smoothed fall starts, so at most that many after
    `falls` dates it on the same smoothing. recover None: every fall is held down.
    """

    window: int = 5
    rho: float = 0.3
    delta: float = 0.05
    k: int = 3
    recover: float | None = 0.5
    patience: int = 3
    initial: float | None = None
    peak: float | None = None  # the running maximum of the smoothed metric
    last: list = field(default_factory=list)  # [samples, raw, peak] of the newest points
    run: int = 0  # smoothed points in a row below the floor
    found: list = field(default_factory=list)  # Fall.to_json of every fall so far
    down: dict | None = None  # the last fall while not recovered: its level, evaluations since
    undated: list = field(default_factory=list)  # [fall, floor]: no raw point below it yet
    collapsed_at: float | None = None

    def push(self, samples: float, value: float) -> bool:
        """Fold in one evaluation; True when it is the one at which a collapse is declared."""
        samples, value = float(samples), float(value)
        if not math.isfinite(value):  # skipped, as curves.clean drops it before `falls`
            return False
        self.last = (self.last + [[samples, value, 0.0]])[-max(self.window, self.k):]
        sm = _mean([row[1] for row in self.last[-self.window:]])
        self.initial = sm if self.initial is None else self.initial
        self.peak = sm if self.peak is None else max(self.peak, sm)
        self.last[-1][2] = self.peak
        self._date(samples, value)
        if self.down is not None:
            return self._held(samples, sm)
        self.run = self.run + 1 if sm < self._floor(self.peak) else 0
        if self.run < self.k:
            return False
        self._fire()
        return self._held(samples, None)

    def falls(self) -> list[Fall]:
        """The falls so far, as `falls` finds them on the trailing mean of the data so far."""
        return [Fall(**f) for f in self.found]

    def to_dict(self) -> dict:
        """The state (restore with LiveFalls(**this))."""
        return asdict(self)

    def _allowance(self, peak: float) -> float:
        """How far below `peak` a fall starts, as `falls` computes it (same float operations)."""
        return max(self.rho * (peak - self.initial), self.delta)

    def _floor(self, peak: float) -> float:
        """The level a point must be under to count toward a fall."""
        return peak - self._allowance(peak)

    def _fire(self) -> None:
        """Record the fall whose k-point run ends here, dated as `falls` dates it."""
        rows = self.last[-self.k:]
        peak = rows[0][2]
        floor = self._floor(peak)
        below = [row[0] for row in rows if row[1] < floor]
        self.found.append(Fall(below[0] if below else rows[0][0], peak).to_json())
        if not below:  # `falls` dates it at the first raw point below, whenever that comes
            self.undated.append([len(self.found) - 1, floor])
        level = None if self.recover is None else peak - self.recover * self._allowance(peak)
        self.down = {"level": level, "since": 0}

    def _date(self, samples: float, value: float) -> None:
        """Date the falls still waiting for a raw point below their floor."""
        for row in [u for u in self.undated if value < u[1]]:
            self.found[row[0]]["at"] = samples
            self.undated.remove(row)

    def _held(self, samples: float, sm: float | None) -> bool:
        """Track the open fall: recovered (a dip), or still down; True at the declaration."""
        level = self.down["level"]
        if sm is not None and level is not None and sm >= level:
            self.found[-1]["recovered_at"] = samples
            self.down, self.run = None, 0
            return False
        self.down["since"] += 0 if sm is None else 1
        if self.collapsed_at is not None or self.down["since"] < self.patience:
            return False
        self.collapsed_at = samples
        return True


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
