"""The analysis, typed: what `analyze_sweep` returns and what schedule, report, suggest, compare,
the plots, the adaptive calibration and the store's deletes read.

An `Analysis` becomes JSON once, `Analysis.to_json` (the analyses table, `analyze --json`), and a
stored document becomes an `Analysis` once, `Analysis.from_json` (`clocks.saved` loads it). This
module is the only place that knows the document's keys; everyone else reads attributes. The
document keeps the shape the analyses table already holds: unknown keys are ignored and missing
ones take their defaults, so analyses stored by an older twoclocks still read.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import asdict, dataclass, field

import numpy as np

from twoclocks_cli.clocks.cost import TimeClocks
from twoclocks_cli.clocks.critical import Estimate
from twoclocks_cli.clocks.options import AnalysisOptions
from twoclocks_cli.clocks.runclock import Clock
from twoclocks_cli.clocks.stats import Aggregate


def _take(cls, data: dict | None, **override):
    """An instance of dataclass `cls` from the keys of `data` it knows (the rest dropped)."""
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in (data or {}).items() if k in names}
    kwargs.update(override)
    return cls(**kwargs)


def _aggregate(data: dict | None) -> Aggregate:
    d = {"n": 0, "n_censored": 0, "median": None, "low": None, "high": None,
         "lower_bound": None, "note": "", **(data or {})}
    return _take(Aggregate, d)


def _clock(data: dict | None) -> Clock:
    return _take(Clock, {"samples": None, "censored": True, **(data or {})})


def json_numbers(obj):
    """`obj` with its numbers as strict JSON holds them: NaN and infinities None, numpy scalars
    Python ones (dataclasses, dicts and lists rebuilt, tuples as lists).

    `analyze_sweep` passes its result through this, so a reader sees the same values whether
    the analysis was just computed or loaded from the analyses table."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: json_numbers(getattr(obj, f.name))
                                           for f in dataclasses.fields(obj) if f.init})
    if isinstance(obj, dict):
        return {str(k): json_numbers(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_numbers(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _jsonable(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


@dataclass(frozen=True)
class Target:
    """The progress target: its spec (`frac:0.5`, `abs:0.3`) and the value it resolved to."""

    spec: str | None = None
    value: float | None = None
    initial: float | None = None  # median smoothed metric at the first point
    best: float | None = None  # best smoothed metric of the sweep

    def to_json(self) -> dict:
        return asdict(self)


# a run's identity and status, first in its row of the document
_IDENTITY = ("run_id", "name", "batch_samples", "batch_prompts", "group_size", "lr", "clip_low",
             "clip_high", "seed", "status", "partial", "in_family")
# the row of a run without a finite value of the metric: its clocks are empty, in this order
_UNANALYSED = _IDENTITY + ("points", "last_samples", "progress", "failure", "noise_scale",
                           "sign_noise_scale", "started_above")


@dataclass
class RunRow:
    """One run of the analysis: its cell, status and both clocks (`runclock.RunClocks`)."""

    run_id: int | None = None
    name: str | None = None
    batch_samples: float | None = None
    batch_prompts: int | None = None
    group_size: int | None = None
    lr: float | None = None
    clip_low: float | None = None
    clip_high: float | None = None
    seed: int | None = None
    status: str | None = None
    partial: bool = False
    in_family: bool = True  # analysed with the sweep's main setting
    points: int = 0
    first_samples: float | None = None
    last_samples: float | None = None
    initial: float | None = None
    final: float | None = None
    best: float | None = None
    progress: Clock = field(default_factory=lambda: Clock(None, True))
    failure: Clock = field(default_factory=lambda: Clock(None, True))
    started_above: bool = False
    noise_scale: float | None = None
    sign_noise_scale: float | None = None

    @property
    def analysed(self) -> bool:
        """Whether the run had finite values of the metric (else its clocks are empty)."""
        return self.points > 0

    @classmethod
    def from_json(cls, d: dict) -> RunRow:
        return _take(cls, d, progress=_clock(d.get("progress")), failure=_clock(d.get("failure")))

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["progress"], out["failure"] = self.progress.to_json(), self.failure.to_json()
        return out if self.analysed else {k: out[k] for k in _UNANALYSED}


@dataclass
class BatchRow:
    """Both clocks at one batch size, aggregated over its seeds."""

    batch_samples: float
    batch_prompts: list = field(default_factory=list)
    lr: list = field(default_factory=list)
    n_runs: int = 0
    partial: bool = False
    progress: Aggregate = field(default_factory=lambda: _aggregate(None))
    failure: Aggregate = field(default_factory=lambda: _aggregate(None))
    n_failed: int | None = None  # seeds whose failure clock fired (None: stored before it was)
    # the drift logged at each failed seed's failure: median and interval over those seeds
    # (equal across batches if a drift threshold sets the failure clock)
    drift_at_failure: Aggregate = field(default_factory=lambda: _aggregate(None))
    n_dips: int = 0  # falls that recovered, over every seed (not failures)
    runs_with_dips: int = 0

    @classmethod
    def from_json(cls, d: dict) -> BatchRow:
        fail = d.get("failure") or {}
        return _take(cls, d, progress=_aggregate(d.get("progress")), failure=_aggregate(fail),
                     n_failed=fail.get("n_failed"), n_dips=fail.get("n_dips") or 0,
                     runs_with_dips=fail.get("runs_with_dips") or 0,
                     drift_at_failure=_aggregate(fail.get("drift_at_failure")))

    def to_json(self) -> dict:
        return {"batch_samples": self.batch_samples, "batch_prompts": list(self.batch_prompts),
                "lr": list(self.lr), "n_runs": self.n_runs, "partial": self.partial,
                "progress": self.progress.to_json(),
                "failure": {**self.failure.to_json(), "n_failed": self.n_failed,
                            "n_dips": self.n_dips, "runs_with_dips": self.runs_with_dips,
                            "drift_at_failure": self.drift_at_failure.to_json()}}


@dataclass
class Recommended(Estimate):
    """The estimate the schedule follows, and the documented rule's reason for it (`source`
    None: no estimate, `why` says why)."""

    why: str = ""

    @classmethod
    def of(cls, chosen: Estimate | None, why: str) -> Recommended:
        """The recommendation of `chosen` (None: no estimate), with what the document keeps."""
        if chosen is None:
            return cls(source=None, b_crit=None, why=why)
        return cls(source=chosen.source, b_crit=chosen.b_crit, low=chosen.low, high=chosen.high,
                   bound=chosen.bound, e_min=chosen.e_min, placement=chosen.placement,
                   seeds=chosen.seeds, why=why)

    @classmethod
    def from_json(cls, d: dict) -> Recommended:
        return _take(cls, {"source": None, "b_crit": None, **d}, seeds=d.get("seeds") or 0)

    def to_json(self) -> dict:
        out = {"b_crit": self.b_crit, "low": self.low, "high": self.high, "bound": self.bound,
               "source": self.source, "placement": self.placement}
        if self.source is not None:
            out.update(e_min=self.e_min, seeds=self.seeds)
        out["why"] = self.why
        return out


@dataclass(frozen=True)
class NoiseSummary:
    """A gradient-noise scale over runs (median, range) and what it was measured on."""

    value: float | None = None
    low: float | None = None
    high: float | None = None
    n_runs: int = 0
    note: str = ""

    def to_json(self) -> dict:
        if self.value is None:
            return {"value": None, "n_runs": self.n_runs, "note": self.note}
        return {"value": self.value, "low": self.low, "high": self.high, "n_runs": self.n_runs,
                "note": self.note}


@dataclass(frozen=True)
class Theory:
    """The theory model's B_crit for a sim sweep (or at a probe's branch point).

    The prediction is the theory module's own document (`theory.predict_critical_batch`; which
    keys it has depends on the branch that answered): it is kept whole in `doc` and written back
    as it came; the attributes are what twoclocks reads of it."""

    b_crit: float | None = None
    method: str | None = None
    mechanism: str | None = None
    note: str | None = None
    doc: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: dict) -> Theory:
        return cls(b_crit=d.get("b_crit"), method=d.get("method"), mechanism=d.get("mechanism"),
                   note=d.get("note"), doc=dict(d))

    def to_json(self) -> dict:
        return dict(self.doc)


@dataclass
class Critical:
    """Every B_crit estimate side by side, the recommended one and the disagreements."""

    empirical: Estimate
    power: Estimate
    mccandlish: Estimate
    # None: an analysis stored before twoclocks recommended one (`suggest` redoes it)
    recommended: Recommended | None
    noise_scale: NoiseSummary = field(default_factory=NoiseSummary)
    sign_noise_scale: NoiseSummary = field(default_factory=NoiseSummary)
    theory: Theory | None = None
    disagreements: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: dict | None) -> Critical:
        d = d or {}

        def est(name):
            return _take(Estimate, {"source": name, "b_crit": None, **(d.get(name) or {})})

        rec = d.get("recommended")
        theory = d.get("theory")
        return cls(
            empirical=est("empirical"),
            power=est("power"),
            mccandlish=est("mccandlish"),
            recommended=None if rec is None else Recommended.from_json(rec),
            noise_scale=_take(NoiseSummary, d.get("noise_scale")),
            sign_noise_scale=_take(NoiseSummary, d.get("sign_noise_scale")),
            theory=None if theory is None else Theory.from_json(theory),
            disagreements=list(d.get("disagreements") or []),
        )

    def to_json(self) -> dict:
        out = {
            "empirical": self.empirical.to_json(),
            "power": self.power.to_json(),
            "mccandlish": self.mccandlish.to_json(),
            "noise_scale": {**self.noise_scale.to_json(), "b_simple": self.noise_scale.value},
            "sign_noise_scale": self.sign_noise_scale.to_json(),
            "theory": None if self.theory is None else self.theory.to_json(),
        }
        if self.recommended is not None:
            out["recommended"] = self.recommended.to_json()
        out["disagreements"] = list(self.disagreements)
        return out

    @property
    def theory_b_crit(self) -> float | None:
        return None if self.theory is None else self.theory.b_crit


@dataclass(frozen=True)
class Invariance:
    """The slope of log N_fail on log B and its equivalence verdict."""

    slope: float | None = None
    low: float | None = None
    high: float | None = None
    n: int = 0
    verdict: str = ""
    margin: float | None = None
    note: str | None = None  # runs left out of the slope, when any

    def to_json(self) -> dict:
        out = {"slope": self.slope, "low": self.low, "high": self.high, "n": self.n,
               "verdict": self.verdict}
        if self.note is not None:
            out["note"] = self.note
        out["margin"] = self.margin
        return out


@dataclass(frozen=True)
class ClipRow:
    """One (clip range, batch size) of the clipping table: median clocks over its runs."""

    clip_low: float | None = None
    clip_high: float | None = None
    batch_samples: float | None = None
    n_runs: int = 0
    progress_median: float | None = None
    failure_median: float | None = None

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Analysis:
    """One sweep's analysis: both clocks per run and per batch size, B_crit, invariance."""

    sweep: str
    metric: str
    target: Target
    runs: list[RunRow]
    batches: list[BatchRow]
    critical: Critical
    invariance: Invariance
    options: AnalysisOptions = field(default_factory=AnalysisOptions)
    units: str | None = None  # what the clocks count, in words
    clipping: list[ClipRow] | None = None  # None: one clip range only
    warnings: list[str] = field(default_factory=list)
    analysis_id: int | None = None  # its row in the analyses table (None: not stored)
    stability: dict | None = None  # clocks.stability.Stability.to_json (None: not measured)
    # both clocks in time and cost per batch (None: no run logged time_* and no cost file)
    time: TimeClocks | None = None

    @classmethod
    def from_json(cls, d: dict) -> Analysis:
        """The analysis a JSON document (the analyses table's, `analyze --json`) holds."""
        clipping = d.get("clipping")
        return cls(
            sweep=d.get("sweep", ""),
            metric=d.get("metric", ""),
            target=_take(Target, d.get("target")),
            runs=[RunRow.from_json(r) for r in d.get("runs") or []],
            batches=[BatchRow.from_json(b) for b in d.get("batches") or []],
            critical=Critical.from_json(d.get("critical_batch")),
            invariance=_take(Invariance, d.get("failure_invariance")),
            options=AnalysisOptions.from_json(d.get("options")),
            units=d.get("units"),
            clipping=None if clipping is None else [_take(ClipRow, c) for c in clipping],
            warnings=list(d.get("warnings") or []),
            analysis_id=d.get("analysis_id"),
            stability=d.get("stability"),
            time=TimeClocks.from_json(d.get("time")),
        )

    def to_json(self) -> dict:
        """The JSON document (the `--json` output; stored without its `analysis_id`)."""
        return {
            "sweep": self.sweep,
            "options": self.options.to_json(),
            "metric": self.metric,
            "target": self.target.to_json(),
            "units": self.units,
            "runs": [r.to_json() for r in self.runs],
            "batches": [b.to_json() for b in self.batches],
            "critical_batch": self.critical.to_json(),
            "failure_invariance": self.invariance.to_json(),
            "clipping": None if self.clipping is None else [c.to_json() for c in self.clipping],
            "warnings": list(self.warnings),
            "stability": self.stability,
            "time": None if self.time is None else self.time.to_json(),
            "analysis_id": self.analysis_id,
        }

    def dumps(self) -> str:
        """The document as strict JSON text (`analyze --json`)."""
        return json.dumps(self.to_json(), indent=2, allow_nan=False, default=_jsonable)

    def runs_at(self, batch: float, family_only: bool = True) -> list[RunRow]:
        """The runs analysed at `batch` (only the sweep's main setting unless asked)."""
        return [r for r in self.runs
                if r.batch_samples == batch and (r.in_family or not family_only)]

    def batch(self, batch: float) -> BatchRow | None:
        return next((b for b in self.batches if b.batch_samples == batch), None)

    @property
    def longest_run(self) -> float:
        """The most samples any run logged (the default schedule budget)."""
        return max((r.last_samples or 0) for r in self.runs) if self.runs else 0
