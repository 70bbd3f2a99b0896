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
MAX_SMALL_SAMPLES = 5e4  # the B = 1 limit gives up here (target unreachable: no prediction)
MAX_BIG_STEPS = 2e4  # the B -> inf limit gives up after this many steps
WALL_FACTOR = 16  # a grid batch slower than this x E_min counts as "beyond the wall"
PILOT_SEEDS = 16  # seeds of the yardstick's pilot (it runs its whole budget when hopeless)
MAX_GRID_ROW_STEPS = 2e7  # simulated rows x steps the dense grid may take (about a minute)


def _clock(result) -> float | None:
    """Median samples-to-target over seeds; None when the median seed never got there."""
    x = np.where(np.isnan(result.n_prog), np.inf, result.n_prog)
    med = float(np.median(x))
    return med if np.isfinite(med) else None


def predict_critical_batch(
    cfg: ModelConfig,
    lr0: float,
    b0: float,
    target: float,
    alpha: float = 0.5,
    cap: float | None = None,
    seeds: int = 32,
    seed: int = 12345,
    start=None,
) -> dict:
    """B_crit of the model for this optimizer, lr rule, target progress and cap (a dict).

    `start` (a one-row SimState): the *local* B_crit from that state — every simulation branches
    from it and counts samples from the branch point (Merrill et al.'s direct measurement)."""

    def sweep(batches, n_seeds, budget, until_median=False):
        batches = np.asarray(batches, float)
        return simulate_sweep(
            cfg,
            batches,
            scaled_lr(lr0, b0, batches, alpha),
            n_seeds,
            budget,
            target,
            cap=cap,
            seed=seed,
            stop_at_target=True,
            start=start,
            until_median=until_median,
        )

    # the yardstick, most seeds; only its median is used, settled once half of them got there.
    # A pilot of a few seeds first: where even their median never gets there (the noise floor
    # above the target, a diverging lr) the full yardstick would run its whole budget for it
    pilot = _clock(sweep([1.0], PILOT_SEEDS, MAX_SMALL_SAMPLES, until_median=True))
    e_min = None if pilot is None else \
        _clock(sweep([1.0], 4 * seeds, MAX_SMALL_SAMPLES, until_median=True))
    out = {"b_crit": None, "e_min": e_min, "s_min": None}
    if e_min is None:
        return {
            **out,
            "mechanism": f"target not reached at B=1 within {MAX_SMALL_SAMPLES:g} "
            "samples (noise floor above the target?)",
            "method": "simulation",
        }
    if cap is not None:
        return _capped(sweep, out, e_min)
    return _dense_grid(sweep, out, e_min, seeds, cfg.optimizer)


def _capped(sweep, out: dict, e_min: float) -> dict:
    """Under a step cap: B_crit = E_min / S_min, S_min from one huge batch's steps."""
    big = _clock(sweep([HUGE_BATCH], 2, HUGE_BATCH * MAX_BIG_STEPS))
    if big is None:
        return {
            **out,
            "mechanism": "target not reached as B -> inf with this cap",
            "method": "E_min/S_min limits",
        }
    s_min = big / HUGE_BATCH
    return {
        **out,
        "b_crit": e_min / s_min,
        "s_min": s_min,
        "mechanism": "step cap (clipping) limits steps",
        "method": "E_min/S_min limits",
    }


def _dense_grid(sweep, out: dict, e_min: float, seeds: int, optimizer: str) -> dict:
    """Without a cap: the first batch of a dense grid whose samples-to-target reach 2 E_min,
    refined between its neighbours (or the wall where the target stops being reached)."""
    grid = np.geomspace(1, 4096, 13)
    # every row steps until the smallest batch spent the budget, refining 6 batches x seeds too
    work = (grid.size * max(seeds // 4, 4) + 6 * seeds) * WALL_FACTOR * e_min
    if work > MAX_GRID_ROW_STEPS:
        return {**out, "mechanism": f"not simulated: E_min = {e_min:,.0f} samples makes the "
                f"dense grid {work:.2g} steps (at most {MAX_GRID_ROW_STEPS:.0e}); a larger lr0 "
                "or a smaller B0 reaches the target sooner", "method": "dense grid"}
    res = sweep(grid, max(seeds // 4, 4), WALL_FACTOR * e_min)
    batches, med = res.median_by_batch("n_prog")
    for i in range(1, len(batches)):
        if np.isnan(med[i]):
            return {
                **out,
                "b_crit": float(batches[i - 1]),
                "mechanism": f"curvature wall: above this batch samples-to-target exceeds "
                f"{WALL_FACTOR} x E_min (the floor passes the target)",
                "method": "dense grid",
            }
        if med[i] >= 2 * e_min:
            b = _refine(sweep, batches[i - 1], batches[i], e_min, seeds)
            return {
                **out,
                "b_crit": float(b),
                "mechanism": "gradient noise scale (sign-like Adam steps)"
                if optimizer == "adam"
                else f"gradient noise ({optimizer}: progress per sample falls with B)",
                "method": "E(B)=2E_min, dense grid",
            }
    return {**out, "mechanism": "no doubling up to B=4096", "method": "dense grid"}


def _refine(sweep, b_lo: float, b_hi: float, e_min: float, seeds: int) -> float:
    """B where E(B) = 2 E_min inside [b_lo, b_hi], from 6 batches between them at `seeds` seeds
    each (log-log interpolation between the two that bracket it: the coarse grid's straight
    line would misplace it on a convex E(B))."""
    fine = np.geomspace(b_lo, b_hi, 6)
    res = sweep(fine, seeds, WALL_FACTOR * e_min)
    bs, med = res.median_by_batch("n_prog")
    med = np.maximum.accumulate(np.where(np.isnan(med), np.inf, med))
    goal = 2 * e_min
    hit = np.flatnonzero(med >= goal)
    if hit.size == 0:
        return float(bs[-1])
    i = int(hit[0])
    if i == 0:
        return float(bs[0])
    if not np.isfinite(med[i]):
        return float(bs[i - 1])
    lo, hi = np.log(med[i - 1]), np.log(med[i])
    frac = (np.log(goal) - lo) / max(hi - lo, 1e-12)
    return float(np.exp(np.log(bs[i - 1]) + frac * np.log(bs[i] / bs[i - 1])))
