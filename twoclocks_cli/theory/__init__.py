"""The local quadratic model of the two-clocks note: closed forms and a vectorised simulator."""

from twoclocks_cli.theory.closed_form import (
    SCALING_RULES,
    curvature_critical_batch,
    curvature_penalty_per_sample,
    expected_loss,
    failure_clock,
    failure_exponent,
    first_order_drift_per_sample,
    scaled_lr,
    stationary_floor,
    step_constant,
)
from twoclocks_cli.theory.critical import predict_critical_batch
from twoclocks_cli.theory.model import ModelConfig
from twoclocks_cli.theory.simulate import SimState
from twoclocks_cli.theory.sweep import SweepResult, simulate_sweep

__all__ = [
    "SCALING_RULES",
    "ModelConfig",
    "SimState",
    "SweepResult",
    "curvature_critical_batch",
    "curvature_penalty_per_sample",
    "expected_loss",
    "failure_clock",
    "failure_exponent",
    "first_order_drift_per_sample",
    "predict_critical_batch",
    "scaled_lr",
    "simulate_sweep",
    "stationary_floor",
    "step_constant",
]
