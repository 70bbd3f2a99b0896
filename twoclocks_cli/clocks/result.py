"""The analysis document, typed: what `schedule`, `report`, `suggest`, `compare` and the plots read.

`analyze_sweep` writes a JSON document (`analyze --json`, the analyses table). Every reader parses
it once here (`Analysis.of`) and then reads attributes, never nested dicts by string keys. Unknown
keys are ignored and missing ones take their defaults, so analyses stored by an older twoclocks
still read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from twoclocks_cli.clocks.critical import Estimate
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


@dataclass(frozen=True)
class Target:
    """The progress target: its spec (`frac:0.5`, `abs:0.3`) and the value it resolved to."""

    value: float | None = None
    spec: str | None = None
    initial: float | None = None  # median smoothed metric at the first point
    best: float | None = None  # best smoothed metric of the sweep


@dataclass
class RunRow:
    """One run of the analysis: its cell, status and both clocks."""

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

    @classmethod
    def from_json(cls, d: dict) -> RunRow:
        return _take(cls, d, progress=_take(Clock, {"samples": None, "censored": True,
                                                    **(d.get("progress") or {})}),
                     failure=_take(Clock, {"samples": None, "censored": True,
                                           **(d.get("failure") or {})}))


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

    @classmethod
    def from_json(cls, d: dict) -> BatchRow:
        fail = d.get("failure") or {}
        return _take(cls, d, progress=_aggregate(d.get("progress")), failure=_aggregate(fail),
                     n_failed=fail.get("n_failed"))


@dataclass
class Recommended(Estimate):
    """The estimate the schedule follows, and the documented rule's reason for it."""

    why: str = ""


@dataclass(frozen=True)
class NoiseSummary:
    """A gradient-noise scale over runs (median, range) and what it was measured on."""

    value: float | None = None
    low: float | None = None
    high: float | None = None
    n_runs: int = 0
    note: str = ""


@dataclass
class Critical:
    """Every B_crit estimate side by side, the recommended one and the disagreements."""

    empirical: Estimate
    power: Estimate
    mccandlish: Estimate
    recommended: Recommended
    noise_scale: NoiseSummary = field(default_factory=NoiseSummary)
    sign_noise_scale: NoiseSummary = field(default_factory=NoiseSummary)
    theory: dict | None = None  # the theory model's prediction (sim sweeps), its own keys
    disagreements: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: dict | None) -> Critical:
        d = d or {}

        def est(name):
            return _take(Estimate, {"source": name, "b_crit": None, **(d.get(name) or {})})

        rec = d.get("recommended") or {}
        return cls(
            empirical=est("empirical"),
            power=est("power"),
            mccandlish=est("mccandlish"),
            recommended=_take(Recommended, {"source": None, "b_crit": None, **rec},
                              seeds=rec.get("seeds") or 0),
            noise_scale=_take(NoiseSummary, d.get("noise_scale")),
            sign_noise_scale=_take(NoiseSummary, d.get("sign_noise_scale")),
            theory=d.get("theory"),
            disagreements=list(d.get("disagreements") or []),
        )

    @property
    def theory_b_crit(self) -> float | None:
        return (self.theory or {}).get("b_crit")


@dataclass(frozen=True)
class Invariance:
    """The slope of log N_fail on log B and its equivalence verdict."""

    slope: float | None = None
    low: float | None = None
    high: float | None = None
    n: int = 0
    verdict: str = ""
    margin: float | None = None
    note: str | None = None


@dataclass
class Analysis:
    """One sweep's analysis, read from its JSON document (`raw` keeps the document itself)."""

    sweep: str
    metric: str
    target: Target
    runs: list[RunRow]
    batches: list[BatchRow]
    critical: Critical
    invariance: Invariance
    options: dict = field(default_factory=dict)
    clipping: list[dict] | None = None
    warnings: list[str] = field(default_factory=list)
    analysis_id: int | None = None
    raw: dict = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, doc: Analysis | dict) -> Analysis:
        """`doc` as an Analysis (an Analysis is returned as it is)."""
        return doc if isinstance(doc, Analysis) else cls.from_json(doc)

    @classmethod
    def from_json(cls, d: dict) -> Analysis:
        return cls(
            sweep=d.get("sweep", ""),
            metric=d.get("metric", ""),
            target=_take(Target, d.get("target")),
            runs=[RunRow.from_json(r) for r in d.get("runs") or []],
            batches=[BatchRow.from_json(b) for b in d.get("batches") or []],
            critical=Critical.from_json(d.get("critical_batch")),
            invariance=_take(Invariance, d.get("failure_invariance")),
            options=dict(d.get("options") or {}),
            clipping=d.get("clipping"),
            warnings=list(d.get("warnings") or []),
            analysis_id=d.get("analysis_id"),
            raw=d,
        )

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
