"""The local quadratic model's parameters: one dataclass, every field documented once."""

from __future__ import annotations

import difflib
import math
from dataclasses import asdict, dataclass, fields
from functools import cached_property

import numpy as np

from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.core.limits import INT32_MAX

OPTIMIZERS = ("adam", "sgd", "normalized")
MAX_DIMS = 10_000_000  # dim + flat_dims: the state is a few float64 arrays of this length
_FLOATS = ("h_min", "h_max", "theta0", "sigma", "collapse_samples", "beta1", "beta2", "adam_eps",
           "cap", "cap_per_clip", "micro_fraction")


@dataclass(frozen=True)
class ModelConfig:
    """Loss 1/2 sum_i h_i theta_i^2 plus flat directions; per-sample gradient noise sigma."""

    dim: int = 32  # curved directions (h_i > 0)
    h_min: float = 0.1  # smallest curvature; the spectrum is log-spaced from h_min to h_max
    h_max: float = 1.0  # largest curvature
    theta0: float = 1.0  # initial |theta_i| of every curved direction (sign random per seed)
    sigma: float = 1.0  # per-sample gradient noise std per coordinate (batch: sigma/sqrt(B))
    flat_dims: int = 256  # directions with h = 0: pure noise, the drift that ends runs
    drift_threshold: float = 6.5  # collapse once ||theta - theta0||_2 crosses this (inf: never)
    collapse_samples: float = 4000.0  # after collapse the progress metric decays with this e-fold
    optimizer: str = "adam"  # adam (bias-corrected, as torch), sgd, normalized (/ sigma/sqrt(B))
    beta1: float = 0.9  # Adam first-moment decay
    beta2: float = 0.999  # Adam second-moment decay
    adam_eps: float = 1e-8  # Adam epsilon
    cap: float | None = None  # per-step displacement cap on ||delta theta||_2 (None: no cap)
    cap_per_clip: float | None = None  # cap = cap_per_clip * (clip_eps_low + clip_eps_high) / 2
    eval_samples: int = 512  # held-out "problems" per eval point (eval_accuracy is a binomial mean)
    eval_every: int = 1  # eval every this many logged points (sparse evals blur large-B clocks)
    log_every: int = 1  # write metrics every this many steps
    checkpoint_every: int = 200  # save the state every this many steps (resume point)
    micro_fraction: float = 0.25  # micro-batch size / batch size for the gradient-noise terms

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(
                f"sim.optimizer = {self.optimizer!r}: allowed are {', '.join(OPTIMIZERS)}"
            )
        for name in ("dim", "flat_dims", "eval_samples", "eval_every", "log_every",
                     "checkpoint_every"):
            low = 0 if name in ("flat_dims", "dim") else 1
            value = int(getattr(self, name))
            if not low <= value <= INT32_MAX:
                raise ConfigError(f"sim.{name} = {getattr(self, name)!r}: must be >= {low} and "
                                  f"<= {INT32_MAX}")
        for name in _FLOATS:
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ConfigError(f"sim.{name} = {value!r}: must be a finite number")
        if not (0 < self.h_min <= self.h_max):
            raise ConfigError(
                f"sim.h_min/h_max = {self.h_min}/{self.h_max}: need 0 < h_min <= h_max"
            )
        for name in ("sigma", "theta0", "collapse_samples", "adam_eps", "cap", "cap_per_clip"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"sim.{name} = {value!r}: must be > 0")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"sim.{name} = {getattr(self, name)!r}: must be in [0, 1)")
        if math.isnan(self.drift_threshold) or self.drift_threshold <= 0:
            raise ConfigError(f"sim.drift_threshold = {self.drift_threshold!r}: must be > 0 "
                              "(inf: never collapse)")
        if not (0 < self.micro_fraction < 1):
            raise ConfigError(f"sim.micro_fraction = {self.micro_fraction}: must be in (0, 1)")
        if self.dim + self.flat_dims < 1:
            raise ConfigError("sim.dim + sim.flat_dims must be >= 1")
        if self.dim + self.flat_dims > MAX_DIMS:
            raise ConfigError(f"sim.dim + sim.flat_dims = {self.dim + self.flat_dims}: at most "
                              f"{MAX_DIMS:,} (the state is held in memory)")

    @classmethod
    def check_keys(cls, keys, where: str = "sim") -> None:
        """Raise ConfigError naming the first key that is not a field (with a did-you-mean)."""
        allowed = sorted(f.name for f in fields(cls))
        unknown = sorted(str(k) for k in keys if k not in allowed)
        if unknown:
            hint = difflib.get_close_matches(unknown[0], allowed, n=1, cutoff=0.6)
            near = f": did you mean '{where}.{hint[0]}'?" if hint else ""
            raise ConfigError(f"unknown key '{where}.{unknown[0]}'{near} (allowed in {where}: "
                              f"{', '.join(allowed)})")

    @classmethod
    def from_dict(cls, data: dict | None, where: str = "sim", strict: bool = False) -> ModelConfig:
        """Build from a config table, naming any unknown key and the allowed ones.

        strict: values must already have their field's type (a sweep config's TOML values);
        otherwise strings are parsed (`twoclocks theory --set key=value`).
        """
        data = dict(data or {})
        cls.check_keys(data, where)
        for f in fields(cls):
            if f.name in data:
                data[f.name] = _coerce(f.name, data[f.name], f.default, where, strict)
        try:
            return cls(**data)
        except ConfigError as err:
            if where == "sim":
                raise
            raise ConfigError(str(err).replace("sim.", f"{where}.")) from None

    def to_dict(self) -> dict:
        return asdict(self)

    @cached_property
    def h(self) -> np.ndarray:
        """Curvatures of the curved directions followed by zeros for the flat ones."""
        curved = np.geomspace(self.h_min, self.h_max, self.dim) if self.dim else np.zeros(0)
        return np.concatenate([curved, np.zeros(self.flat_dims)])

    @cached_property
    def loss0(self) -> float:
        """The initial loss 1/2 sum h theta0^2 (the progress metric's zero)."""
        return 0.5 * float(np.sum(self.h)) * self.theta0**2

    def cap_for(self, clip_low: float | None, clip_high: float | None) -> float | None:
        """The displacement cap of a cell: `cap` if set, else from its clip range, else none."""
        if self.cap is not None:
            return float(self.cap)
        if self.cap_per_clip is not None and clip_low is not None and clip_high is not None:
            return float(self.cap_per_clip) * (float(clip_low) + float(clip_high)) / 2
        return None


def _coerce(name: str, value, default, where: str, strict: bool = False):
    """The value as its field's type (int, float, str; None allowed where the default is None).

    Not strict: numbers may be given as strings. Strict: only the type itself (an int for a
    float field too); never a bool for a number.
    """
    if value is None and default is None:
        return None
    kind = float if default is None else type(default)
    try:
        if isinstance(value, bool) or (strict and kind is not str and isinstance(value, str)):
            raise ValueError
        if kind is int:
            if strict and not isinstance(value, int):
                raise ValueError
            number = float(value) if not isinstance(value, int) else value
            if not isinstance(number, int) and (not math.isfinite(number)
                                                or number != int(number)):
                raise ValueError
            return int(number)
        if kind is float:
            return float(value)
        if not isinstance(value, str):
            raise ValueError
        return value
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(
            f"{where}.{name} = {value!r}: expected {'a number' if kind is not str else 'a string'}"
            + (" (an integer)" if kind is int else "")
        ) from None
