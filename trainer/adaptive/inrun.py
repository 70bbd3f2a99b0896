"""The adaptive controller inside a grpo run: each step's metrics go to it, and a branch-rule
decision trains short branches from an in-memory copy of the run's state
(`trainer.adaptive.snapshot`); the run then continues from the kept branch, the others' samples
charged to its clock.

The loop's own pieces (one training step, an evaluation, the engine's weight sync, the warmed
lr) come in through the `LoopSteps` port, so this module does not import the loop that calls it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from trainer.adaptive import snapshot
from trainer.ports import BranchResult
from trainer.update import Diverged


class LoopSteps(Protocol):
    """What a branch runs with: the calling loop's own steps (`trainer.loop` gives them)."""

    def train_step(self, run, phase, phase_index: int) -> tuple[dict, object]:
        """One training step of `run` in `phase`: (the step's metrics, its batch)."""

    def evaluate(self, engine, reward_fn, held, cfg, tokenizer, seed_step: int) -> float:
        """The held-out accuracy, sampled with `seed_step`'s seed."""

    def sync(self, run) -> None:
        """The rollout engine takes the run's current weights."""

    def warmed(self, run, phase):
        """`phase` at the lr warm-up's value for the run's position."""


@dataclass
class InRunBranch:
    """One in-run branch: its end state (None: it diverged), its steps' rows (step, samples,
    values) and what it spent."""

    end: snapshot.Snapshot | None
    rows: list
    samples: int


def initial(run, values: dict) -> None:
    """Hand the step-0 evaluation to the controller: the live drop rule starts from the same
    first point as the analysis's (no decision can come of one point)."""
    if run.ctl is not None:
        run.ctl.observe(0, 0, values)


def adapt(run, values: dict, branches: dict, steps: LoopSteps):
    """Feed the step to the adaptive controller (its decision's metrics join `values`).
    `values` carries the step's evaluation when one is due (the loop evaluates first), so the
    failure guard's live drop rule sees every evaluation at the step it is measured. A
    branch-rule decision runs its branches here (`brancher`); they land in `branches`, and the
    run is left as it was, for this step's row, until `adopt`."""
    if run.ctl is None:
        return None
    values.update(run.ctl.mode_metrics())
    runner = brancher(run, branches, steps) if run.ctl.cfg.rule == "branch" else None
    decision = run.ctl.observe(run.step, run.samples, values, runner)
    if decision is not None:
        values.update(decision.metrics())
    return decision


def brancher(run, out: dict, steps: LoopSteps):
    """The branch runner of a rule-"branch" decision after this step: each batch continues a
    copy of the run's state for the same samples, from the same data position and random
    streams, at the controller's lr for that batch. Its gain is the held-out accuracy after it
    minus before, both sampled with one seed (this step's evaluation seed), so the branches
    are compared on the same draws. None when the budget cannot pay for every branch."""
    def run_branches(tried: list[int], each: int):
        cfg = run.cfg
        if run.samples + len(tried) * each > cfg.sample_budget:
            return None
        seed_step = run.step
        acc0 = steps.evaluate(run.engine, run.reward_fn, run.held, cfg, run.tok, seed_step)
        start = snapshot.take(run)
        results = []
        for prompts in tried:
            snapshot.put(run, start)
            steps.sync(run)
            phase = cfg.phase_at(run.samples)[1].model_copy(update={
                "prompts_per_batch": prompts, "lr": run.ctl.lr_at(prompts),
                "until_samples": None})
            phase = steps.warmed(run, phase)
            for group in run.opt.param_groups:
                group["lr"] = phase.lr
            rows = []
            try:
                while run.samples - start.samples < each:
                    values, _ = steps.train_step(run, phase, run.ctl.decisions + 1)
                    rows.append((run.step, run.samples, values))
            except Diverged:
                # a diverged branch loses the decision and is charged its whole allowance
                out[prompts] = InRunBranch(None, [], each)
                results.append(BranchResult(prompts, float(each), math.nan, math.nan))
                continue
            acc = steps.evaluate(run.engine, run.reward_fn, run.held, cfg, run.tok, seed_step)
            rows[-1][2].update(eval_accuracy=acc, eval_n=len(run.held))
            out[prompts] = InRunBranch(snapshot.take(run), rows, run.samples - start.samples)
            results.append(BranchResult(prompts, float(each), acc - acc0,
                                        float(rows[-1][2][run.ctl.cfg.drift_key])))
        snapshot.put(run, start)
        steps.sync(run)
        if all(b.end is None for b in out.values()):
            raise Diverged(f"every branch diverged ({', '.join(map(str, tried))} prompts)")
        return results

    return run_branches


def adopt(run, branches: dict, chosen: int, steps: LoopSteps) -> None:
    """Continue from the chosen batch's branch, logging its steps as the run's rows; every
    other branch's samples are charged to the run's clock first, as if spent before it. A
    decision that chose a batch no branch ran (the failure guard's jump) continues from the
    decision's state with every branch's samples charged."""
    spent = sum(b.samples for b in branches.values())
    kept = branches.get(chosen)
    if kept is None or kept.end is None:
        run.samples += spent
        return
    charged = spent - kept.samples
    snapshot.put(run, kept.end)
    steps.sync(run)
    run.samples += charged
    for step, samples, values in kept.rows:
        values.update(run.ctl.mode_metrics())
        run.log(step, samples + charged, values)
    run.flush()
