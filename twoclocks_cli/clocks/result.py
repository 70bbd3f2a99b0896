"""The analysis, typed: what `analyze_sweep` returns and what schedule, report, suggest, compare,
the plots, the adaptive calibration and the store's deletes read.

An `Analysis` becomes JSON once, `Analysis.to_json` (the analyses table, `analyze --json`), and a
stored document becomes an `Analysis` once, `Analysis.from_json` (`clocks.saved` loads it). Both
are the project's one codec (`core.codec.Document`, pydantic's), from the dataclasses' fields:
the fields are in the document's order, and the few places where the document's shape differs
from the fields' (a row of an unanalysed run, the failure clock's counts nested under `failure`,
the theory's own document) say so in a serializer beside the class. A key the document lacks
takes its field's default, one it has that no field names is ignored. This module is the only
place that knows the document's keys; everyone else reads attributes.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Annotated

import numpy as np
from pydantic import (
    Field,
    field_serializer,
    field_validator,
    model_serializer,
    model_validator,
)

from twoclocks_cli.clocks.cost import TimeClocks
from twoclocks_cli.clocks.critical import Estimate
from twoclocks_cli.clocks.options import AnalysisOptions
from twoclocks_cli.clocks.runclock import Clock
from twoclocks_cli.clocks.stats import Aggregate
from twoclocks_cli.core.codec import Document
from twoclocks_cli.core.numbers import Number


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
class Target(Document):
    """The progress target: its spec (`frac:0.5`, `abs:0.3`) and the value it resolved to."""

    spec: str | None = None
    value: Number | None = None
    initial: Number | None = None  # median smoothed metric at the first point
    best: Number | None = None  # best smoothed metric of the sweep


# the row of a run without a finite value of the metric: its identity and status, then its
# empty clocks, in this order
_UNANALYSED = ("run_id", "name", "batch_samples", "batch_prompts", "group_size", "lr",
               "clip_low", "clip_high", "seed", "status", "partial", "in_family", "points",
               "last_samples", "progress", "failure", "noise_scale", "sign_noise_scale",
               "started_above")


@dataclass
class RunRow(Document):
    """One run of the analysis: its cell, status and both clocks (`runclock.RunClocks`)."""

    run_id: int | None = None
    name: str | None = None
    batch_samples: Number | None = None
    batch_prompts: int | None = None
    group_size: int | None = None
    lr: Number | None = None
    clip_low: Number | None = None
    clip_high: Number | None = None
    seed: int | None = None
    status: str | None = None
    partial: bool = False
    in_family: bool = True  # analysed with the sweep's main setting
    points: int = 0
    first_samples: Number | None = None
    last_samples: Number | None = None
    initial: Number | None = None
    final: Number | None = None
    best: Number | None = None
    progress: Clock = field(default_factory=Clock)
    failure: Clock = field(default_factory=Clock)
    started_above: bool = False
    noise_scale: Number | None = None
    sign_noise_scale: Number | None = None

    @property
    def analysed(self) -> bool:
        """Whether the run had finite values of the metric (else its clocks are empty)."""
        return self.points > 0

    @model_serializer(mode="wrap")
    def _row(self, handler) -> dict:
        out = handler(self)
        return out if self.analysed else {k: out[k] for k in _UNANALYSED}


# the failure clock's counts, written inside the document's `failure` object
_FAILURE_COUNTS = ("n_failed", "n_dips", "runs_with_dips", "drift_at_failure")


@dataclass
class BatchRow(Document):
    """Both clocks at one batch size, aggregated over its seeds."""

    batch_samples: Number
    batch_prompts: list = field(default_factory=list)
    lr: list = field(default_factory=list)
    n_runs: int = 0
    partial: bool = False
    progress: Aggregate = field(default_factory=Aggregate)
    failure: Aggregate = field(default_factory=Aggregate)
    n_failed: int = 0  # seeds whose failure clock fired
    n_dips: int = 0  # falls that recovered, over every seed (not failures)
    runs_with_dips: int = 0
    # the drift logged at each failed seed's failure: median and interval over those seeds
    # (equal across batches if a drift threshold sets the failure clock)
    drift_at_failure: Aggregate = field(default_factory=Aggregate)

    @model_serializer(mode="wrap")
    def _nest(self, handler) -> dict:
        out = handler(self)
        out["failure"].update((k, out.pop(k)) for k in _FAILURE_COUNTS)
        return out

    @model_validator(mode="before")
    @classmethod
    def _unnest(cls, d):
        if isinstance(d, dict):
            fail = d.get("failure") or {}
            d = {**d, **{k: fail[k] for k in _FAILURE_COUNTS if k in fail}}
        return d


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
                   seeds=chosen.seeds, why=why, e_min_at=chosen.e_min_at,
                   slower=list(chosen.slower), low_bound=chosen.low_bound)

    @model_serializer(mode="plain")
    def _kept(self) -> dict:
        out = {"b_crit": self.b_crit, "low": self.low, "high": self.high, "bound": self.bound,
               "source": self.source, "placement": self.placement}
        if self.low_bound:
            out["low_bound"] = True
        if self.source is not None:
            out.update(e_min=self.e_min, seeds=self.seeds)
        if self.e_min_at is not None:
            out.update(e_min_at=self.e_min_at, slower=self.slower)
        out["why"] = self.why
        return out


@dataclass(frozen=True)
class NoiseSummary(Document):
    """A gradient-noise scale over runs (median, range) and what it was measured on."""

    value: Number | None = None
    low: Number | None = None
    high: Number | None = None
    n_runs: int = 0
    note: str = ""

    @model_serializer(mode="wrap")
    def _range(self, handler) -> dict:
        out = handler(self)
        if self.value is None:  # no range without a value
            del out["low"], out["high"]
        return out


@dataclass(frozen=True)
class Theory(Document):
    """The theory model's B_crit for a sim sweep (or at a probe's branch point).

    The prediction is the theory module's own document (`theory.predict_critical_batch`; which
    keys it has depends on the branch that answered): it is kept whole in `doc` and written back
    as it came; the attributes are what twoclocks reads of it."""

    b_crit: Number | None = None
    method: str | None = None
    mechanism: str | None = None
    note: str | None = None
    doc: dict = field(default_factory=dict, repr=False)

    @model_serializer(mode="plain")
    def _doc(self) -> dict:
        return dict(self.doc)

    @model_validator(mode="before")
    @classmethod
    def _read(cls, d):
        if isinstance(d, dict):
            d = {**{k: d.get(k) for k in ("b_crit", "method", "mechanism", "note")},
                 "doc": dict(d)}
        return d


@dataclass(kw_only=True)
class Critical(Document):
    """Every B_crit estimate side by side, the recommended one and the disagreements."""

    empirical: Estimate = field(default_factory=lambda: Estimate("empirical"))
    power: Estimate = field(default_factory=lambda: Estimate("power"))
    mccandlish: Estimate = field(default_factory=lambda: Estimate("mccandlish"))
    noise_scale: NoiseSummary = field(default_factory=NoiseSummary)
    sign_noise_scale: NoiseSummary = field(default_factory=NoiseSummary)
    theory: Theory | None = None
    recommended: Recommended = field(default_factory=Recommended)
    disagreements: list[str] = field(default_factory=list)

    @field_serializer("noise_scale", mode="wrap")
    def _b_simple(self, value: NoiseSummary, handler) -> dict:
        return {**handler(value), "b_simple": value.value}  # the noise scale's other name

    @property
    def theory_b_crit(self) -> float | None:
        return None if self.theory is None else self.theory.b_crit


@dataclass(frozen=True)
class Invariance(Document):
    """The slope of log N_fail on log B and its equivalence verdict."""

    slope: Number | None = None
    low: Number | None = None
    high: Number | None = None
    n: int = 0
    verdict: str = ""
    note: str | None = None  # runs left out of the slope, when any
    margin: Number | None = None

    @model_serializer(mode="wrap")
    def _noted(self, handler) -> dict:
        out = handler(self)
        if self.note is None:
            del out["note"]
        return out


@dataclass(frozen=True)
class ClipRow(Document):
    """One (clip range, batch size) of the clipping table: median clocks over its runs."""

    clip_low: Number | None = None
    clip_high: Number | None = None
    batch_samples: Number | None = None
    n_runs: int = 0
    progress_median: Number | None = None
    failure_median: Number | None = None


@dataclass(kw_only=True)
class Analysis(Document):
    """One sweep's analysis: both clocks per run and per batch size, B_crit, invariance."""

    sweep: str = ""
    options: AnalysisOptions = field(default_factory=AnalysisOptions)
    metric: str = ""
    target: Target = field(default_factory=Target)
    units: str | None = None  # what the clocks count, in words
    runs: list[RunRow] = field(default_factory=list)
    batches: list[BatchRow] = field(default_factory=list)
    critical: Annotated[Critical, Field(alias="critical_batch")] = field(default_factory=Critical)
    invariance: Annotated[Invariance, Field(alias="failure_invariance")] = field(
        default_factory=Invariance)
    clipping: list[ClipRow] | None = None  # None: one clip range only
    warnings: list[str] = field(default_factory=list)
    stability: dict | None = None  # clocks.stability.Stability.to_json (None: not measured)
    # both clocks in time and cost per batch (None: no run logged time_* and no cost file)
    time: TimeClocks | None = None
    analysis_id: int | None = None  # its row in the analyses table (None: not stored)

    @field_validator("time", mode="before")
    @classmethod
    def _time_in(cls, value):
        return value or None  # an empty document: no time clocks

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
