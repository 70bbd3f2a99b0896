"""`twoclocks probe` on a sim run: branches of the theory model from the run's replayed state.

Built for runs of the `sim` backend: the state at `at` is rebuilt by replaying the run's own cell
(the backend is deterministic given its seed) and progress is the model's noise-free progress;
every branch runs here, in this process (seconds). From that state every batch in `batches`
branches `seeds` times for up to `branch_samples` samples; the gain target is half the median
gain the best batch makes in the branch budget; each branch's clock is the samples it needs to
reach it; B_crit solves E(B_crit) = 2 E_min with the model-free estimator `analyze` uses
(`clocks.critical.empirical`). `truth` adds the theory's own local B_crit from the same state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from pydantic import field_serializer

from twoclocks_cli.adaptive.probe.common import check_branches, scaling
from twoclocks_cli.clocks.critical import Estimate
from twoclocks_cli.clocks.result import Theory
from twoclocks_cli.core.codec import Document
from twoclocks_cli.core.errors import AnalysisError, ConfigError


@dataclass
class ProbeResult(Document):
    """The branches' clocks per batch, the local B_crit and (sim) the theory's local B_crit."""

    run_id: int
    at_samples: float
    progress_at: float  # the model's noise-free progress at the branch point
    target: float  # the progress every branch is timed to
    batches: list[float]
    lrs: list[float]
    clocks: dict  # batch -> [samples since the branch point, None = censored]
    b_crit: Estimate
    truth: Theory | None = None  # theory.predict_critical_batch from the same state and target
    notes: list[str] = field(default_factory=list)

    @field_serializer("clocks")
    def _clocks_out(self, clocks: dict) -> dict:
        return {f"{b:g}": v for b, v in clocks.items()}


def state_at(run, at: float):
    """(ModelConfig, cap, the run's one-row SimState after its last step within `at` samples)."""
    from twoclocks_cli.backends.sim import phase_at, phases_of
    from twoclocks_cli.theory.model import ModelConfig
    from twoclocks_cli.theory.simulate import SimState

    cell = run.config or {}
    cfg = ModelConfig.from_dict(cell.get("sim"), where=f"run {run.id} sim")
    phases = phases_of(cell)
    state = SimState.start(cfg, 1, int(cell.get("seed") or 0))
    cap = None
    while True:  # the backend's own step sequence (same calls, so the same noise draws)
        ph = phases[phase_at(phases, float(state.samples[0]))]
        if state.samples[0] + ph.batch > at:
            break
        cap = cfg.cap_for(ph.clip_eps_low, ph.clip_eps_high)
        state.step(ph.batch, ph.lr, cap)
    if cap is None:
        ph = phases[0]
        cap = cfg.cap_for(ph.clip_eps_low, ph.clip_eps_high)
    return cfg, cap, state


def probe_run(store, run_id: int, at: float, batches: list[float], branch_samples: float,
              seeds: int = 3, seed: int = 0, truth: bool = False, bootstrap: int = 400
              ) -> ProbeResult:
    """Branch run `run_id` at `at` samples over `batches`; see the module docstring."""
    from twoclocks_cli.clocks import critical
    from twoclocks_cli.theory.closed_form import scaled_lr
    from twoclocks_cli.theory.sweep import simulate_sweep

    run = store.get_run(run_id)
    _check(run, at, batches, branch_samples, seeds)
    b0, lr0, alpha = scaling(run, run.sweep)
    cfg, cap, start = state_at(run, at)
    loss = 0.5 * np.sum(cfg.h * start.theta**2, axis=1)
    p_at = float(start.progress(loss)[0])
    bs = np.asarray(sorted(batches), float)
    lrs = scaled_lr(lr0, b0, bs, alpha)
    # the branches, each to the full branch budget: their progress fixes the gain target
    free = simulate_sweep(cfg, bs, lrs, seeds, branch_samples, 2.0, cap=cap, seed=seed,
                          start=start)
    best = max(float(np.median(free.final_progress[free.batch == b])) for b in bs)
    if best <= p_at + 1e-6:
        raise AnalysisError(f"run {run_id} at {at:g} samples: no branch made progress within "
                            f"{branch_samples:g} samples (progress {p_at:.4g}); probe earlier or "
                            "with a longer --branch-samples")
    target = p_at + 0.5 * (best - p_at)
    timed = simulate_sweep(cfg, bs, lrs, seeds, branch_samples, target, cap=cap, seed=seed,
                           stop_at_target=True, start=start)
    clocks = {float(b): [None if math.isnan(v) else float(v)
                         for v in timed.n_prog[timed.batch == b]] for b in bs}
    per_batch = {b: v for b, v in clocks.items() if any(x is not None for x in v)}
    est = critical.empirical(per_batch, np.random.default_rng(seed), bootstrap)
    notes = [f"lr(B) = {lr0:.4g} x (B/{b0:g})^{alpha:g} (the sweep's scaling rule)",
             f"gain target: progress {p_at:.4g} -> {target:.4g} (half the best batch's median "
             f"gain in {branch_samples:g} samples)"]
    result = ProbeResult(run_id=run_id, at_samples=float(start.samples[0]), progress_at=p_at,
                         target=target, batches=[float(b) for b in bs],
                         lrs=[float(x) for x in lrs], clocks=clocks, b_crit=est,
                         notes=notes)
    if truth:
        from twoclocks_cli.theory.critical import predict_critical_batch

        result.truth = Theory.from_json(
            predict_critical_batch(cfg, lr0, b0, target, alpha, cap, start=start))
    return result


def _check(run, at, batches, branch_samples, seeds) -> None:
    """One line for each thing a probe cannot do with these arguments."""
    if run.backend != "sim":
        raise ConfigError(f"run {run.id} is a {run.backend} run, not a sim run")
    if not run.batch_samples or not run.lr:
        raise ConfigError(f"run {run.id}: no batch size or lr recorded: nothing to scale from")
    if not (math.isfinite(at) and at >= 0):
        raise ConfigError(f"--at {at}: must be a finite number of samples >= 0")
    budget = (run.config or {}).get("sample_budget")
    if budget is not None and at > float(budget):
        raise ConfigError(f"--at {at:g}: beyond the run's sample budget {float(budget):g}")
    check_branches(batches, branch_samples, seeds)
