"""The theory's critical batch size, computed by simulation (never assumed).

With a per-step cap (clipping) the McCandlish limits exist: E_min = samples-to-target as B -> 0
(simulated at B = 1, many seeds) and S_min = steps-to-target as B -> inf (simulated at a batch so
large that noise vanishes and the cap binds every step); B_crit = E_min / S_min. Without a cap
S_min does not exist under sqrt scaling (the step grows with B), so B_crit is the batch at which
samples-to-target doubles, E(B_crit) = 2 E_min, read off a dense log grid of batch sizes.
"""

from __future__ import annotations

import numpy as np

from twoclocks_cli.theory.closed_form import scaled_lr
from twoclocks_cli.theory.model import ModelConfig
from twoclocks_cli.theory.sweep import simulate_sweep

HUGE_BATCH = 1e10  # "B -> inf": per-coordinate noise sigma/sqrt(B) = 1e-5 sigma


def predict_critical_batch(
    cfg: ModelConfig,
    lr0: float,
    b0: float,
    target: float,
    alpha: float = 0.5,
    cap: float | None = None,
    seeds: int = 32,
    max_samples: float = 2e6,
    seed: int = 12345,
) -> dict:
    """B_crit of the model for this optimizer, lr rule, target progress and cap (a dict)."""
    small = simulate_sweep(
        cfg,
        [1.0],
        [scaled_lr(lr0, b0, 1.0, alpha)],
        seeds,
        max_samples,
        target,
        cap=cap,
        seed=seed,
        stop_at_target=True,
    )
    if np.isnan(small.n_prog).any():
        return {
            "b_crit": None,
            "e_min": None,
            "s_min": None,
            "mechanism": "target not reached",
            "method": "simulation",
        }
    e_min = float(np.median(small.n_prog))
    if cap is not None:
        big = simulate_sweep(
            cfg,
            [HUGE_BATCH],
            [scaled_lr(lr0, b0, HUGE_BATCH, alpha)],
            2,
            HUGE_BATCH * 1e5,
            target,
            cap=cap,
            seed=seed,
            stop_at_target=True,
        )
        s_min = float(np.median(big.n_prog)) / HUGE_BATCH
        return {
            "b_crit": e_min / s_min,
            "e_min": e_min,
            "s_min": s_min,
            "mechanism": "step cap (clipping) limits steps",
            "method": "E_min/S_min limits",
        }
    grid = np.geomspace(1, 4096, 13)
    res = simulate_sweep(
        cfg,
        grid,
        scaled_lr(lr0, b0, grid, alpha),
        max(seeds // 4, 4),
        max_samples,
        target,
        seed=seed,
        stop_at_target=True,
    )
    batches, med = res.median_by_batch("n_prog")
    for i in range(1, len(batches)):
        if np.isnan(med[i]):
            return {
                "b_crit": float(batches[i - 1]),
                "e_min": e_min,
                "s_min": None,
                "mechanism": "curvature wall (target never reached above this batch)",
                "method": "dense grid",
            }
        if med[i] >= 2 * e_min:
            lo, hi = np.log(med[i - 1]), np.log(med[i])
            frac = (np.log(2 * e_min) - lo) / max(hi - lo, 1e-12)
            b = np.exp(np.log(batches[i - 1]) + frac * np.log(batches[i] / batches[i - 1]))
            return {
                "b_crit": float(b),
                "e_min": e_min,
                "s_min": None,
                "mechanism": "gradient noise scale (Adam)",
                "method": "E(B)=2E_min, dense grid",
            }
    return {
        "b_crit": None,
        "e_min": e_min,
        "s_min": None,
        "mechanism": "no doubling up to B=4096",
        "method": "dense grid",
    }
