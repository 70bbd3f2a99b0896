"""Verify a schedule: set a trained schedule (or adaptive) run's two clocks beside the
constant-batch runs. The run's training config is built on the launch floor
(`twoclocks_cli.launch.schedule_run`); this module only measures.

`compare_schedule` measures the schedule run with exactly the options, metric and target of the
sweep's stored analysis (the functions of `twoclocks_cli.clocks`), so the numbers line up.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
from pydantic import model_serializer

from twoclocks_cli.clocks.cost import (
    RUNTIME_KEY,
    STEP_TIME_KEY,
    CostFile,
    Segment,
    Throughput,
    TimeClocks,
    for_analysis,
    measured_throughput,
    modelled_throughput,
    phased_spent,
    runtime_steps,
)
from twoclocks_cli.clocks.options import AnalysisOptions
from twoclocks_cli.clocks.result import Analysis, BatchRow
from twoclocks_cli.clocks.runclock import TIME_KEYS, RunClocks, load_signals, run_clocks
from twoclocks_cli.core.codec import Document
from twoclocks_cli.core.errors import AnalysisError
from twoclocks_cli.core.numbers import count, num
from twoclocks_cli.store.store import Series


def _run_clocks(store, run_id: int, metric: str, tau: float, opts: AnalysisOptions
                ) -> RunClocks:
    """Progress and failure clocks of one run: the very function `analyze` uses."""
    sig = load_signals(store, [run_id], metric, opts)[run_id]
    run = store.get_run(run_id)
    clocks = run_clocks(run_id, sig, tau, opts, run.group_size)
    if clocks is None:
        raise AnalysisError(f"run {run_id} has no finite {metric!r} values: nothing to compare")
    return clocks


def phase_summary(store, run_id: int) -> list[dict]:
    """The phases a run actually trained, from its per-step `phase`, `prompts`, `lr` metrics
    (each phase's lr as at its last step: under an lr warm-up its first steps log less)."""
    cols = {k: store.load_metric([run_id], k).get(run_id)
            for k in ("phase", "prompts", "lr", "batch_samples")}
    ph = cols["phase"]
    if ph is None or ph.values.size == 0:
        return []
    out: list[dict] = []
    last_steps = []
    for i, value in enumerate(ph.values):
        index = int(value)
        if not out or out[-1]["phase"] != index:
            start = float(ph.samples[i])
            if cols["batch_samples"] is not None:
                start -= float(_at(cols["batch_samples"], ph.steps[i]) or 0)
            out.append({"phase": index, "from_samples": start, "steps": 0,
                        "prompts_per_batch": _int(_at(cols["prompts"], ph.steps[i])),
                        "batch_samples": _at(cols["batch_samples"], ph.steps[i])})
            last_steps.append(None)
        out[-1]["steps"] += 1
        out[-1]["to_samples"] = float(ph.samples[i])
        last_steps[-1] = ph.steps[i]
    for phase, step in zip(out, last_steps, strict=True):
        phase["lr"] = _at(cols["lr"], step)
    return out


def _at(series, step):
    if series is None:
        return None
    idx = np.flatnonzero(series.steps == step)
    return float(series.values[idx[-1]]) if idx.size else None


def _int(v):
    return None if v is None else int(round(v))


@dataclass
class ConstantRow(Document):
    """One batch size of the sweep beside the schedule run: the analysis's clocks there, the
    median final smoothed metric of its runs, and how many of them reached and failed."""

    batch: BatchRow
    final: float | None
    failure_rules: list[str]
    reached: int
    failed: int

    @model_serializer(mode="plain")
    def _flat(self) -> dict:
        """The batch's clocks at the top level, the failure count under `failure`."""
        b = self.batch
        return {
            "final": self.final,
            "batch_samples": b.batch_samples, "batch_prompts": b.batch_prompts,
            "lr": b.lr, "n_runs": b.n_runs,
            "progress": b.progress.to_json(),
            "failure": {**b.failure.to_json(), "n_failed": b.n_failed},
            "failure_rules": self.failure_rules,
            "reached": self.reached,
            "failed": self.failed,
        }


def _constant_rows(store, a: Analysis, tau: float, opts: AnalysisOptions) -> list[ConstantRow]:
    """Per batch size: the analysis's clocks, plus the median final smoothed metric."""
    rows = []
    for b in a.batches:
        runs = a.runs_at(b.batch_samples, family_only=False)
        finals = []
        for r in runs:
            try:
                finals.append(_run_clocks(store, r.run_id, a.metric, tau, opts).final)
            except AnalysisError:
                continue
        rows.append(ConstantRow(
            batch=b,
            final=float(np.median(finals)) if finals else None,
            failure_rules=sorted({r.failure.rule for r in runs if r.failure.rule}),
            reached=sum(1 for r in runs if not r.progress.censored),
            failed=sum(1 for r in runs if not r.failure.censored),
        ))
    return rows


def _within_seeds(clock: float, batch: BatchRow) -> str:
    """Where one schedule run's clock lies inside a batch's interval over its seeds, a ratio to
    the batch's median says nothing about the schedule: say so beside it."""
    lo, hi = batch.progress.low, batch.progress.high
    if lo is None or hi is None or not lo <= clock <= hi:
        return ""
    return (f", inside B={batch.batch_samples}'s 90% interval over its {batch.n_runs} seeds "
            f"[{count(lo)}, {count(hi)}]: no difference shown")


def _verdict(constant: list[ConstantRow], sched: RunClocks) -> list[str]:
    """Plain statements with the numbers: schedule vs the smallest and the largest batch."""
    lines = []
    if not constant:
        return ["no constant-batch runs to compare with"]
    small, large = constant[0], constant[-1]
    sp = sched.progress.samples
    for label, row in (("smallest", small), ("largest", large)):
        med = row.batch.progress.median
        b = row.batch.batch_samples
        if sp is None and med is None:
            lines.append(f"progress: neither the schedule nor the {label} batch (B={b}) reached "
                         "the target")
        elif sp is None:
            lines.append(f"progress: the schedule did not reach the target (censored at "
                         f"{count(sched.progress.censored_at)}); the {label} batch (B={b}) "
                         f"did at {count(med)} samples")
        elif med is None:
            lines.append(f"progress: the schedule reached the target at {count(sp)} samples; the "
                         f"{label} batch (B={b}) median did not ({row.reached} of "
                         f"{row.batch.n_runs} seeds did)")
        else:
            lines.append(f"progress: the schedule reached the target at {count(sp)} samples vs "
                         f"{count(med)} for the {label} batch (B={b}): {sp / med:.2f}x"
                         + _within_seeds(sp, row.batch))
    sf = sched.failure.samples
    fs = small.batch.failure.median
    sched_f = (f"failed at {count(sf)} samples ({sched.failure.rule})" if sf is not None
               else f"did not fail within {count(sched.failure.censored_at)} samples")
    small_f = (f"failed at {count(fs)} (median)" if fs is not None
               else f"did not fail (median censored; {small.failed} of {small.batch.n_runs} "
               "seeds failed)")
    lines.append(f"failure: the schedule {sched_f}; the smallest batch "
                 f"(B={small.batch.batch_samples}) {small_f}")
    return lines


def check_schedule_run(store, sweep: str, run) -> None:
    """Refuse a run that is not a schedule (phases) or adaptive run of the sweep's setting."""
    from twoclocks_cli.clocks.analysis import _setting

    cfg = run.config or {}
    if not cfg.get("phases") and cfg.get("batch_schedule") != "adaptive":
        raise AnalysisError(
            f"run {run.id} ({run.name}) is a constant-batch run, not a schedule: give the id of "
            "a run trained from `twoclocks schedule-config` (it has [[phases]])"
        )
    cells = [r for r in store.list_runs(sweep) if not (r.config or {}).get("phases")]
    if not cells:
        return
    want = json.loads(_setting(cells[0]))
    have = json.loads(_setting(run))
    skip = {"clip", "sim", "phases", "batch_schedule"}
    differ = sorted(k for k in want if k not in skip and k in have and have[k] != want[k])
    if isinstance(want.get("sim"), dict) and isinstance(have.get("sim"), dict):
        from twoclocks_cli.clocks.analysis import _SIM_PER_BATCH
        from twoclocks_cli.theory import ModelConfig

        # a key left out means the model's default: compare the full models
        w, h = (ModelConfig.from_dict(x).to_dict() for x in (want["sim"], have["sim"]))
        quiet = _SIM_PER_BATCH | {"log_every", "checkpoint_every"}  # bookkeeping only
        differ += [f"sim.{k}" for k in w if k not in quiet and w[k] != h[k]]
        have.update({f"sim.{k}": h[k] for k in w})
        want.update({f"sim.{k}": w[k] for k in w})
    if differ:
        shown = ", ".join(f"{k} = {have.get(k)!r} (sweep: {want.get(k)!r})" for k in differ[:5])
        raise AnalysisError(
            f"run {run.id} ({run.name}) was not trained with sweep {sweep!r}'s setting: {shown}"
        )


def compare_schedule(store, sweep: str, run_id: int, a: Analysis,
                     cost: CostFile | None = None) -> dict:
    """The schedule run's clocks and phases beside the sweep's per-batch clocks (a JSON dict),
    in samples and, where a throughput is known (`cost`, else the analysis's), in time and
    cost."""
    run = store.get_run(run_id)
    check_schedule_run(store, sweep, run)
    opts = a.options
    tau = float(a.target.value)
    clocks = _run_clocks(store, run_id, a.metric, tau, opts)
    constant = _constant_rows(store, a, tau, opts)
    phases = phase_summary(store, run_id)
    for p in phases:
        if p["batch_samples"] is None and p["prompts_per_batch"] is not None:
            p["batch_samples"] = float(p["prompts_per_batch"] * (run.group_size or 1))
    sched = {"run_id": run.id, "name": run.name, "status": run.status,
             "phases": phases, **clocks.to_json()}
    time, note = compare_time(store, a, run_id, phases, clocks, cost)
    return {
        "sweep": sweep,
        "analysis_id": a.analysis_id,
        "metric": a.metric,
        "target": a.target.to_json(),
        "options": a.options.to_json(),
        "units": "samples (one sampled completion)",
        "constant": [c.to_json() for c in constant],
        "schedule": sched,
        "verdict": _verdict(constant, clocks) + _time_verdict(time),
        "time": time,
        "time_note": note,
    }


def compare_run(store, sweep: str, run_id: int, large_lr: str = "sweep",
                cost: CostFile | None = None) -> dict:
    """`twoclocks compare`: run `run_id` (a schedule or adaptive run) beside the constant batches
    of `sweep` under the sweep's stored analysis, with the static schedule it recommends (its
    large phase's lr by `large_lr`, as `twoclocks schedule --large-lr`); in time and cost under
    `cost` (a cost file) or the throughput the analysis measured."""
    from twoclocks_cli.clocks.saved import latest_analysis

    name = store.get_sweep(sweep).name
    analysis = latest_analysis(store, name)
    if analysis is None:
        raise AnalysisError(f"sweep {name!r} has no stored analysis: run `twoclocks analyze "
                            f"{name} --save` first")
    result = compare_schedule(store, name, run_id, analysis, cost)
    result["kind"] = "adaptive" if (store.get_run(run_id).config or {}).get(
        "batch_schedule") == "adaptive" else "schedule"
    result["static_schedule"] = static_schedule(analysis, large_lr)
    if result["time"] is not None:
        result["time"]["static_schedule"] = _static_time(result["static_schedule"],
                                                         result["time"])
    return result


def static_schedule(analysis, large_lr: str = "sweep") -> dict:
    """The static schedule `twoclocks schedule` recommends from the analysis: its phases and
    predicted clocks (None with the reason where it cannot schedule)."""
    from twoclocks_cli.clocks.schedule import make_schedule

    try:
        plan = make_schedule(analysis, large_lr=large_lr)
    except AnalysisError as err:
        return {"phases": [], "predicted": None, "why": str(err), "batches": []}
    # the batch (samples) of each phase: B_small, then B_large
    batches = [plan["b_small"], plan["b_large"]][:len(plan["phases"])]
    return {"phases": plan["phases"], "predicted": plan["predicted"], "why": None,
            "batches": batches}


def compare_time(store, a: Analysis, run_id: int, phases: list[dict], clocks: RunClocks,
                 cost: CostFile | None) -> tuple[dict | None, str | None]:
    """The constant batches' and the schedule run's clocks in time and cost (a JSON dict), or
    None and the one line that says what the time clock needs."""
    time = for_analysis(a, cost) if cost is not None else a.time
    if time is None:
        return None, _no_time(store, a, cost)
    modelled = _modelled_by(time)
    own = _own_times(store, run_id)
    until = [p.get("until_samples") for p in (store.get_run(run_id).config or {}).get(
        "phases") or []]
    segments = []
    for i, p in enumerate(phases):
        b = p["batch_samples"]
        tp = None if b is None else _phase_throughput(b, p, time, modelled, own)
        # the run starts at 0 samples whatever step it first logged
        start = _boundary(phases[i - 1], p, until) if i else 0.0
        segments.append(Segment(start, b, tp))
    price = time.price_per_hour
    prog, fail = clocks.progress, clocks.failure
    doc = time.to_json()
    doc["schedule"] = {
        "phases": [{"phase": p["phase"], "batch_samples": s.batch_samples,
                    "throughput": None if s.throughput is None else s.throughput.to_json()}
                   for p, s in zip(phases, segments, strict=True)],
        "progress": phased_spent(prog.samples, prog.censored_at, segments, price).to_json(),
        "failure": phased_spent(fail.samples, fail.censored_at, segments, price).to_json(),
        # what the run's own time_* metrics add up to (None: it logged none)
        "logged_seconds": {"progress": prog.seconds, "failure": fail.seconds},
    }
    return doc, None


def _boundary(prev: dict, nxt: dict, until: list) -> float:
    """Samples where phase `prev` handed over to `nxt`: past prev's last logged step, its
    steps ran on while the samples stayed below its `until_samples` (when the config gives it),
    and ended before nxt's first logged step began."""
    end = prev["to_samples"]
    k = prev["phase"]
    limit = until[k] if 0 <= k < len(until) else None
    b = prev["batch_samples"]
    if limit is not None and b:
        end += max(0, math.ceil((limit - end) / b)) * b
    return min(end, nxt["from_samples"])


def _modelled_by(time: TimeClocks) -> CostFile | None:
    """The cost file behind `time` when it gives the seconds per step (any batch is priced)."""
    if time.source != "cost file" or not time.cost_file:
        return None
    cost = CostFile.model_validate(time.cost_file)
    return cost if cost.timed else None


def _phase_throughput(batch: float, phase: dict, time: TimeClocks, modelled: CostFile | None,
                      own: list) -> Throughput | None:
    """Seconds per sample of one phase: the sweep's at that batch (the constant runs' or the
    cost file's: the same batch costs the same in both rows), else the cost model's, else the
    run's own time_* metrics over the phase's steps."""
    timed = time.at(batch)
    if timed is not None:
        return timed.throughput
    if modelled is not None:
        return modelled_throughput(batch, modelled)
    lo, hi = phase["from_samples"], phase["to_samples"]
    parts = []
    for s in own:
        keep = (s.samples > lo) & (s.samples <= hi)
        parts.append(Series(s.steps[keep], s.samples[keep], s.values[keep]))
    tp = measured_throughput(batch, [parts] if parts else [], np.random.default_rng(0))
    if tp is not None:
        tp.source = "measured (this run)"
    return tp


def _own_times(store, run_id: int) -> list:
    """The run's own per-step seconds: its time_* parts, else the whole step's time."""
    parts = [store.load_metric([run_id], k).get(run_id) for k in TIME_KEYS]
    parts = [s for s in parts if s is not None]
    if parts:
        return parts
    whole = store.load_metric([run_id], STEP_TIME_KEY).get(run_id)
    if whole is None:
        whole = runtime_steps(store, [run_id]).get(run_id)
    return [whole] if whole is not None else []


def _no_time(store, a: Analysis, cost: CostFile | None) -> str:
    """Why there is no time clock, and what would give one."""
    ids = [r.run_id for r in a.runs]
    timing = {*TIME_KEYS, STEP_TIME_KEY, RUNTIME_KEY}
    logged = set(store.metric_keys(ids)) & timing if ids else set()
    if logged:
        return (f"no time or cost clock: the stored analysis of {a.sweep!r} has none although "
                f"its runs logged {', '.join(sorted(logged))}: run `twoclocks analyze "
                f"{a.sweep} --save` again (or give --cost FILE with the seconds per step)")
    given = "the cost file gives a price but no timings, and " if cost is not None else ""
    return (f"no time or cost clock: {given}no run logged time_* metrics (time_gen_s, "
            "time_reward_s, time_update_s, time_step_s or time_total_s): give --cost FILE with "
            "the seconds per step (examples/gpu-cost.toml)")


def _static_time(static: dict, time: dict) -> dict | None:
    """The static schedule's predicted clocks in time and cost, its phases at the sweep's
    throughput (None: no static schedule; a clock stays None where a phase's batch has no
    throughput or the prediction is unknown)."""
    if not static.get("phases") or static.get("predicted") is None:
        return None
    by = {b["batch_samples"]: b["throughput"] for b in time["batches"]}
    segments, start = [], 0.0
    for ph, batch in zip(static["phases"], static["batches"], strict=True):
        tp = by.get(batch)
        segments.append(Segment(start, batch, None if tp is None else _tp(tp)))
        start = float(ph["until_samples"])
    pred, price = static["predicted"], time["price_per_hour"]
    return {"progress": phased_spent(pred["progress_samples"], None, segments, price).to_json(),
            "failure": phased_spent(pred["failure_samples"], None, segments, price).to_json()}


def _tp(d: dict) -> Throughput:
    return Throughput.from_json(d)


def _hours(seconds: float) -> str:
    return f"{num(seconds / 3600, 3)} h"


def _time_verdict(time: dict | None) -> list[str]:
    """The schedule's time to the target beside the smallest and the largest timed batch's."""
    if time is None:  # the note is said once, beside the table (and in --json's time_note)
        return []
    prog = time["schedule"]["progress"]
    mine = prog["seconds"]
    if mine is None:
        if prog["lower_bound"] is not None:
            return [f"time: the schedule did not reach the target; it trained >= "
                    f"{_hours(prog['lower_bound'])}"]
        return ["time: the schedule's time to the target is unknown: a phase's batch has no "
                "throughput"]
    if not time["batches"]:
        return [f"time: the schedule reached the target in {_hours(mine)}; no constant batch "
                "is timed"]
    line = f"time: the schedule reached the target in {_hours(mine)}"
    first, last = time["batches"][0], time["batches"][-1]
    ends = [("smallest", first)] + ([("largest", last)] if last is not first else [])
    for label, row in ends:
        theirs, b = row["progress"]["seconds"], row["batch_samples"]
        line += (f"; the {label} batch (B={b:g}) median did not reach it" if theirs is None
                 else f"; {_hours(theirs)} for the {label} batch (B={b:g}): "
                 f"{mine / theirs:.2f}x")
    line += f" ({time['source']} throughput)"
    own = time["schedule"]["logged_seconds"]["progress"]
    if own is not None:  # what the run itself logged, on the machine as it then was
        line += f"; its own logged time_* add up to {_hours(own)}"
    return [line]
