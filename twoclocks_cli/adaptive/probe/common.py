"""What every probe shares: the lr rule the branches follow and the checks of its arguments."""

from __future__ import annotations

import math

from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.core.limits import MAX_SIM_ROW_STEPS

MAX_SEEDS = 64
MAX_BATCHES = 64  # batch sizes one probe branches over


def rule_exponent(rule) -> float:
    """The exponent of a sweep's scaling rule (sqrt 0.5, linear 1, none/constant 0, a number)."""
    alpha = {"sqrt": 0.5, "linear": 1.0, "none": 0.0, "constant": 0.0}.get(rule)
    if alpha is None:
        try:
            alpha = float(rule)
        except (TypeError, ValueError):
            alpha = 0.5
    return alpha


def scaling(run, sweep) -> tuple[float, float, float]:
    """(reference batch, reference lr, exponent) of the run's lr rule: the run's own (batch, lr)
    with the exponent of its sweep's scaling rule (sqrt for a run outside a sweep). The run's
    lr is the rule's at its batch, so scaling from it is the sweep's rule itself."""
    cfg = ((sweep.config if sweep is not None else None) or {}).get("scaling") or {}
    return float(run.batch_samples), float(run.lr), rule_exponent(cfg.get("rule", "sqrt"))


def check_branches(batches: list[float], branch_samples: float, seeds: int) -> None:
    """The branch grid: two distinct batches or more, a budget of two largest batches, seeds."""
    if len(set(batches)) < 2 or any(not (math.isfinite(b) and b >= 1) for b in batches):
        raise ConfigError(f"--batches {','.join(f'{b:g}' for b in batches)}: at least two "
                          "distinct batch sizes (samples, >= 1)")
    if not (math.isfinite(branch_samples) and branch_samples >= 2 * max(batches)):
        raise ConfigError(f"--branch-samples {branch_samples:g}: must be finite and at least "
                          f"twice the largest batch ({2 * max(batches):g})")
    if not 1 <= seeds <= MAX_SEEDS:
        raise ConfigError(f"--seeds {seeds}: must be in 1..{MAX_SEEDS}")
    if len(batches) > MAX_BATCHES:
        raise ConfigError(f"--batches: {len(batches):,} batch sizes; at most {MAX_BATCHES}")
    # every branch steps until the smallest batch has spent the budget (one vectorised loop)
    work = len(batches) * seeds * branch_samples / min(batches)
    if work > MAX_SIM_ROW_STEPS:
        raise ConfigError(f"--branch-samples {branch_samples:g}: {len(batches) * seeds} branches "
                          f"x {branch_samples / min(batches):,.0f} steps at batch "
                          f"{min(batches):g} = {work:.3g} steps; at most {MAX_SIM_ROW_STEPS:.0e}"
                          ": lower --branch-samples or --seeds, or raise the smallest batch")
