"""An adaptive (or scheduled) run's batch over samples, and at each controller decision the local
B_crit the controller acted on: what `report --run` draws against the sweep's per-batch clocks.
A room of the adaptive package on the clocks' floor (pure arithmetic over a run's rows; the
renderer reads it).

The local B_crit at a decision is read from the run's own decision metrics:
- rule "noise": kappa x B_noise, the controller's own estimate (`adaptive_kappa`,
  `adaptive_b_noise`);
- rule "branch": from the measured gain ratio r = gain(2B) / gain(B) over equal samples, with
  McCandlish's E(B) = E_min (1 + B/B_crit): r = (1 + x)/(1 + 2x) for x = B/B_crit, so
  B_crit = B (2r - 1)/(1 - r). Defined for 0.5 < r < 1; r >= 1 says B_crit is above what the
  branches can see (no estimate), r <= 0.5 that it is below B (none either).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from twoclocks_cli.core.codec import Document

DECISION_KEYS = ("adaptive_decision", "adaptive_next_prompts", "adaptive_b_noise",
                 "adaptive_kappa", "adaptive_branch_gain_ratio", "adaptive_branch_gain_b",
                 "adaptive_mode", "adaptive_sweep_b_crit")


def b_crit_from_ratio(batch: float, ratio: float) -> float | None:
    """Local B_crit (samples) from 2B's share of B's progress per sample (None: undefined)."""
    if not (math.isfinite(ratio) and 0.5 < ratio < 1.0):
        return None
    return batch * (2.0 * ratio - 1.0) / (1.0 - ratio)


@dataclass
class Decision:
    """One decision: where, the batch before and after (samples), and the local B_crit."""

    step: int
    samples: float
    batch: float
    next_batch: float | None
    mode: str
    local_b_crit: float | None
    how: str  # "kappa x B_noise", "branch gain ratio r", the sweep's B_crit, or why none


@dataclass
class Trajectory(Document):
    """The run's batch at each logged step, and its decisions."""

    run_id: int
    samples: list = field(default_factory=list)
    batch: list = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)



def _by_step(series) -> dict:
    if series is None:
        return {}
    return {int(s): float(v) for s, v in zip(series.steps, series.values, strict=True)}


def trajectory(store, run_id: int) -> Trajectory:
    """The run's batch_samples over samples and its decisions, from its stored metrics."""
    run = store.get_run(run_id)
    group = run.group_size or 1
    batch = store.load_metric([run_id], "batch_samples").get(run_id)
    out = Trajectory(run_id)
    if batch is None:
        return out
    out.samples = [float(x) for x in batch.samples]
    out.batch = [float(x) for x in batch.values]
    cols = {k: _by_step(store.load_metric([run_id], k).get(run_id)) for k in DECISION_KEYS}
    at = {int(s): (x, b) for s, x, b in zip(batch.steps, out.samples, out.batch, strict=True)}
    rule = ((run.config or {}).get("adaptive") or {}).get("rule", "noise")
    for step in sorted(cols["adaptive_decision"]):
        samples, b = at.get(step, (math.nan, math.nan))
        nxt = cols["adaptive_next_prompts"].get(step)
        mode = "guard" if cols["adaptive_mode"].get(step) == 1 else "progress"
        out.decisions.append(Decision(step, samples, b, None if nxt is None else nxt * group,
                                      mode, *_local(cols, step, b, rule)))
    return out


def _local(cols: dict, step: int, batch: float, rule: str) -> tuple[float | None, str]:
    """The local B_crit at a decision and how it was read (`rule`: the run's adaptive.rule)."""
    ratio = cols["adaptive_branch_gain_ratio"].get(step)
    if rule == "guard":
        sweep = cols["adaptive_sweep_b_crit"].get(step)
        if sweep is None:
            return None, "rule guard: no estimate (in the guard, or no sweep B_crit)"
        return sweep, "the sweep's B_crit (rule guard holds the batch below it)"
    if rule == "branch":
        if step not in cols["adaptive_branch_gain_b"]:
            return None, "no branches at this decision (at batch_max, or the guard): no estimate"
        if ratio is None:
            return None, "branch gain at B not positive: no ratio, no estimate"
        est = b_crit_from_ratio(batch, ratio)
        return est, (f"branch gain ratio {ratio:.3g}" if est is not None else
                     f"branch gain ratio {ratio:.3g}: outside (0.5, 1), no estimate")
    noise, kappa = cols["adaptive_b_noise"].get(step), cols["adaptive_kappa"].get(step)
    if noise is not None and kappa is not None and np.isfinite(noise) and noise > 0:
        return kappa * noise, "kappa x B_noise"
    return None, "no estimate logged at this decision"
