"""Simulate a batch-size x seed grid in one vectorised loop and read off both clocks per row."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from twoclocks_cli.theory.model import ModelConfig
from twoclocks_cli.theory.simulate import SimState


@dataclass
class SweepResult:
    """Per row (batch x seed): the batch, lr, both clocks in samples (nan = censored)."""

    batch: np.ndarray
    lr: np.ndarray
    seed: np.ndarray
    n_prog: np.ndarray  # samples at which noise-free progress first reaches the target
    n_fail: np.ndarray  # samples at which drift crossed the threshold
    final_progress: np.ndarray
    budget: float
    target: float

    def median_by_batch(self, which: str) -> tuple[np.ndarray, np.ndarray]:
        """Median over seeds of a clock per batch; nan when any seed is censored."""
        values = getattr(self, which)
        batches = np.unique(self.batch)
        med = []
        for b in batches:
            v = values[self.batch == b]
            med.append(np.nan if np.isnan(v).any() else float(np.median(v)))
        return batches, np.array(med)


def _medians_settled(n_prog: np.ndarray, batches: np.ndarray, seeds: int) -> bool:
    """Whether more than half of each batch's rows (batch-major, `seeds` each) have a clock."""
    reached = (~np.isnan(n_prog)).reshape(batches.size, seeds).sum(axis=1)
    return bool(np.all(reached * 2 > seeds))


def simulate_sweep(
    cfg: ModelConfig,
    batches,
    lrs,
    seeds: int,
    budget: float,
    target: float,
    cap=None,
    seed: int = 0,
    stop_at_target: bool = False,
    start: SimState | None = None,
    until_median: bool = False,
) -> SweepResult:
    """Run len(batches) x seeds rows to `budget` samples each (or until all reach `target`).

    `start` (a one-row state): every row branches from it — same parameters, moments and drift
    origin, fresh noise — and clocks and budget count the samples since the branch point.

    `until_median` (with `stop_at_target`): stop once more than half of every batch's rows
    reached the target; each batch's median clock is then settled (a row still going would
    reach it later than all of those), the rest are left censored."""
    batches = np.asarray(batches, float)
    lrs = np.broadcast_to(np.asarray(lrs, float), batches.shape)
    caps = None if cap is None else np.broadcast_to(np.asarray(cap, float), batches.shape)
    b = np.repeat(batches, seeds)
    lr = np.repeat(lrs, seeds)
    cp = None if caps is None else np.repeat(caps, seeds)
    rows = b.size
    state = SimState.start(cfg, rows, seed) if start is None else start.branch(rows, seed)
    offset = state.samples.copy()  # the branch point (0 from a fresh start)
    state.samples = state.samples - offset
    state.collapsed_at = state.collapsed_at - offset  # nan (not collapsed) stays nan
    n_prog = np.full(rows, np.nan)
    prev_p = state.progress(np.full(rows, cfg.loss0) if start is None else
                            0.5 * np.sum(cfg.h * state.theta**2, axis=1))
    prev_s = np.zeros(rows)
    n_steps = int(np.ceil(budget / batches.min()))
    for _ in range(n_steps):
        active = state.samples + b <= budget + 1e-9
        if stop_at_target:
            active &= np.isnan(n_prog)
        if not active.any() or (until_median and _medians_settled(n_prog, batches, seeds)):
            break
        info = state.step(b, lr, cp, active, grad_terms=False)
        p = state.progress(info.loss)
        hit = active & np.isnan(n_prog) & (p >= target)
        if hit.any():
            frac = (target - prev_p[hit]) / np.maximum(p[hit] - prev_p[hit], 1e-12)
            n_prog[hit] = prev_s[hit] + np.clip(frac, 0, 1) * (state.samples[hit] - prev_s[hit])
        prev_p = np.where(active, p, prev_p)
        prev_s = state.samples.copy()
    return SweepResult(
        batch=b,
        lr=lr,
        seed=np.tile(np.arange(seeds), batches.size),
        n_prog=n_prog,
        n_fail=state.collapsed_at.copy(),
        final_progress=prev_p,
        budget=float(budget),
        target=float(target),
    )
