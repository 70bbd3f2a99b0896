"""Per-batch clocks from per-run rows: the aggregates over seeds and every B_crit estimate.

Below both `analysis` (which builds the run rows from stored curves) and `stability` (which
resamples those rows and reruns exactly this), so the two cannot drift apart.
"""

from __future__ import annotations

import numpy as np

from twoclocks_cli.clocks import critical
from twoclocks_cli.clocks.result import (
    BatchRow,
    Critical,
    NoiseSummary,
    Recommended,
    RunRow,
    Theory,
)
from twoclocks_cli.clocks.runclock import Clock
from twoclocks_cli.clocks.stats import Aggregate, aggregate


def progress_by_batch(rows: list[RunRow], batches: list[BatchRow]) -> dict:
    """{batch: the progress clocks of its seeds (None: censored)}, runs that started above the
    target left out: what the B_crit estimates read."""
    out = {
        b.batch_samples: [r.progress.samples for r in rows
                          if r.batch_samples == b.batch_samples and not r.started_above]
        for b in batches
    }
    return {b: v for b, v in out.items() if v}


def batch_rows(rows: list[RunRow], rng, opts) -> list[BatchRow]:
    """Both clocks per batch size, aggregated over the seeds in `rows` (bootstrap `rng`)."""
    out = []
    for b in sorted({r.batch_samples for r in rows if r.batch_samples is not None}):
        at = [r for r in rows if r.batch_samples == b]
        if not at:
            continue
        prog_rows = [r for r in at if not r.started_above]
        progress = _aggregate_clock([r.progress for r in prog_rows], rng, opts)
        if len(prog_rows) < len(at):
            progress.note += f", {len(at) - len(prog_rows)} started above the target"
        collapsed = sum(1 for r in prog_rows if r.progress.collapsed)
        if collapsed:
            progress.note += f", {collapsed} collapsed before the target"
        failure = _aggregate_clock([r.failure for r in at], rng, opts)
        early = sum(1 for r in at if r.failure.at_eval_resolution)
        if early:
            failure.note += f", {early} at eval resolution (first or second logged point)"
        out.append(
            BatchRow(
                batch_samples=b,
                batch_prompts=sorted({r.batch_prompts for r in at if r.batch_prompts}),
                lr=sorted({r.lr for r in at if r.lr is not None}),
                n_runs=len(at),
                partial=any(r.partial for r in at),
                progress=progress,
                failure=failure,
                n_failed=sum(1 for r in at if r.failure.samples is not None),
                n_dips=sum(len(r.failure.dips) for r in at),
                runs_with_dips=sum(1 for r in at if r.failure.dips),
                drift_at_failure=_aggregate_drift(at, opts),
            )
        )
    return out


def _aggregate_drift(rows: list[RunRow], opts) -> Aggregate:
    """Median and interval of the drift at failure over the seeds that failed with a drift
    logged: the drift-threshold hypothesis read off the data rather than assumed. Its own
    random stream, so reporting it moves no other interval."""
    values = [r.failure.drift for r in rows
              if r.failure.samples is not None and r.failure.drift is not None]
    return aggregate(values, [], np.random.default_rng(opts.seed), opts.bootstrap)


def _aggregate_clock(clocks: list[Clock], rng, opts) -> Aggregate:
    """Median and interval over seeds of one clock (censored seeds as lower bounds)."""
    values = [c.samples for c in clocks]
    censored_at = [c.censored_at for c in clocks if c.censored]
    return aggregate(values, censored_at, rng, opts.bootstrap)


def critical_estimates(per_batch_prog: dict, rows: list[RunRow], theory: Theory | None, rng,
                       reps: int) -> Critical:
    """Every B_crit estimate side by side, the recommended one (with its fallbacks) and where
    they disagree: what `analyze` reports and each stability resample reruns. `reps`: bootstrap
    replicates of the intervals (the points do not depend on them)."""
    ests = {
        "empirical": critical.empirical(per_batch_prog, rng, reps),
        "power": critical.power(per_batch_prog, rng, reps),
        "mccandlish": critical.linear(per_batch_prog, rng, reps),
    }
    ests["mccandlish"].source = "mccandlish"
    noise = _noise_summary(rows, lambda r: r.noise_scale, "B_simple = tr(S)/|G|^2 (counts the "
                           "noise of every direction, also those that do not matter for progress)")
    sign = _noise_summary(rows, lambda r: r.sign_noise_scale, "B_sign, the noise scale of sign "
                          "descent (Adam's steps are sign-like past the noise scale)")
    choice = dict(ests)
    for name, summary in (("noise_scale", noise), ("sign_noise_scale", sign)):
        if summary.value is not None:
            choice[name] = critical.Estimate(name, summary.value, summary.low, summary.high,
                                             note=summary.note)
    if theory and theory.b_crit:
        choice["theory"] = critical.Estimate("theory", theory.b_crit, note="theory model")
    rec, why = critical.recommend(choice)
    disagree = critical.disagreement(choice, rec)
    if disagree:
        why += "; estimates disagree by more than 2x, the measured clocks are followed: " + (
            "; ".join(disagree)
        )
    return Critical(
        empirical=ests["empirical"],
        power=ests["power"],
        mccandlish=ests["mccandlish"],
        noise_scale=noise,
        sign_noise_scale=sign,
        theory=theory,
        recommended=Recommended.of(rec, why),
        disagreements=disagree,
    )


def _noise_summary(rows: list[RunRow], scale_of, what: str) -> NoiseSummary:
    """The median over runs of one noise scale (`scale_of(row)`, None where not formed)."""
    vals = [scale_of(r) for r in rows if scale_of(r) is not None]
    if not vals:
        return NoiseSummary(None, n_runs=0, note=f"{what}: not available (no run logged its "
                            "gradient terms, or none could be formed)")
    crossed = sum(1 for r in rows if scale_of(r) is not None and not r.progress.censored
                  and r.progress.samples is not None)
    where = (
        "at each run's progress crossing"
        if crossed == len(vals)
        else "at each run's last point (no run crossed)"
        if crossed == 0
        else f"at the progress crossing ({crossed} runs) or the last point ({len(vals) - crossed})"
    )
    return NoiseSummary(
        value=float(np.median(vals)),
        low=float(np.min(vals)),
        high=float(np.max(vals)),
        n_runs=len(vals),
        note=f"{what}; median over {len(vals)} runs {where}, range "
        f"{np.min(vals):.4g}-{np.max(vals):.4g}",
    )
