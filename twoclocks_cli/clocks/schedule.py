"""The schedule rule, evidence first: small batch first, switch before the failure clock.

- B_small: the largest grid batch whose progress clock is uncensored and not above the
  recommended B_crit. A lower bound ("E(B) does not grow with B up to B_max") means the largest
  batch that reached the target was the most sample-efficient: it is B_small. A censored batch
  is never picked.
- N_switch = s x the lower confidence bound of N_fail(B_small), which needs >= 2 seeds that
  failed; with one failed seed the switch rests on that seed and the stricter s^2 applies.
- B_large: the larger batch with uncensored progress whose failure clock is latest, and later
  than B_small's; none: one phase, which ends at N_switch when B_small fails.
- The schedule stops where it says: the last phase ends at the failure safety point when a
  failure is predicted (for the large phase: the drift budget left at the switch spent at
  B_large's lower-bound rate, times s), else at the budget.
- The large phase's lr: B_large's own lr in the sweep (`large_lr = "sweep"`, the scaling rule),
  or B_small's (`"hold"`). On the tiny main job a policy trained at B_small broke at once under
  B_large's sqrt-scaled lr and did not under B_small's (docs/benchmarks.md); with "hold" the
  large phase runs at a setting the sweep did not measure, so its failure is not predicted.
Every predicted number is a number or "unknown" with the reason.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from twoclocks_cli.clocks.cost import OBJECTIVES, TimeClocks
from twoclocks_cli.clocks.result import Analysis, BatchRow, Recommended
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
class Schedule:
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
    objective: str = "samples"  # the clock B_small minimises: samples | time | cost
    # per objective, the batch it would pick and that batch's samples, seconds and cost to the
    # target (only the objectives the throughput and price allow)
    objectives: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


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


def _pick_small(rec: Recommended, reached: list[float]) -> tuple[float, str]:
    """B_small from the recommended estimate among the batches that reached the target."""
    if rec.b_crit is None:
        return min(reached), "no B_crit estimate: the smallest batch that reached the target"
    if rec.bound == "lower":
        return max(reached), (
            f"B_crit {rec.text()}: E(B) does not double up to the largest batch, so the "
            "largest batch that reached the target is the most sample-efficient choice"
        )
    below = [x for x in reached if x <= rec.b_crit]
    if below:
        return max(below), (
            f"the largest batch that reached the target and is not above B_crit {rec.text()}"
        )
    return min(reached), (
        f"no batch that reached the target is at or below B_crit {rec.text()}: the "
        "smallest that did"
    )


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


def make_schedule(a: Analysis, budget: float | None = None, safety: float = 0.8,
                  large_lr: str = "sweep", objective: str = "samples",
                  time: TimeClocks | None = None) -> dict:
    """The recommended phases of an analysed sweep (a JSON-ready dict; see `Schedule`).

    `objective` names the clock B_small minimises: samples (B_crit's rule), or time or cost to
    the target under `time` (default: the analysis's own, measured from its runs)."""
    _check_choices(objective, safety, large_lr)
    by, grid, reached = _grid(a)
    rec = a.critical.recommended
    b_small, why_small = _pick_small(rec, reached)
    time = time if time is not None else a.time
    picks = _objective_picks(time, by, reached, b_small, why_small)
    if objective not in picks:
        raise AnalysisError(_no_objective(a.sweep, objective, time))
    b_small, why_small = picks[objective]["batch"], picks[objective]["why"]
    if budget is None:
        budget = a.longest_run
    rationale = [
        f"B_crit {rec.text()} samples ({rec.source or 'none'}: {rec.why})",
        f"grid = {[f'{b:g}' for b in grid]}; reached the target: {[f'{b:g}' for b in reached]}",
        f"B_small = {b_small:g}: {why_small}",
    ]
    rationale += [f"disagreement: {line}" for line in a.critical.disagreements]
    rationale += _objective_lines(picks, objective)
    plan = _phases(a, by, reached, b_small, budget, safety, large_lr, rationale)
    two = len(plan.phases) > 1
    prog = _predicted_progress(by, b_small, plan.n_switch if two else None)
    if two and large_lr == "hold":
        fail = Predicted(None, f"the large phase runs B={plan.b_large:g} at B_small's lr, which "
                         "the sweep did not measure")
    else:
        fail = _predicted_failure(by, b_small, plan.b_large, plan.n_switch, two)
    return Schedule(
        sweep=a.sweep,
        b_crit=rec.b_crit,
        b_crit_text=rec.text(),
        b_crit_source=rec.source,
        b_small=b_small,
        b_large=plan.b_large,
        n_switch=plan.n_switch if two else None,
        stop_before_samples=plan.stop,
        safety=plan.safety,
        budget=budget,
        large_lr=large_lr,
        phases=plan.phases,
        predicted={
            "progress_samples": prog.samples,
            "progress_why": prog.why,
            "failure_samples": fail.samples,
            "failure_why": fail.why,
        },
        rationale=rationale,
        objective=objective,
        objectives={k: {x: v[x] for x in ("batch", "samples", "seconds", "cost")}
                    for k, v in picks.items()},
    ).to_json()


def _check_choices(objective: str, safety: float, large_lr: str) -> None:
    """The schedule's options, refused in one line each before anything is computed."""
    if objective not in OBJECTIVES:
        raise AnalysisError(f"--objective {objective!r}: must be one of {', '.join(OBJECTIVES)}")
    if not 0 < safety <= 1:
        raise AnalysisError(f"--safety {safety}: must be in (0, 1]")
    if large_lr not in LARGE_LR:
        raise AnalysisError(f"--large-lr {large_lr!r}: must be one of {', '.join(LARGE_LR)}")


@dataclass
class _Phases:
    """The schedule's phases and what placed them."""

    phases: list[dict]
    b_large: float
    n_switch: float | None  # the switch point (or where the one phase ends), None: none
    stop: float | None  # where the last phase ends because a failure is predicted there
    safety: float  # the safety factor applied (squared when the bound rests on one seed)


def _phases(a: Analysis, by: dict[float, BatchRow], reached: list[float], b_small: float,
            budget: float, safety: float, large_lr: str, rationale: list[str]) -> _Phases:
    """One phase at B_small, or a switch to a larger batch that fails later at `safety` x
    B_small's failure lower bound; the reasons are appended to `rationale`."""
    lower, one_seed = _failure_lower_bound(by[b_small])
    s = safety * safety if one_seed else safety
    n_switch = s * lower if lower is not None else None

    def fail_key(b):
        f = by[b].failure.median
        return math.inf if f is None else f

    later = [b for b in reached if b > b_small and fail_key(b) > fail_key(b_small)]
    b_large = max(later, key=lambda b: (fail_key(b), b)) if later else b_small
    small = _setting(a, b_small)
    if n_switch is not None and n_switch >= budget:
        rationale.append(
            f"the failure safety point {n_switch:,.0f} samples of B={b_small:g} lies past the "
            f"budget {budget:,.0f}: one phase to the budget")
        n_switch = None
    if n_switch is None:
        if not rationale[-1].startswith("the failure safety point"):
            rationale.append(
                f"no run at B={b_small:g} failed within the budget: one phase, no switch needed")
        return _Phases([{"until_samples": budget, **_phase_keys(small)}], b_large, None, None, s)
    basis = (
        f"the one failed seed's clock {lower:,.0f} (the switch point rests on one seed: "
        f"stricter safety {safety:g}^2 = {s:.3g})"
        if one_seed
        else f"the {int(100 * 0.9)}% lower bound {lower:,.0f} of N_fail at B={b_small:g} "
        f"({by[b_small].n_failed} seeds failed)"
    )
    first = {"until_samples": round(n_switch), **_phase_keys(small)}
    if b_large == b_small:
        rationale.append(
            f"no larger batch that reached the target fails later than B={b_small:g}: one "
            f"phase, which ends at {s:.3g} x {basis} = {n_switch:,.0f} samples (keep that "
            "checkpoint: training on fails)"
        )
        return _Phases([first], b_large, n_switch, n_switch, s)
    rationale.append(f"N_switch = {s:.3g} x {basis} = {n_switch:,.0f} samples")
    fl = by[b_large].failure.median
    rationale.append(
        f"B_large = {b_large:g}: the latest failure clock ("
        + ("censored: no seed failed" if fl is None else f"{fl:,.0f} samples")
        + ") among the larger batches that reached the target"
    )
    large, stop = _large_phase(a, by, (b_small, b_large), n_switch, s, budget, large_lr, small,
                               rationale)
    return _Phases([first, large], b_large, n_switch, stop, s)


def _large_phase(a: Analysis, by: dict[float, BatchRow], batches: tuple[float, float],
                 n_switch: float, s: float, budget: float, large_lr: str, small: dict,
                 rationale: list[str]) -> tuple[dict, float | None]:
    """The second phase (B_large from `n_switch` on) and where it stops short of the budget
    (None: it runs to the budget); the reasons are appended to `rationale`."""
    b_small, b_large = batches
    large = _phase_keys(_setting(a, b_large))
    if large_lr == "hold":
        rationale.append(
            f"large phase lr = B_small's {small['lr']:.4g} (--large-lr hold; B={b_large:g} "
            f"ran at {large['lr']:.4g} in the sweep): a setting the sweep did not measure"
        )
        large["lr"] = small["lr"]
        stop_at, why_stop = None, "its failure is not predicted (a setting the sweep " \
            "did not measure): it runs to the budget"
    else:
        stop_at, why_stop = _large_phase_stop(by, b_small, b_large, n_switch, s)
    stop = None
    if stop_at is not None and stop_at < budget:
        stop = stop_at
    elif stop_at is not None:
        why_stop += f", past the budget {budget:,.0f}: it runs to the budget"
    rationale.append(f"the large phase ends at "
                     f"{stop if stop is not None else budget:,.0f} samples: {why_stop}")
    return {"until_samples": round(stop) if stop is not None else budget, **large}, stop


def _objective_picks(time: TimeClocks | None, by: dict[float, BatchRow], reached: list[float],
                     b_samples: float, why_samples: str) -> dict:
    """{objective: {batch, why, samples, seconds, cost}}: the batch each objective picks (samples:
    B_crit's rule; time and cost: the least median time or cost to the target among the timed
    batches that reached it) and what that batch spends to the target in each clock."""
    def spend(b):
        tb = time.at(b) if time is not None else None
        return {"seconds": tb.progress.seconds if tb else None,
                "cost": tb.progress.cost if tb else None}

    def row(b, why):
        return {"batch": b, "why": why, "samples": by[b].progress.median, **spend(b)}

    picks = {"samples": row(b_samples, why_samples)}
    for obj, unit in (("time", "seconds"), ("cost", "cost")):
        timed = [b for b in reached if spend(b)[unit] is not None]
        if timed:
            best = min(timed, key=lambda b: (spend(b)[unit], b))
            picks[obj] = row(best, f"the least median {obj} to the target among the timed "
                                   f"batches that reached it ({time.source} throughput)")
    return picks


def _objective_lines(picks: dict, chosen: str) -> list[str]:
    """What each objective would pick and what that costs in the other clocks, against the
    chosen objective's pick ("time: 2,048 from the start, 1.9x the samples, 0.6x the hours")."""
    if len(picks) < 2:
        return []
    ref = picks[chosen]
    how = "B_crit's rule" if chosen == "samples" else f"the least {chosen} to the target"
    out = [f"objective {chosen}: B_small = {ref['batch']:g} ({how})"]
    for obj, p in picks.items():
        parts = [f"B={p['batch']:g}"]
        for key, unit in (("samples", "samples"), ("seconds", "hours"), ("cost", "cost")):
            if p[key] is not None and ref[key]:
                parts.append(f"{p[key] / ref[key]:.2f}x the {unit}")
        parts.append(_spent_text(p))
        out.append(f"{obj} would pick " + ", ".join(parts))
    return out


def _spent_text(p: dict) -> str:
    """'10,240 samples, 1.3 h, 3.2 (cost)' to the target: what is known of it."""
    bits = [f"{p['samples']:,.0f} samples" if p["samples"] is not None else None,
            f"{p['seconds'] / 3600:.3g} h" if p["seconds"] is not None else None,
            f"cost {p['cost']:.4g}" if p["cost"] is not None else None]
    return "to the target: " + ", ".join(b for b in bits if b) if any(bits) else \
        "to the target: not timed"


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


def _failure_lower_bound(batch: BatchRow) -> tuple[float | None, bool]:
    """(lower bound of N_fail, rests on one seed). None when no seed failed."""
    fail = batch.failure
    n_failed = batch.n_failed
    if n_failed <= 0:
        return None, False
    if n_failed == 1 or fail.low is None:
        # one failed seed: its own clock (the median when it is the only seed; else the lower
        # bound of the censored-aware median interval, which then is that seed)
        value = next((v for v in (fail.low, fail.median, fail.lower_bound) if v is not None),
                     None)
        return value, True
    return fail.low, False


def _phase_keys(setting: dict) -> dict:
    return {k: setting[k] for k in ("prompts_per_batch", "lr", "clip_eps_low", "clip_eps_high")}


def _predicted_progress(by: dict[float, BatchRow], b_small, n_switch) -> Predicted:
    med = by[b_small].progress.median
    if med is None:
        return Predicted(None, f"B={b_small:g} never reached the target (censored)")
    if n_switch is not None and med > n_switch:
        return Predicted(
            None,
            f"B={b_small:g} reaches the target at {med:,.0f} samples, after the switch at "
            f"{n_switch:,.0f}: the large phase's progress rate decides, not measured",
        )
    return Predicted(med, f"the median progress clock of B={b_small:g}, reached in phase 0")


def _large_phase_stop(by: dict[float, BatchRow], b_small, b_large, n_switch,
                      s: float) -> tuple[float | None, str]:
    """Where the large phase must end: the drift budget left at the switch, 1 - N_switch /
    N_fail(B_small), spent at B_large's failure rate, times the safety s; lower bounds
    throughout, as for the switch. None: B_large's failure is not predicted (no seed failed)."""
    small, large = by[b_small].failure, by[b_large].failure
    fs = next((v for v in (small.low, small.median) if v is not None), None)
    fl = next((v for v in (large.low, large.median) if v is not None), None)
    if fs is None or fl is None:
        return None, (f"B={b_large:g} did not fail within the sweep (censored): no failure "
                      "predicted, it runs to the budget")
    left = max(0.0, 1 - n_switch / fs)
    stop = n_switch + s * left * fl
    return stop, (f"N_switch + {s:.3g} x the drift budget left at the switch ({left:.2f} of "
                  f"B={b_small:g}'s failure clock lower bound {fs:,.0f}) x B={b_large:g}'s "
                  f"lower bound {fl:,.0f}")


def _predicted_failure(by: dict[float, BatchRow], b_small, b_large, n_switch,
                       switched) -> Predicted:
    """Drift budget left at the switch, spent at the large batch's rate."""
    fs = by[b_small].failure.median
    fl = by[b_large].failure.median
    if n_switch is None:
        return Predicted(None, f"no run at B={b_small:g} failed within the budget")
    if fs is None:
        return Predicted(None, f"the median run at B={b_small:g} did not fail (censored)")
    if not switched:
        return Predicted(fs, f"the median failure clock of B={b_small:g} (no switch)")
    if fl is None:
        return Predicted(None, f"B={b_large:g} did not fail within the budget: later than the "
                         "data reach")
    return Predicted(
        n_switch + (1 - n_switch / fs) * fl,
        f"N_switch + the drift budget left at the switch spent at B={b_large:g}'s rate",
    )


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
