"""Every knob of the analysis, documented once; `--json` output carries all of them."""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields

from twoclocks_cli.core.codec import Document
from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.core.limits import INT32_MAX

SMOOTHING = ("ma", "ema", "none")
MAX_BOOTSTRAP = 20_000  # replicates: beyond this the intervals stop moving, the time does not


def cli(text: str, *, default=MISSING) -> dict:
    """A field's metadata making it a `twoclocks analyze` option: its --help text, and the
    command's default where it differs from a library caller's (`cli_default`)."""
    return {"help": text} if default is MISSING else {"help": text, "cli_default": default}


@dataclass
class AnalysisOptions(Document):
    """Options of `twoclocks analyze` (defaults from the two-clocks note)."""

    metric: str | None = field(default=None, metadata=cli(
        "Progress metric (default: eval_accuracy when logged, else reward_mean)."))
    target: str = field(default="frac:0.5", metadata=cli(
        "Target: a value, or frac:X of the way from the initial value to the sweep's best."))
    smoothing: str = field(default="ma", metadata=cli("ma (centred moving average), ema, none."))
    window: int = field(default=5, metadata=cli("Moving-average window (logged points)."))
    span_samples: float | None = field(default=None, metadata=cli(
        "Moving average over this many samples instead of --window points."))
    ema_alpha: float = field(default=0.3, metadata=cli("EMA weight of the newest point."))
    drop: bool = field(default=True, metadata=cli("The drop collapse rule."))
    drop_rho: float = field(default=0.3, metadata=cli(
        "drop: fraction of the gain that may be lost."))  # the gain made so far
    drop_delta: float = field(default=0.05, metadata=cli("drop: minimum fall, metric units."))
    drop_k: int = field(default=3, metadata=cli(
        "drop: consecutive points below the floor."))  # logged points
    # dips: a fall (drop rule) that later climbs back above peak - dip_recover x its allowance
    # is a dip, counted apart; only a fall that never recovers within the run is a collapse (the
    # failure clock). Off: every fall is a collapse. dip_recover 0 asks for the full pre-fall
    # peak, 1 only for the floor the fall crossed
    dips: bool = field(default=True, metadata=cli(
        "A fall that climbs back later in the run is a dip, counted apart from collapses "
        "(--no-dips: every fall is a collapse)."))
    dip_recover: float = field(default=0.5, metadata=cli(
        "dips: back above peak - this x the fall's allowance counts as recovered (0: the "
        "full peak, 1: the floor)."))
    # held-out drop: the drop rule (same rho, delta, k, smoothing) on a second metric, for a
    # failure that shows where progress does not (held-out accuracy falling while the training
    # reward, the progress metric, rises: memorisation). None: off
    drop_metric: str | None = field(default=None, metadata=cli(
        "held-out drop rule: the drop rule also on this metric (e.g. eval_accuracy while "
        "--metric is the training reward): a failure where the progress metric still rises. "
        "Default: off."))
    drift_key: str = field(default="drift_abs", metadata=cli(
        "drift rule metric."))  # drift_abs, drift_rel, kl_init
    drift_threshold: float | None = field(default=None, metadata=cli(
        "drift rule threshold D (default: rule off)."))  # fires at >= this
    entropy_key: str = "entropy"  # entropy rule's metric
    entropy_low: float | None = field(default=None, metadata=cli(
        "entropy rule: band low edge."))  # None: open
    entropy_high: float | None = field(default=None, metadata=cli(
        "entropy rule: band high edge."))  # None: open
    length_max: float | None = field(default=None, metadata=cli(
        "length rule: resp_len_mean bound."))  # None: off
    truncated_max: float | None = field(default=None, metadata=cli(
        "length rule: truncated_frac bound."))  # None: off
    noise_ema: float = 0.05  # EMA weight for the gradient-noise terms
    bootstrap: int = field(default=1000, metadata=cli(
        "Bootstrap replicates."))  # for every interval
    seed: int = field(default=0, metadata=cli(
        "Bootstrap RNG seed."))  # results are reproducible
    theory: bool = field(default=True, metadata=cli(
        "Theory B_crit for sim sweeps."))  # a short simulation
    # slope equivalence margin: |slope - 0| or |slope - 1| within
    invariance_margin: float = field(default=0.25, metadata=cli(
        "Equivalence margin on the failure-clock slope (0: per sample)."))
    # seed resamples of the whole decision (clocks.stability): how settled B_crit, the collapses
    # and the schedule are. 0: not measured (library callers); `analyze` asks for 200
    stability: int = field(default=0, metadata=cli(
        "Seed resamples of the whole decision (B_crit, collapses, schedule): how settled it is "
        "(0: not measured).", default=200))

    def __post_init__(self):
        for f in fields(self):  # a stored or hand-made option set passes the CLI's bounds too
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"--{f.name.replace('_', '-')} {value}: must be a finite number")
        self._check_rules()
        if self.smoothing not in SMOOTHING:
            raise ConfigError(f"--smoothing {self.smoothing!r}: allowed are {', '.join(SMOOTHING)}")
        if self.window < 1:
            raise ConfigError(f"--window {self.window}: must be >= 1")
        if not 0 < self.ema_alpha <= 1:
            raise ConfigError(f"--ema-alpha {self.ema_alpha}: must be in (0, 1]")
        if self.span_samples is not None and not (0 < self.span_samples < float("inf")):
            raise ConfigError(f"--span-samples {self.span_samples}: must be a positive number")
        if not 0 < self.invariance_margin < 0.5:
            raise ConfigError(f"--invariance-margin {self.invariance_margin}: must be in (0, 0.5)")
        if not 0 <= self.dip_recover <= 1:
            raise ConfigError(f"--dip-recover {self.dip_recover}: must be in [0, 1]")
        if self.drop_k < 1:
            raise ConfigError(f"--drop-k {self.drop_k}: must be >= 1")
        if not 0 <= self.stability <= 100_000:
            raise ConfigError(f"--stability {self.stability}: must be between 0 and 100,000")
        if not 1 <= self.bootstrap <= MAX_BOOTSTRAP:
            raise ConfigError(f"--bootstrap {self.bootstrap}: must be between 1 and "
                              f"{MAX_BOOTSTRAP:,} (each replicate refits every batch)")
        if not 0 <= self.seed <= INT32_MAX:
            raise ConfigError(f"--seed {self.seed}: must be between 0 and {INT32_MAX:,}")
        if not 1 <= self.window <= INT32_MAX:
            raise ConfigError(f"--window {self.window}: must be between 1 and {INT32_MAX:,}")
        parse_target(self.target)

    def _check_rules(self) -> None:
        """The collapse rules' thresholds: shares in [0, 1], bounds > 0, a band low <= high."""
        if not 0 <= self.drop_rho <= 1:
            raise ConfigError(f"--drop-rho {self.drop_rho}: must be in [0, 1]")
        if self.drop_delta < 0:
            raise ConfigError(f"--drop-delta {self.drop_delta}: must be >= 0")
        for name in ("drift_threshold", "length_max"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} {value}: must be > 0")
        if self.truncated_max is not None and not 0 <= self.truncated_max <= 1:
            raise ConfigError(f"--truncated-max {self.truncated_max}: must be in [0, 1]")
        low, high = self.entropy_low, self.entropy_high
        if low is not None and high is not None and low > high:
            raise ConfigError(f"--entropy-low {low} > --entropy-high {high}: the band's low "
                              "edge must not exceed its high edge")


def parse_target(spec: str) -> tuple[str, float]:
    """('abs', value) or ('frac', x) from '0.6' or 'frac:0.5'."""
    text = str(spec).strip()
    try:
        if text.startswith("frac:"):
            x = float(text[5:])
            if not 0 < x <= 1:
                raise ValueError
            return "frac", x
        value = float(text)
        if not math.isfinite(value):
            raise ValueError
        return "abs", value
    except ValueError:
        raise ConfigError(
            f"--target {spec!r}: give a finite number (absolute) or frac:X with 0 < X <= 1"
        ) from None
