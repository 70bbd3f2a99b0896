"""The sim backend's branch runner for the controller's rule "branch": each batch of a decision
runs on a copy of the theory model's state (`SimState.branch`), and the run continues from the
kept copy.

The same seam as the grpo trainer's (`trainer.adaptive.inrun`): `brancher` gives the
controller's `observe` its callable, (batches, samples each) -> one `trainer.ports.BranchResult`
per batch, and leaves each branch's end state and steps in a dict; `adopt` continues from the
chosen one, every other branch's samples charged to the run's clock. The backend writes the
adopted steps as the run's rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from trainer.ports import BranchResult
from twoclocks_cli.theory.simulate import SimState


@dataclass
class BranchStep:
    """One step of a branch: samples after it (the branch's own count), loss, drift_abs, and
    the noise-free progress before and after it."""

    samples: float
    loss: float
    drift: float
    p_before: float
    p_after: float


@dataclass
class SimBranch:
    """One branch of a decision: its end state, its steps and the samples it spent."""

    end: SimState
    steps: list[BranchStep]
    samples: float


def brancher(state: SimState, ctl, out: dict, *, seed: int, group_size: int, cap,
             norm0: float, budget: float):
    """The branch runner of a decision taken after this step: each batch continues a copy of
    `state` for the same samples with the same noise draws (one seeded stream per decision, so
    B and 2B see the same z, scaled by their batch), lr by the controller's rule; its gain is an
    evaluation of `eval_samples` problems with the same uniform draws for every branch (a
    held-out set scored with one sampler seed). The branches land in `out` (prompts ->
    SimBranch) for `adopt`. The runner returns None when the budget cannot pay for them."""
    index = ctl.decisions + 1

    def run(tried: list[int], each: int):
        if float(state.samples[0]) + len(tried) * each > budget:
            return None
        draws = np.random.default_rng([seed, index, 1]).random(state.cfg.eval_samples)
        acc0 = float(np.mean(draws < scalar_progress(state, scalar_loss(state))))
        results = []
        for prompts in tried:
            br, steps = _branch(state, prompts * group_size, ctl.lr_at(prompts), cap,
                                each, np.random.default_rng([seed, index, 2]))
            drift = steps[-1].drift  # drift_abs after the branch's last step
            if ctl.cfg.drift_key == "drift_rel":
                drift /= norm0
            gain = float(np.mean(draws < scalar_progress(br, scalar_loss(br)))) - acc0
            out[prompts] = SimBranch(br, steps, float(each))
            results.append(BranchResult(prompts, float(each), gain, drift))
        return results

    return run


def _branch(state: SimState, batch: int, lr: float, cap, each: int,
            noise: np.random.Generator) -> tuple[SimState, list[BranchStep]]:
    """A copy of `state` stepped at `batch` and `lr` for `each` samples (whole steps; it stops
    at a non-finite step), the copy's noise seeded from `noise`, with its steps."""
    br = state.branch(1, int(noise.integers(2**62)))
    steps = []
    for _ in range(int(each // batch)):
        p_before = scalar_progress(br, scalar_loss(br))
        info = br.step(batch, lr, cap, grad_terms=False)
        loss = float(info.loss[0])
        steps.append(BranchStep(float(br.samples[0]), loss, float(info.drift[0]), p_before,
                                scalar_progress(br, loss)))
        if info.nonfinite[0]:
            break
    return br, steps


def adopt(branches: dict, chosen: int, state: SimState) -> tuple[SimState, list[BranchStep]]:
    """Continue from the chosen batch's branch (else from `state`, as the guard's jump does),
    with its steps; every other branch's samples are charged to the run's clock first, as if
    spent before the adopted branch."""
    spent = sum(b.samples for b in branches.values())
    if chosen not in branches:
        state.samples += spent
        return state, []
    kept = branches[chosen]
    charged = spent - kept.samples
    kept.end.samples += charged
    for row in kept.steps:
        row.samples += charged
    return kept.end, kept.steps


def scalar_loss(state: SimState) -> float:
    """The loss of a one-row state's only row."""
    th = state.theta[0]
    return float(0.5 * np.dot(state.cfg.h, th * th))


def scalar_progress(state: SimState, loss: float) -> float:
    """Scalar twin of SimState.progress for one row (the per-step hot path)."""
    cfg = state.cfg
    if not math.isfinite(loss):
        return 0.0
    p = min(max(1.0 - loss / cfg.loss0, 0.0), 1.0)
    at = state.collapsed_at[0]
    if at == at:  # collapsed
        p *= math.exp(-max(state.samples[0] - at, 0.0) / cfg.collapse_samples)
    return p
