"""The local quadratic model's parameters: one dataclass, every field documented once."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from functools import cached_property

import numpy as np

from twoclocks_cli.errors import ConfigError

OPTIMIZERS = ("adam", "sgd", "normalized")


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
        for name in (
            "dim",
            "flat_dims",
            "eval_samples",
            "eval_every",
            "log_every",
            "checkpoint_every",
        ):
            low = 0 if name in ("flat_dims", "dim") else 1
            if int(getattr(self, name)) < low:
                raise ConfigError(f"sim.{name} = {getattr(self, name)!r}: must be >= {low}")
        if not (0 < self.h_min <= self.h_max):
            raise ConfigError(
                f"sim.h_min/h_max = {self.h_min}/{self.h_max}: need 0 < h_min <= h_max"
            )
        if self.sigma <= 0:
            raise ConfigError(f"sim.sigma = {self.sigma}: must be > 0")
        if not (0 < self.micro_fraction < 1):
            raise ConfigError(f"sim.micro_fraction = {self.micro_fraction}: must be in (0, 1)")
        if self.dim + self.flat_dims < 1:
            raise ConfigError("sim.dim + sim.flat_dims must be >= 1")

    @classmethod
    def from_dict(cls, data: dict | None, where: str = "sim") -> ModelConfig:
        """Build from a config table, naming any unknown key and the allowed ones."""
        data = dict(data or {})
        allowed = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ConfigError(
                f"{where}: unknown key(s) {', '.join(unknown)}; "
                f"allowed: {', '.join(sorted(allowed))}"
            )
        for f in fields(cls):
            if f.name in data:
                data[f.name] = _coerce(f.name, data[f.name], f.default, where)
        return cls(**data)

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


def _coerce(name: str, value, default, where: str):
    """The value as its field's type (int, float, str; None allowed where the default is None)."""
    if value is None and default is None:
        return None
    kind = float if default is None else type(default)
    try:
        if kind is int:
            if isinstance(value, bool) or float(value) != int(float(value)):
                raise ValueError
            return int(float(value))
        if kind is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if not isinstance(value, str):
            raise ValueError
        return value
    except (TypeError, ValueError):
        raise ConfigError(
            f"{where}.{name} = {value!r}: expected {'a number' if kind is not str else 'a string'}"
            + (" (an integer)" if kind is int else "")
        ) from None
