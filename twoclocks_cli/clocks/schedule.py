"""The schedule rule, evidence first: the plan the objective's clock prefers, ended before a
single run is likely to fail.

The decision itself is `clocks.plan` (its docstring states the model and the tie rule); this
module reads an analysis into per-batch clocks, writes the chosen plan as phases the trainer
runs, and says why in lines whose every number is one printed beside it.

- B_small, the switch and B_large minimise the objective's clock to the target (samples,
  seconds or cost) over the plans the data support; under `samples` B_small is the batch that
  reached the target in the fewest samples, or a larger one within `plan.TOL` of it.
- The failure bound of a batch is per run: the lower prediction bound of its seeds' failure
  clocks (`plan.failure_bound`), the safety factor applied to the whole clock from the start of
  training, one phase or two. A bound on one failed seed with no spread to borrow gets s^2.
- The large phase's lr: B_large's own lr in the sweep (`large_lr = "sweep"`, the scaling rule),
  or B_small's (`"hold"`). On the tiny main job a policy trained at B_small broke at once under
  B_large's sqrt-scaled lr and did not under B_small's (docs/benchmarks.md). With "hold" the
  switch comes only after the target (the large phase's progress at that lr is not measured),
  and B_large's failure bound from its sweep runs bounds it (a smaller lr drifts no faster).
Every predicted number is a number or "unknown" with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from twoclocks_cli.clocks import plan as planner
from twoclocks_cli.clocks.cost import OBJECTIVES, TimeClocks
from twoclocks_cli.clocks.result import Analysis, BatchRow
from twoclocks_cli.core.codec import Document
from twoclocks_cli.core.errors import AnalysisError


@dataclass
class Predicted:
    """A predicted clock: a number, or None with the reason it is unknown."""

    samples: float | None
    why: str

    def text(self) -> str:
        return f"{self.samples:,.0f} samples ({self.why})" if self.samples is not None else (
            f"unknown: {self.why}"
        )


@dataclass
class Schedule(Document):
    """The recommended phases and how they follow from the analysis."""

    sweep: str
    b_crit: float | None
    b_crit_text: str
    b_crit_source: str | None
    b_small: float
    b_large: float
    n_switch: float | None
    stop_before_samples: float | None
    safety: float
    budget: float
    large_lr: str
    phases: list[dict]
    predicted: dict
    rationale: list[str] = field(default_factory=list)
    objective: str = "samples"  # the clock the whole plan minimises: samples | time | cost
    # per objective, the plan it would choose (batch = its B_small, b_large, n_switch, end) and
    # that plan's samples, seconds and cost to the target (the objectives the data can price)
    objectives: dict = field(default_factory=dict)


def _setting(analysis: Analysis, batch: float) -> dict:
    """lr, prompts and clip of the analysed runs at `batch`."""
    r = analysis.runs_at(batch)[0]
    return {
        "prompts_per_batch": r.batch_prompts,
        "lr": r.lr,
        "clip_eps_low": r.clip_low,
        "clip_eps_high": r.clip_high,
        "group_size": r.group_size,
    }


def _grid(a: Analysis) -> tuple[dict[float, BatchRow], list[float], list[float]]:
    """(batches by size, the grid, the batches that reached the target); refuses what cannot
    be scheduled: no batch, one batch, none reached the target."""
    by = {b.batch_samples: b for b in a.batches if b.n_runs > 0}
    if not by:
        raise AnalysisError(f"sweep {a.sweep!r}: no analysed batch sizes")
    grid = sorted(by)
    if len(grid) < 2:
        raise AnalysisError(
            f"sweep {a.sweep!r}: one batch size (B={grid[0]:g}): no fit possible, "
            "E(B) cannot be compared across batches: cannot schedule"
        )
    reached = [b for b in grid if by[b].progress.median is not None]
    if not reached:
        raise AnalysisError(
            f"sweep {a.sweep!r}: no batch size reached the target (every progress "
            "clock is censored): nothing to schedule; `twoclocks suggest` proposes the cells "
            "that would answer (a longer budget or other batches)"
        )
    return by, grid, reached


LARGE_LR = ("sweep", "hold")


def batch_clocks(a: Analysis, by: dict[float, BatchRow], reached: list[float],
                 time: TimeClocks | None) -> list[planner.BatchClocks]:
    """What the decision reads of each batch that reached the target: its median progress
    clock, the per-run failure bound (spread pooled over every batch), its price per sample."""
    failed = {b: [r.failure.samples for r in a.runs_at(b)
                  if r.analysed and r.failure.samples is not None] for b in by}
    spread, dof = planner.pooled_log_spread({b: f for b, f in failed.items() if f})
    out = []
    for b in reached:
        bound, basis, one = (planner.failure_bound(failed[b], spread, dof) if failed[b]
                             else (None, "no seed failed", False))
        reach = min((r.failure.censored_at for r in a.runs_at(b)
                     if r.analysed and r.failure.censored_at is not None), default=None)
        tb = time.at(b) if time is not None else None
        sps = tb.throughput.seconds_per_sample if tb is not None else None
        price = time.price_per_hour if time is not None else None
        out.append(planner.BatchClocks(
            batch=b, progress=by[b].progress.median, fail=bound, fail_basis=basis,
            one_seed=one, seconds_per_sample=sps,
            cost_per_sample=None if sps is None or price is None else sps * price / 3600,
            reach=reach if not failed[b] else None))
    return out


def make_schedule(a: Analysis, budget: float | None = None, safety: float = 0.8,
                  large_lr: str = "sweep", objective: str = "samples",
                  time: TimeClocks | None = None) -> dict:
    """The recommended phases of an analysed sweep (a JSON-ready dict; see `Schedule`).

    `objective` names the clock the whole plan minimises to the target: samples, or time or
    cost under `time` (default: the analysis's own, measured from its runs)."""
    _check_choices(objective, safety, large_lr)
    by, grid, reached = _grid(a)
    time = time if time is not None else a.time
    if budget is None:
        budget = a.longest_run
    clocks = batch_clocks(a, by, reached, time)
    plans = planner.candidates(clocks, safety, budget, after_target=large_lr == "hold")
    best = {obj: planner.choose(plans, obj) for obj in OBJECTIVES}
    chosen = best[objective]
    if chosen is None:
        if objective != "samples" and all(c.seconds_per_sample is None for c in clocks) \
                or objective == "cost" and (time is None or time.price_per_hour is None):
            raise AnalysisError(_no_objective(a.sweep, objective, time))
        chosen = _fallback(clocks, safety, budget, objective)
    chosen = planner.rounded(chosen)
    rec = a.critical.recommended
    at = {c.batch: c for c in clocks}
    rationale = [f"B_crit {rec.text()} samples ({rec.source or 'none'}: {rec.why})"]
    rationale += [rec.minimum_text()] if rec.minimum_text() else []
    rationale += [
        f"grid = {[f'{b:g}' for b in grid]}; reached the target: {[f'{b:g}' for b in reached]}",
        "median samples to the target: " + "; ".join(
            f"{c.batch:g}: {c.progress:,.0f}" for c in clocks),
        f"B_small = {chosen.b_small:g}: " + _why_small(chosen, plans, objective, at),
    ]
    rationale += [f"disagreement: {line}" for line in a.critical.disagreements]
    rationale += _failure_lines(chosen, at, safety)
    phases = _phases(a, chosen, large_lr, rationale)
    rationale += _objective_lines(best, objective)
    prog = _predicted_progress(chosen, at)
    fail = _predicted_failure(by, chosen)
    return Schedule(
        sweep=a.sweep,
        b_crit=rec.b_crit,
        b_crit_text=rec.text(),
        b_crit_source=rec.source,
        b_small=chosen.b_small,
        b_large=chosen.b_large,
        n_switch=chosen.n_switch,
        stop_before_samples=chosen.end if chosen.stopped else None,
        safety=chosen.safety,
        budget=budget,
        large_lr=large_lr,
        phases=phases,
        predicted={
            "progress_samples": prog.samples,
            "progress_why": prog.why,
            "failure_samples": fail.samples,
            "failure_why": fail.why,
        },
        rationale=rationale,
        objective=objective,
        objectives={k: _priced(p) for k, p in best.items() if p is not None},
    ).to_json()


def _fallback(clocks, safety, budget, objective) -> planner.Plan:
    """No plan reaches the target before its failure bound: the one phase that gets closest
    (the least progress beyond its end), said so in its rationale by `_failure_lines`."""
    ones = [planner.one_phase(c, safety, budget) for c in clocks]
    return min(ones, key=lambda p: (p.progress / p.end, p.value(objective) or 0))


def _check_choices(objective: str, safety: float, large_lr: str) -> None:
    """The schedule's options, refused in one line each before anything is computed."""
    if objective not in OBJECTIVES:
        raise AnalysisError(f"--objective {objective!r}: must be one of {', '.join(OBJECTIVES)}")
    if not 0 < safety <= 1:
        raise AnalysisError(f"--safety {safety}: must be in (0, 1]")
    if large_lr not in LARGE_LR:
        raise AnalysisError(f"--large-lr {large_lr!r}: must be one of {', '.join(LARGE_LR)}")


_UNIT = {"samples": "samples", "time": "hours", "cost": "cost"}


def _fmt(value: float | None, objective: str) -> str:
    if value is None:
        return "unknown"
    if objective == "samples":
        return f"{value:,.0f} samples"
    if objective == "time":
        return f"{value / 3600:.3g} h"
    return f"cost {value:.4g}"


def _why_small(chosen: planner.Plan, plans, objective: str, at: dict) -> str:
    """Why this B_small: the fewest (or least) to the target, or within TOL of the plan that
    is, with both numbers."""
    fastest = planner.fastest(plans, objective)
    v = chosen.value(objective)
    what = {"samples": "the fewest samples", "time": "the least time",
            "cost": "the least cost"}[objective]
    via = "" if chosen.n_switch is None or chosen.n_switch >= at[chosen.b_small].progress else (
        f" (switching to {chosen.b_large:g} at {chosen.n_switch:,.0f} before the target)")
    if fastest is None or fastest.value(objective) >= v or fastest.b_small == chosen.b_small:
        return f"{what} to the target ({_fmt(v, objective)}{via})"
    f = fastest.value(objective)
    return (f"{_fmt(v, objective)} to the target{via}, within {planner.TOL:.0%} of {what} "
            f"({_fmt(f, objective)} at B={fastest.b_small:g}, {v / f:.2f}x): the data cannot "
            f"tell them apart, and the larger batch takes fewer steps")


def _failure_lines(chosen: planner.Plan, at: dict, safety: float) -> list[str]:
    """The failure bounds the plan's end rests on, and whether it reaches the target in time."""
    small = at[chosen.b_small]
    lines = []
    for c in {small.batch: small, chosen.b_large: at[chosen.b_large]}.values():
        if c.fail is not None:
            lines.append(f"failure bound of B={c.batch:g} (a single run): {c.fail_basis}"
                         + ("; stricter safety s^2" if c.one_seed else ""))
        elif c.batch != small.batch or chosen.n_switch is None:
            reach = f" within {c.reach:,.0f} samples" if c.reach is not None else ""
            lines.append(f"B={c.batch:g}: no seed failed{reach}")
    if not planner.feasible(chosen):
        lines.append(f"no plan reaches the target before its failure bound: B={small.batch:g} "
                     f"needs {chosen.progress:,.0f} samples and ends at {chosen.end:,.0f}")
    return lines


def _phases(a: Analysis, p: planner.Plan, large_lr: str, rationale: list[str]) -> list[dict]:
    """The phase list of plan `p`, with the lines that say where each phase ends and why."""
    small = _setting(a, p.b_small)
    s = f"{p.safety:.3g}"
    if p.n_switch is None:
        c_end = f"{p.end:,.0f}"
        if p.stopped:
            rationale.append(f"one phase, which ends at {s} x the failure bound of "
                             f"B={p.b_small:g} = {c_end} samples (keep that checkpoint: "
                             "training on fails)")
        else:
            rationale.append(f"one phase to the budget {c_end} samples: no failure bound of "
                             f"B={p.b_small:g} before it")
        return [{"until_samples": p.end, **_phase_keys(small)}]
    large = _phase_keys(_setting(a, p.b_large))
    rationale.append(
        f"switch to B_large = {p.b_large:g} at N_switch = {p.n_switch:,.0f} samples: it fails "
        f"later than B={p.b_small:g}, and the end is latest when the switch comes "
        + ("once B_small's median run reached the target" if p.n_switch >= p.progress
           else "where the objective is least"))
    if large_lr == "hold":
        rationale.append(
            f"large phase lr = B_small's {small['lr']:.4g} (--large-lr hold; B={p.b_large:g} "
            f"ran at {large['lr']:.4g} in the sweep): its failure bound is B={p.b_large:g}'s "
            "at that larger lr (a smaller lr drifts no faster)")
        large["lr"] = small["lr"]
    how = (f"where the failure fraction reaches {s}: N_switch / F({p.b_small:g}) + the rest / "
           f"F({p.b_large:g}), counted from the start of training")
    rationale.append(f"the large phase ends at {p.end:,.0f} samples: "
                     + (how if p.stopped else "the budget, before its failure bound"))
    return [{"until_samples": p.n_switch, **_phase_keys(small)},
            {"until_samples": p.end, **large}]


def _priced(p: planner.Plan) -> dict:
    """A plan in every clock: its batches, switch, end and what it spends to the target."""
    return {"batch": p.b_small, "b_large": p.b_large, "n_switch": p.n_switch, "end": p.end,
            "samples": p.progress, "seconds": p.seconds, "cost": p.cost}


def _objective_lines(best: dict, chosen: str) -> list[str]:
    """What each objective's plan is and what it costs in the other clocks, against the chosen
    objective's plan ("time: 2,048 from the start, 1.9x the samples, 0.6x the hours")."""
    priced = {k: p for k, p in best.items() if p is not None and (k == "samples" or
                                                                  p.value(k) is not None)}
    if len(priced) < 2:
        return []
    ref = priced[chosen]
    out = [f"objective {chosen}: the plan with the least {_UNIT[chosen]} to the target"]
    for obj, p in priced.items():
        shape = f"B={p.b_small:g}" + (f" -> {p.b_large:g} at {p.n_switch:,.0f}"
                                      if p.n_switch is not None else "")
        parts = [shape]
        for key in ("samples", "time", "cost"):
            v, r = p.value(key), ref.value(key)
            if v is not None and r:
                parts.append(f"{v / r:.2f}x the {_UNIT[key]}")
        parts.append(_spent_text(p))
        out.append(f"{obj} would pick " + ", ".join(parts))
    return out


def _spent_text(p: planner.Plan) -> str:
    """'10,240 samples, 1.3 h, cost 3.2' to the target: what is known of it."""
    bits = [f"{p.progress:,.0f} samples",
            f"{p.seconds / 3600:.3g} h" if p.seconds is not None else None,
            f"cost {p.cost:.4g}" if p.cost is not None else None]
    return "to the target: " + ", ".join(b for b in bits if b)


def _no_objective(sweep: str, objective: str, time: TimeClocks | None) -> str:
    """Why `objective` cannot be scheduled, with what would make it possible."""
    if time is None:
        return (f"--objective {objective}: sweep {sweep!r} has no throughput (no run logged "
                "time_gen_s/time_reward_s/time_update_s): give --cost FILE with the seconds per "
                "step")
    if objective == "cost" and time.price_per_hour is None:
        return ("--objective cost: no price: give --cost FILE with price_per_hour (and its "
                "timings, or only the price to price the measured throughput)")
    return (f"--objective {objective}: no timed batch of sweep {sweep!r} reached the target")


def _phase_keys(setting: dict) -> dict:
    return {k: setting[k] for k in ("prompts_per_batch", "lr", "clip_eps_low", "clip_eps_high")}


def _predicted_progress(p: planner.Plan, at: dict) -> Predicted:
    small = at[p.b_small]
    if p.n_switch is not None and p.n_switch < small.progress:
        return Predicted(p.progress, f"B={p.b_small:g} to {p.n_switch:,.0f} samples, the rest "
                         f"of the way at B={p.b_large:g}'s rate (the clock fraction)")
    return Predicted(small.progress, f"the median progress clock of B={p.b_small:g}, reached "
                     "in phase 0")


def _predicted_failure(by: dict[float, BatchRow], p: planner.Plan) -> Predicted:
    """Where the median run fails: the failure fraction reaches 1 on median clocks."""
    fs = by[p.b_small].failure.median
    if by[p.b_small].n_failed == 0:
        return Predicted(None, f"no run at B={p.b_small:g} failed within the budget")
    if fs is None:
        return Predicted(None, f"the median run at B={p.b_small:g} did not fail (censored)")
    if p.n_switch is None:
        return Predicted(fs, f"the median failure clock of B={p.b_small:g} (no switch)")
    fl = by[p.b_large].failure.median
    if fl is None:
        return Predicted(None, f"B={p.b_large:g} did not fail within the budget: later than the "
                         "data reach")
    return Predicted(p.n_switch + (1 - p.n_switch / fs) * fl,
                     f"N_switch + the failure fraction left at the switch spent at "
                     f"B={p.b_large:g}'s median rate")


def to_toml(schedule: dict) -> str:
    """The phase list as TOML ([[phases]] tables), with the rationale as comments."""
    from twoclocks_cli.core.toml import dumps

    header = [f"twoclocks schedule for sweep {schedule['sweep']!r}"] + list(schedule["rationale"])
    phases = []
    for ph in schedule["phases"]:
        ph = {k: v for k, v in ph.items() if v is not None}
        if isinstance(ph.get("until_samples"), float):
            ph["until_samples"] = int(round(ph["until_samples"]))
        phases.append(ph)
    return dumps({"phases": phases}, header=header)
