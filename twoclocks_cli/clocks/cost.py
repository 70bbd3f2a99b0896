"""The clock users pay by: seconds and money per sample at each batch size, and the two clocks in
time and cost.

A throughput per batch comes from the runs' own `time_*` metrics (the median seconds per sample
of the logged steps at that batch, with a bootstrap interval over those steps; `time_step_s`
where only the whole step's seconds are logged; `time_total_s`, a run's whole training seconds,
as one step of its mean duration where nothing finer is), or from a cost
file (`CostFile`: a fixed overhead per step plus generation and update seconds per sample, and
an optional price per hour). The clocks in samples times the seconds per sample give the clocks
in seconds; the intervals multiply end to end (low x low, high x high). B_crit in time is the
batch past which time-to-target stops falling.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from twoclocks_cli.clocks.stats import CONF
from twoclocks_cli.core.codec import Document
from twoclocks_cli.core.errors import AnalysisError, ConfigError
from twoclocks_cli.core.numbers import Number, short

OBJECTIVES = ("samples", "time", "cost")
# seconds per optimizer step as a tracker logs it whole (TRL's step_time): the throughput's
# source for runs without the time_gen_s/time_reward_s/time_update_s parts
STEP_TIME_KEY = "time_step_s"
# seconds of the whole training as a tracker logs it once, at its last step (TRL's
# train_runtime): the source for runs that log no seconds per step at all
RUNTIME_KEY = "time_total_s"
_BOOT_CELLS = 2_000_000  # resampled step times held at once by the throughput's bootstrap
# Bounds of a cost file's numbers: past a million seconds (11.6 days) per step or per sample a
# timing is a unit mistake, and under these bounds a clock of up to INT64 samples stays a finite
# number of seconds and of money.
MAX_SECONDS = 1e6
MAX_PRICE_PER_HOUR = 1e9


class CostFile(BaseModel):
    """A cost file (`--cost FILE`, TOML): seconds per step at batch B (samples) are
    `step_overhead_s + B x (gen_s_per_sample + update_s_per_sample)`. With no timing key the
    throughput is measured from the runs and only the price is taken from here."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    step_overhead_s: float | None = Field(
        None, ge=0, le=MAX_SECONDS, description="Fixed seconds per optimizer step whatever the "
        "batch (weight sync to the inference engine, launch and logging).")
    gen_s_per_sample: float | None = Field(
        None, ge=0, le=MAX_SECONDS, description="Generation (rollout) seconds per sampled "
        "completion, at full utilisation.")
    update_s_per_sample: float | None = Field(
        None, ge=0, le=MAX_SECONDS,
        description="Reward and policy-update seconds per sampled completion.")
    price_per_hour: float | None = Field(
        None, gt=0, le=MAX_PRICE_PER_HOUR, description="Price of the machines the run uses, per "
        "hour (any currency); without it there is no cost clock.")

    @property
    def timed(self) -> bool:
        """Whether the file gives the seconds per step (else they are measured)."""
        return any(v is not None for v in (self.step_overhead_s, self.gen_s_per_sample,
                                           self.update_s_per_sample))

    def seconds_per_sample(self, batch: float) -> float:
        """Seconds per sample at `batch` samples per step under this model."""
        return ((self.step_overhead_s or 0.0) / batch + (self.gen_s_per_sample or 0.0)
                + (self.update_s_per_sample or 0.0))


def load_cost(path: str | Path) -> CostFile:
    """The cost file at `path`; any problem is one ConfigError line naming the file and key."""
    from twoclocks_cli.core import toml

    data = toml.read(path, what="cost file")
    try:
        cost = CostFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_problem(exc.errors(include_url=False)[0], path)) from None
    if not cost.timed and cost.price_per_hour is None:
        raise ConfigError(f"{path}: no key given: a cost file sets step_overhead_s, "
                          "gen_s_per_sample, update_s_per_sample and/or price_per_hour")
    if cost.timed and cost.seconds_per_sample(1.0) <= 0:
        raise ConfigError(f"{path}: every timing is 0: a step must take some time (give "
                          "step_overhead_s, gen_s_per_sample or update_s_per_sample > 0)")
    return cost


def _problem(err: dict, path) -> str:
    """One line for a cost file's first problem: file, key, value (shortened) and what is
    allowed."""
    key = ".".join(str(p) for p in err["loc"]) or "(top level)"
    if err["type"] == "extra_forbidden":
        return f"{path}: unknown key {short(key)}: allowed are {', '.join(CostFile.model_fields)}"
    number = "a number" if err["type"] in _RANGE_ERRORS else "a finite number"
    return f"{path}: {key} = {short(err.get('input'))}: must be {number} {_bounds(key)}"


_RANGE_ERRORS = ("greater_than_equal", "greater_than", "less_than_equal")


def _bounds(key: str) -> str:
    """What a cost file's key allows, from its field's bounds (`>= 0 and <= 1e+06`)."""
    if key not in CostFile.model_fields:
        return ""
    meta = CostFile.model_fields[key].metadata
    low = next((f">= {m.ge:g}" for m in meta if getattr(m, "ge", None) is not None),
               next((f"> {m.gt:g}" for m in meta if getattr(m, "gt", None) is not None), ""))
    high = next((f"<= {m.le:g}" for m in meta if getattr(m, "le", None) is not None), "")
    unit = " seconds" if key.endswith(("_s", "_s_per_sample")) else ""
    return " and ".join(filter(None, (low, high))) + unit


@dataclass
class Throughput(Document):
    """Seconds per sample at one batch size: median [interval], and what it rests on."""

    batch_samples: Number | None = None
    seconds_per_sample: Number | None = None
    low: Number | None = None
    high: Number | None = None
    steps: int = 0  # logged steps it is the median of (0: from the cost file)
    source: str = "measured"  # measured (the runs' time_* metrics) | cost file


@dataclass
class Spent(Document):
    """One clock at one batch in seconds and in money: median [interval], None where unknown
    (a censored clock, or no throughput); `lower_bound` for a censored clock."""

    seconds: Number | None = None
    low: Number | None = None
    high: Number | None = None
    lower_bound: Number | None = None
    cost: Number | None = None
    cost_low: Number | None = None
    cost_high: Number | None = None


@dataclass
class TimedBatch(Document):
    """The two clocks of one batch in time and cost."""

    batch_samples: Number
    throughput: Throughput
    progress: Spent
    failure: Spent



@dataclass
class TimeClocks(Document):
    """Both clocks in time and cost per batch, and B_crit in time beside B_crit in samples."""

    source: str = ""  # measured | cost file
    price_per_hour: Number | None = None
    cost_file: dict | None = None  # the cost model's fields, when one was given
    b_crit_time: Number | None = None  # the batch past which time-to-target stops falling
    b_crit_time_bound: str | None = None  # "lower": still falling at the largest batch
    note: str = ""
    batches: list[TimedBatch] = field(default_factory=list)

    def at(self, batch: float) -> TimedBatch | None:
        return next((b for b in self.batches if b.batch_samples == batch), None)


def step_seconds(times: list) -> np.ndarray:
    """Seconds of each logged step of one run: the time_* series summed at the steps where each
    of them has a finite value (a step missing one part is left out, not undercounted)."""
    per_key = []
    for s in times:
        ok = np.isfinite(s.values)
        per_key.append(dict(zip(s.steps[ok].tolist(), s.values[ok].tolist(), strict=True)))
    if not per_key:
        return np.array([])
    common = set(per_key[0]).intersection(*per_key[1:])
    return np.array([sum(d[k] for d in per_key) for k in sorted(common)], float)


def runtime_steps(store, run_ids: list[int]) -> dict:
    """{run: its whole training seconds as one step of the mean duration} for the runs that
    logged RUNTIME_KEY: runtime / steps trained (the step it was logged at, the last)."""
    from twoclocks_cli.store.store import Series

    out = {}
    for rid, s in (store.load_metric(run_ids, RUNTIME_KEY) if run_ids else {}).items():
        ok = np.flatnonzero(np.isfinite(s.values) & (s.steps > 0))
        if ok.size:
            i = ok[-1]
            out[rid] = Series(s.steps[i:i + 1], s.samples[i:i + 1],
                              s.values[i:i + 1] / s.steps[i])
    return out


def measured_throughput(batch: float, times_of_runs: list[list], rng,
                        reps: int = 1000) -> Throughput | None:
    """Median seconds per sample over every logged step of the runs at `batch` (each run's
    time_* series), with a bootstrap interval over those steps; None when none logged."""
    per_sample = np.concatenate([step_seconds(t) for t in times_of_runs] or [np.array([])])
    per_sample = per_sample[per_sample > 0] / batch
    if per_sample.size == 0:
        return None
    med = float(np.median(per_sample))
    if per_sample.size == 1:
        return Throughput(batch, med, steps=1)
    n = per_sample.size
    chunk = max(1, _BOOT_CELLS // n)  # long runs log many steps: bound the draws in memory
    boots = np.concatenate([
        np.median(per_sample[rng.integers(0, n, size=(min(chunk, reps - i), n))], axis=1)
        for i in range(0, reps, chunk)])
    lo, hi = np.quantile(boots, [(1 - CONF) / 2, (1 + CONF) / 2])
    return Throughput(batch, med, float(lo), float(hi), steps=int(per_sample.size))


def modelled_throughput(batch: float, cost: CostFile) -> Throughput:
    """Seconds per sample at `batch` from a cost file (exact: no interval of its own)."""
    v = cost.seconds_per_sample(batch)
    return Throughput(batch, v, v, v, steps=0, source="cost file")


def _times(a, b):
    return None if a is None or b is None else a * b


def spent(agg, tp: Throughput, price: float | None) -> Spent:
    """A clock in samples (a stats.Aggregate) in seconds and money at throughput `tp`; the
    interval ends multiply (low x low, high x high): both factors are positive."""
    sps = tp.seconds_per_sample
    seconds = _times(agg.median, sps)
    low = _times(agg.low, tp.low if tp.low is not None else sps)
    high = _times(agg.high, tp.high if tp.high is not None else sps)
    lower_bound = _times(agg.lower_bound, tp.low if tp.low is not None else sps)
    per_s = None if price is None else price / 3600.0
    return Spent(seconds=seconds, low=low, high=high, lower_bound=lower_bound,
                 cost=_times(seconds, per_s), cost_low=_times(low, per_s),
                 cost_high=_times(high, per_s))


def time_clocks(batches, throughputs: dict[float, Throughput], source: str,
                cost: CostFile | None = None) -> TimeClocks | None:
    """Both clocks of each batch row (result.BatchRow) in time and cost (money at the cost
    file's price); None without any throughput."""
    if not throughputs:
        return None
    return _timed(batches, throughputs, source, cost.price_per_hour if cost else None,
                  None if cost is None else cost.model_dump())


def retimed(time: TimeClocks, batches) -> TimeClocks | None:
    """`time`'s throughput and price applied to other batch rows (a resample of the seeds)."""
    tps = {b.batch_samples: b.throughput for b in time.batches}
    return _timed(batches, tps, time.source, time.price_per_hour, time.cost_file)


def _timed(batches, throughputs: dict, source: str, price: float | None,
           cost_file: dict | None) -> TimeClocks:
    rows = [TimedBatch(b.batch_samples, throughputs[b.batch_samples],
                       spent(b.progress, throughputs[b.batch_samples], price),
                       spent(b.failure, throughputs[b.batch_samples], price))
            for b in batches if b.batch_samples in throughputs]
    missing = [b.batch_samples for b in batches if b.batch_samples not in throughputs]
    out = TimeClocks(source=source, price_per_hour=price, batches=rows,
                     cost_file=cost_file)
    for row in rows:
        _refuse_overflow(row, source)
    out.b_crit_time, out.b_crit_time_bound, out.note = b_crit_in_time(rows)
    if missing:
        out.note += (f"; no timing logged at B={', '.join(f'{b:g}' for b in missing)}: "
                     "left out")
    return out


def _refuse_overflow(row: TimedBatch, source: str) -> None:
    """AnalysisError when a clock in time or money of `row` is beyond a float (huge logged step
    times): an `inf` would read as a result and be stored as one."""
    for name, clock in (("time to target", row.progress), ("time to failure", row.failure)):
        if any(v is not None and not np.isfinite(v) for v in asdict(clock).values()):
            raise AnalysisError(
                f"the {name} at B={row.batch_samples:g} is beyond a float: "
                f"{row.throughput.seconds_per_sample:g} seconds per sample ({source} throughput) "
                "times its samples; check the timings (logged time_* metrics or --cost)")


def b_crit_in_time(rows: list[TimedBatch]) -> tuple[float | None, str | None, str]:
    """The batch past which time-to-target stops falling: the batch with the least median
    time-to-target among those that reached it ("lower" bound when that is the largest batch
    timed: larger ones may be faster still)."""
    reached = [r for r in rows if r.progress.seconds is not None]
    if not reached:
        return None, None, "no timed batch reached the target"
    best = min(reached, key=lambda r: (r.progress.seconds, r.batch_samples))
    largest = max(r.batch_samples for r in rows)
    if best.batch_samples == largest and len(reached) > 1:
        return best.batch_samples, "lower", (
            f"time-to-target still falls at the largest batch {best.batch_samples:g}: B_crit "
            "in time is at least that")
    return best.batch_samples, None, (
        f"time-to-target is least at B={best.batch_samples:g} "
        f"({best.progress.seconds:,.0f} s) and does not fall past it")


def for_analysis(analysis, cost: CostFile | None = None) -> TimeClocks | None:
    """The analysis's clocks in time and cost under `cost` (a cost file with timings replaces
    the measured throughput; one with only a price prices the measured one)."""
    if cost is not None and cost.timed:
        tps = {b.batch_samples: modelled_throughput(b.batch_samples, cost)
               for b in analysis.batches}
        return time_clocks(analysis.batches, tps, "cost file", cost)
    measured = analysis.time
    if measured is None:
        return None
    tps = {b.batch_samples: b.throughput for b in measured.batches}
    if measured.cost_file and cost is not None:
        # a stored analysis may hold a cost file's throughput: priced anew, it keeps that
        # file's timings (and its source)
        cost = CostFile.model_validate({**measured.cost_file,
                                        "price_per_hour": cost.price_per_hour})
    return time_clocks(analysis.batches, tps, measured.source or "measured", cost)


@dataclass
class Segment:
    """The samples a phased run trained at one batch, from `start` up to the next segment's
    start (the last one open-ended), and the throughput there (None: not known)."""

    start: float
    batch_samples: float
    throughput: Throughput | None


def phased_seconds(segments: list[Segment], samples: float, end: str) -> float | None:
    """Seconds a phased run spends to reach `samples`: each segment's share of the samples
    times its seconds per sample (`end`: "median", "low" or "high" of the throughput); None
    when a segment on the way has no throughput."""
    total = 0.0
    for i, seg in enumerate(segments):
        if samples <= seg.start:
            break
        stop = segments[i + 1].start if i + 1 < len(segments) else samples
        tp = seg.throughput
        rate = None if tp is None else tp.seconds_per_sample if end == "median" else (
            getattr(tp, end) if getattr(tp, end) is not None else tp.seconds_per_sample)
        if rate is None:
            return None
        total += (min(samples, stop) - seg.start) * rate
    return total


def phased_spent(samples: float | None, censored_at: float | None, segments: list[Segment],
                 price: float | None) -> Spent:
    """One clock of a phased run (one seed: its samples carry no interval) in seconds and
    money; the interval is the throughputs' (all low, all high); `lower_bound` when censored."""
    if not segments:
        return Spent()
    per_s = None if price is None else price / 3600.0
    if samples is None:
        bound = None if censored_at is None else phased_seconds(segments, censored_at, "low")
        return Spent(lower_bound=bound)
    seconds, low, high = (phased_seconds(segments, samples, e) for e in ("median", "low", "high"))
    return Spent(seconds=seconds, low=low, high=high, cost=_times(seconds, per_s),
                 cost_low=_times(low, per_s), cost_high=_times(high, per_s))
