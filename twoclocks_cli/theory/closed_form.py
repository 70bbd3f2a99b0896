"""Closed-form predictions of the local quadratic model (see the two-clocks note).

`c = lr0 / (sigma * sqrt(B0))` is the idealised noise-normalised step per sample under the sqrt
rule; `x = c * B * h` is one step's contraction of a direction with curvature h.
"""

from __future__ import annotations

import numpy as np

SCALING_RULES = {"sqrt": 0.5, "linear": 1.0, "constant": 0.0}


def scaled_lr(lr0: float, b0: float, batch, alpha: float = 0.5):
    """lr(B) = lr0 * (B/B0)**alpha (alpha 0.5 sqrt, 1 linear, 0 constant)."""
    return lr0 * (np.asarray(batch, float) / b0) ** alpha


def step_constant(lr0: float, sigma: float, b0: float) -> float:
    """c = lr0 / (sigma sqrt(B0)): per-sample step of the idealised normaliser under sqrt."""
    return lr0 / (sigma * np.sqrt(b0))


def first_order_drift_per_sample(c: float, h) -> np.ndarray:
    """Mean contraction per sample, c*h: the same for every B (all the sqrt rule preserves)."""
    return c * np.asarray(h, float)


def curvature_penalty_per_sample(c: float, h, theta, batch) -> np.ndarray:
    """One-step curvature loss per sample, c^2 h^3 theta^2 B / 2: grows linearly with B."""
    h = np.asarray(h, float)
    return c**2 * h**3 * np.asarray(theta, float) ** 2 * np.asarray(batch, float) / 2


def curvature_critical_batch(c: float, h) -> np.ndarray:
    """B = 2/(c h): where the curvature penalty equals the first-order gain (lr-dependent)."""
    return 2.0 / (c * np.asarray(h, float))


def stationary_floor(c: float, sigma: float, h, batch) -> np.ndarray:
    """Per-direction stationary loss c sigma^2 / (2 (2 - x)); inf where x = cBh >= 2 (diverges)."""
    x = c * np.asarray(batch, float) * np.asarray(h, float)
    with np.errstate(divide="ignore"):
        return np.where(x < 2, c * sigma**2 / (2 * (2 - x)), np.inf)


def expected_loss(c: float, sigma: float, h, theta0, batch: float, samples: float) -> float:
    """Expected loss after `samples` samples at batch B from the exact mean/variance recurrences."""
    h = np.asarray(h, float)
    theta0 = np.broadcast_to(np.asarray(theta0, float), h.shape)
    steps = np.floor(samples / batch)
    r = 1 - c * batch * h
    mean = r**steps * theta0
    with np.errstate(divide="ignore", invalid="ignore"):
        geo = np.where(np.isclose(r**2, 1), steps, (1 - r ** (2 * steps)) / (1 - r**2))
    var = c**2 * batch * sigma**2 * geo
    return float(0.5 * np.sum(h * (mean**2 + var)))


def failure_exponent(optimizer: str, alpha: float) -> float:
    """d log N_fail / d log B of noise-driven drift: 1-2a (adam, normalized), 2-2a (sgd).

    0 means invariant per sample, 1 invariant per step.
    """
    return (2.0 if optimizer == "sgd" else 1.0) - 2.0 * alpha


def drift_rate_per_sample(optimizer: str, lr, batch, sigma: float) -> np.ndarray:
    """Variance per sample per flat direction: lr^2/B (normalised steps), lr^2 s^2/B^2 (sgd)."""
    lr = np.asarray(lr, float)
    batch = np.asarray(batch, float)
    if optimizer == "sgd":
        return lr**2 * sigma**2 / batch**2
    return lr**2 / batch


def failure_clock(
    optimizer: str,
    lr,
    batch,
    sigma: float,
    flat_dims: int,
    threshold: float,
    offset_sq: float = 0.0,
) -> np.ndarray:
    """N_fail = (D^2 - offset^2) / (d_flat * rate): samples until flat-direction drift crosses D.

    `offset_sq` is the squared distance the curved directions travel (to the optimum, ||theta0||^2).
    """
    rate = drift_rate_per_sample(optimizer, lr, batch, sigma) * max(flat_dims, 0)
    room = max(threshold**2 - offset_sq, 0.0)
    with np.errstate(divide="ignore"):
        return np.where(rate > 0, room / rate, np.inf)
