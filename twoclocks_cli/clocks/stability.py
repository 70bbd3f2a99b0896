"""How settled a decision is: the whole decision rerun on seeds resampled within each batch.

A sweep's verdict (where B_crit lies, which batches collapse, the schedule's shape) rests on a
few seeds at each batch; float rounding on another machine redraws those seeds. Resampling the
seeds of each batch with replacement, the way the clocks' own bootstrap does, and rerunning
every step after the per-run clocks (the per-batch aggregates, B_crit, the schedule) shows which
parts of the verdict survive such a redraw.

Each resample reruns what the main analysis runs: the same per-batch aggregation and the same
B_crit estimators with their fallbacks (`perbatch`), then the same schedule rule.

The rule, stated once: an outcome is *settled* when it holds in at least SETTLED (80%) of the
resamples. The decision is settled when its outcome is: B_small, whether it switches and to
which B_large, and whether B_small's median seed collapses. B_crit's kind (a point in the grid,
a lower bound, an upper bound) is reported beside it, with its own share.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from twoclocks_cli.clocks.critical import article
from twoclocks_cli.core.codec import Document
from twoclocks_cli.core.errors import AnalysisError

SETTLED = 0.8  # share of resamples in which an outcome must hold to be settled
RESAMPLES = 200  # resamples of the decision (each reruns aggregates, B_crit and the schedule)
INNER_BOOTSTRAP = 200  # bootstrap replicates of each resample's per-batch intervals
MAX_RESAMPLES = 100_000


@dataclass
class Stability(Document):
    """The decision's stability over seed resamples (see the module docstring for the rule)."""

    resamples: int
    b_crit: dict  # {"kind": modal kind, "share": ..., "shares": {kind: share}, "where": ...}
    collapses: dict  # {batch: share of resamples in which the batch's median seed collapsed}
    schedule: dict  # {"shape": modal shape, "share", "shares", "switch_share", "switch"}
    settled: bool
    verdict: str  # one line: settled or not, and on what
    needs: list[dict] = field(default_factory=list)  # what would settle it: [{batch, what, why}]
    rule: str = (f"an outcome is settled when it holds in >= {SETTLED:.0%} of seed resamples; "
                 "the decision (B_small, the switch and B_large, whether B_small's median seed "
                 "collapses) when it is; B_crit's kind is reported beside it")



def _shape(plan: dict | None, batches=None) -> str:
    """'512', '512 -> 2,048' (samples per batch of each phase), or 'none' (no schedule); with
    `batches`, whether B_small's median seed collapses is part of it."""
    if plan is None:
        return "none"
    out = f"{plan['b_small']:,.0f}"
    if len(plan["phases"]) > 1:
        out += f" -> {plan['b_large']:,.0f}"
    if batches is not None:
        row = next((b for b in batches if b.batch_samples == plan["b_small"]), None)
        if row is not None and row.failure.median is not None:
            out += " (its median seed collapses)"
    return out


def _kind(rec) -> str:
    if rec is None or rec.b_crit is None:
        return "none"
    return {"lower": "lower bound", "upper": "upper bound"}.get(rec.bound, "point")


def _resample(a, rng):
    """The analysis' in-family analysed runs with each batch's seeds drawn with replacement."""
    rows = [r for r in a.runs if r.analysed and r.in_family and r.batch_samples is not None]
    out = []
    for b in sorted({r.batch_samples for r in rows}):
        at = [r for r in rows if r.batch_samples == b]
        out += [at[i] for i in rng.integers(0, len(at), len(at))]
    return out


def _decide(a, rows, rng, schedule_kw: dict):
    """(recommended B_crit, per-batch rows, the schedule or None) from resampled run rows."""
    from twoclocks_cli.clocks.cost import retimed
    from twoclocks_cli.clocks.perbatch import batch_rows, critical_estimates, progress_by_batch
    from twoclocks_cli.clocks.schedule import make_schedule

    opts = dataclasses.replace(a.options, bootstrap=INNER_BOOTSTRAP)
    batches = batch_rows(rows, rng, opts)
    prog = progress_by_batch(rows, batches)
    # the estimators and fallbacks of the analysis; intervals do not enter the decision, so one
    # replicate keeps each resample cheap
    crit = critical_estimates(prog, rows, a.critical.theory, rng, 1)
    resampled = dataclasses.replace(a, runs=rows, batches=batches, critical=crit)
    if schedule_kw.get("time") is not None:
        # the throughput is the same, the clocks in samples resampled: their time follows
        schedule_kw = {**schedule_kw, "time": retimed(schedule_kw["time"], batches)}
    try:
        plan = make_schedule(resampled, **schedule_kw)
    except AnalysisError:
        plan = None
    return crit.recommended, batches, plan


def _shares(values: list) -> tuple[object, float, dict]:
    """The modal value, its share and every value's share."""
    counts = Counter(values)
    mode, n = counts.most_common(1)[0]
    return mode, n / len(values), {str(k): c / len(values) for k, c in counts.most_common()}


def _interval(values: list[float]) -> list[float] | None:
    """The 5-95% range of `values` (None when there are none)."""
    if not values:
        return None
    lo, hi = np.quantile(np.asarray(values, float), [0.05, 0.95])
    return [float(lo), float(hi)]


def measure(a, reps: int = RESAMPLES, seed: int = 0, budget: float | None = None,
            safety: float = 0.8, large_lr: str = "sweep", objective: str = "samples",
            time=None) -> Stability:
    """Rerun the decision of analysis `a` on `reps` seed resamples (schedule options as given;
    `time`: the clocks in time the objective reads, default the analysis's own)."""
    if not 1 <= reps <= MAX_RESAMPLES:
        raise AnalysisError(f"--stability {reps}: must be between 1 and {MAX_RESAMPLES:,}")
    rng = np.random.default_rng(seed)
    kw = {"budget": budget, "safety": safety, "large_lr": large_lr, "objective": objective,
          "time": time if time is not None else a.time}
    kinds, points, shapes, switches = [], [], [], []
    collapsed: dict[float, list[bool]] = {}
    for _ in range(reps):
        rec, batches, plan = _decide(a, _resample(a, rng), rng, kw)
        kinds.append(_kind(rec))
        if kinds[-1] == "point":
            points.append(rec.b_crit)
        for b in batches:
            collapsed.setdefault(b.batch_samples, []).append(b.failure.median is not None)
        shapes.append(_shape(plan, batches))
        if plan is not None and plan.get("n_switch") is not None:
            switches.append(plan["n_switch"])
    kind, kind_share, kind_shares = _shares(kinds)
    shape, shape_share, shape_shares = _shares(shapes)
    b_crit = {"kind": kind, "share": kind_share, "shares": kind_shares,
              "where": _interval(points), "settled": kind_share >= SETTLED}
    main = _shape(_main_plan(a, kw), a.batches)
    coll = {f"{b:g}": {"share": sum(v) / len(v), "settled": not 1 - SETTLED < sum(v) / len(v)
                       < SETTLED} for b, v in sorted(collapsed.items())}
    main_share = shape_shares.get(main, 0.0)
    sched = {"shape": shape, "share": shape_share, "shares": shape_shares,
             "switch_share": len(switches) / reps, "switch": _interval(switches),
             "settled": main_share >= SETTLED, "main": main, "main_share": main_share}
    settled = sched["settled"]
    needs = [] if settled else _needs(a, b_crit, coll, sched, points)
    return Stability(resamples=reps, b_crit=b_crit, collapses=coll, schedule=sched,
                     settled=settled, verdict=_verdict(b_crit, sched, settled, needs),
                     needs=needs)


def _main_plan(a, kw: dict) -> dict | None:
    """The schedule of the analysis itself (what the resamples' decisions are compared with)."""
    from twoclocks_cli.clocks.schedule import make_schedule

    try:
        return make_schedule(a, **kw)
    except AnalysisError:
        return None


def _verdict(b_crit: dict, sched: dict, settled: bool, needs: list[dict]) -> str:
    what = (f"schedule {sched['main']} in {sched['main_share']:.0%} of seed resamples (B_crit "
            f"{article(b_crit['kind'])} {b_crit['kind']} in {b_crit['share']:.0%})")
    if settled:
        return f"settled: {what}"
    if sched["shape"] != sched["main"]:
        what += f"; the resamples' most common decision is {sched['shape']} ({sched['share']:.0%})"
    wanted = "; ".join(f"{n['what']} at B={n['batch']:,.0f}" if n["what"] == "more seeds"
                       else f"{n['what']} ({n['batch']:,.0f})" for n in needs)
    return f"NOT settled: {what}" + (f"; would settle it: {wanted}" if wanted else "")


def _needs(a, b_crit: dict, coll: dict, sched: dict, points: list[float]) -> list[dict]:
    """The cells that would settle an unsettled decision: more seeds where a batch's collapse
    or the schedule's batches flip, a batch between two grid batches where B_crit's point
    wanders across a gap of 4x or more."""
    grid = sorted(b.batch_samples for b in a.batches if b.n_runs)
    out: dict[tuple, dict] = {}
    for b, c in coll.items():
        if not c["settled"]:
            out[(float(b), "more seeds")] = {
                "batch": float(b), "what": "more seeds",
                "why": f"B={float(b):,.0f} collapses in {c['share']:.0%} of resamples"}
    if not sched["settled"]:
        for shape in list(sched["shares"])[:2]:
            for part in shape.split(" (")[0].split(" -> "):
                if part != "none":
                    b = float(part.replace(",", ""))
                    out.setdefault((b, "more seeds"), {
                        "batch": b, "what": "more seeds",
                        "why": f"the schedule's shape flips ({sched['shape']} in "
                               f"{sched['share']:.0%} of resamples)"})
    if not b_crit["settled"]:
        where = _interval(points)
        for lo, hi in zip(grid, grid[1:], strict=False):
            if where and hi / lo >= 4 and where[0] < hi and where[1] > lo:
                mid = math.sqrt(lo * hi)
                out[(mid, "a batch between")] = {
                    "batch": mid, "what": f"a batch between {lo:,.0f} and {hi:,.0f}",
                    "why": f"B_crit's point ranges over {where[0]:,.0f}-{where[1]:,.0f}"}
        for b in (grid[0], grid[-1]):
            out.setdefault((b, "more seeds"), {
                "batch": b, "what": "more seeds",
                "why": f"B_crit is {article(b_crit['kind'])} {b_crit['kind']} in only "
                       f"{b_crit['share']:.0%} of resamples"})
    return [out[k] for k in sorted(out, key=lambda k: (k[0], k[1]))]
