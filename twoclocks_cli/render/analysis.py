"""The tables and files of `twoclocks analyze`: one sweep's clocks, B_crit estimates, time and
cost clocks and decision stability as rich tables; several sweeps side by side; per-run CSV."""

from __future__ import annotations

from twoclocks_cli.core.numbers import count, num
from twoclocks_cli.render.tables import console


def _clock(agg) -> str:
    """One clock at one batch (a stats.Aggregate): median [interval], or censored (>= bound)."""
    if agg.median is None:
        bound = agg.lower_bound
        return f"censored (>= {count(bound)})" if bound is not None else "censored"
    if agg.low is None:
        return count(agg.median)
    high = count(agg.high) if agg.high is not None else "censored"
    return f"{count(agg.median)} [{count(agg.low)}-{high}]"


def _drift(agg) -> str:
    """The drift at failure at one batch: median [interval] over the seeds that failed."""
    if agg.median is None:
        return "-"
    if agg.low is None:
        return num(agg.median, 3)
    return f"{num(agg.median, 3)} [{num(agg.low, 3)}-{num(agg.high, 3)}]"


def _falls(b) -> str:
    """'3 of 4 / 2 in 1 run': seeds that collapsed, and the dips (recovered falls) beside."""
    failed = "?" if b.n_failed is None else str(b.n_failed)
    dips = f"{b.n_dips} in {b.runs_with_dips} run{'s' if b.runs_with_dips != 1 else ''}" \
        if b.n_dips else "0"
    return f"{failed} of {b.n_runs} / {dips}"


def render_analysis(a) -> None:
    """Rich tables of an analysis (a clocks.result.Analysis)."""
    con = console()
    con.print(_batch_table(a))
    render_critical(con, a.critical)
    inv = a.invariance
    con.print(
        f"failure clock vs batch: slope {num(inv.slope, 3)} "
        f"[{num(inv.low, 3)}, {num(inv.high, 3)}] over {inv.n} runs: {inv.verdict}"
    )
    if a.time is not None:
        render_time(con, a)
    if a.stability:
        render_stability(con, a.stability)
    rules: dict[str, int] = {}
    for r in a.runs:
        if r.failure.rule:
            rules[r.failure.rule] = rules.get(r.failure.rule, 0) + 1
    if rules:
        con.print(
            "collapse rules that fired first: "
            + ", ".join(f"{k} x{v}" for k, v in sorted(rules.items()))
        )
    if a.clipping:
        con.print(_clipping_table(a.clipping))
    for w in a.warnings:
        con.print(f"[yellow]warning:[/yellow] {w}")


def _batch_table(a):
    """One row per batch size: both clocks, the falls, the drift at failure."""
    from rich.table import Table

    table = Table(
        title=f"sweep {a.sweep}: {a.metric} target {num(a.target.value)} "
        f"({a.target.spec}); clocks in samples, median [90% bootstrap]"
    )
    for col in ("batch", "lr", "runs", "progress clock", "failure clock", "collapses / dips",
                f"{a.options.drift_key} at failure", "note"):
        table.add_column(col)
    for b in a.batches:
        lr = ", ".join(f"{x:.3g}" for x in b.lr) or "-"
        note = b.progress.note + (" (partial)" if b.partial else "")
        table.add_row(num(b.batch_samples), lr, str(b.n_runs), _clock(b.progress),
                      _clock(b.failure), _falls(b), _drift(b.drift_at_failure), note)
    return table


def _clipping_table(clipping):
    """The clocks per clip range, when the sweep varied it."""
    from rich.table import Table

    ct = Table(title="clipping")
    for col in ("clip_low", "clip_high", "batch", "runs", "progress", "failure"):
        ct.add_column(col)
    for row in clipping:
        ct.add_row(num(row.clip_low), num(row.clip_high), num(row.batch_samples),
                   str(row.n_runs), num(row.progress_median), num(row.failure_median))
    return ct


def _spent(sp, money: bool = False) -> str:
    """A clock in hours (or money): median [interval], or '>= bound' when censored."""
    value, low, high = (sp.cost, sp.cost_low, sp.cost_high) if money else (
        sp.seconds, sp.low, sp.high)
    if value is None:
        if not money and sp.lower_bound is not None:
            return f">= {sp.lower_bound / 3600:.3g} h"
        return "-"
    if money:
        text, lo, hi = f"{value:.4g}", num(low, 4), num(high, 4)
    else:
        text = f"{value / 3600:.3g} h"
        lo = None if low is None else f"{low / 3600:.3g}"
        hi = None if high is None else f"{high / 3600:.3g}"
    if low is None:  # one seed: no interval
        return text
    return f"{text} [{lo}-{'censored' if high is None else hi}]"


def render_time(con, a) -> None:
    """Both clocks in hours and cost per batch (an analysis's time clocks), and B_crit in time
    beside B_crit in samples."""
    from rich.table import Table

    tc = a.time
    priced = tc.price_per_hour is not None
    t = Table(title=f"clocks in time ({tc.source} throughput"
              + (f", {tc.price_per_hour:g} per hour" if priced else "") + "): median [90%]")
    cols = ["batch", "s/sample", "time to target", "time to failure"]
    cols += ["cost to target", "cost to failure"] if priced else []
    for col in cols:
        t.add_column(col)
    for b in tc.batches:
        tp = b.throughput
        rate = "-" if tp.seconds_per_sample is None else (
            num(tp.seconds_per_sample, 4) if tp.low is None or tp.low == tp.high
            else f"{num(tp.seconds_per_sample, 4)} [{num(tp.low, 4)}-{num(tp.high, 4)}]")
        row = [num(b.batch_samples), rate, _spent(b.progress), _spent(b.failure)]
        row += [_spent(b.progress, True), _spent(b.failure, True)] if priced else []
        t.add_row(*row)
    con.print(t)
    where = "none" if tc.b_crit_time is None else (
        (">= " if tc.b_crit_time_bound == "lower" else "") + num(tc.b_crit_time))
    in_samples = estimate_text(a.critical.recommended)
    con.print(f"B_crit in time: {where} (in samples: {in_samples}): {tc.note}")


def render_stability(con, st: dict) -> None:
    """The decision's stability over seed resamples (a clocks.stability.Stability as JSON)."""
    color = "green" if st["settled"] else "yellow"
    con.print(f"[bold {color}]decision {st['verdict']}[/bold {color}]")
    b = st["b_crit"]
    shares = ", ".join(f"{k} {v:.0%}" for k, v in b["shares"].items())
    where = "" if not b["where"] else (f"; its point {count(b['where'][0])}-"
                                       f"{count(b['where'][1])}")
    con.print(f"  over {st['resamples']} seed resamples: B_crit {shares}{where}")
    coll = ", ".join(f"B={k} {v['share']:.0%}" for k, v in st["collapses"].items())
    con.print(f"  median seed collapses: {coll}")
    s = st["schedule"]
    shapes = ", ".join(f"{k} {v:.0%}" for k, v in s["shares"].items())
    switch = "" if not s["switch"] else (f"; switch at {count(s['switch'][0])}-"
                                         f"{count(s['switch'][1])}")
    con.print(f"  schedule {shapes}{switch}")
    for n in st["needs"]:
        con.print(f"  to settle: {n['what']} at B={count(n['batch'])} ({n['why']})")


def render_side_by_side(analyses: list) -> None:
    """Several sweeps' clocks and B_crit in one table (rows: sweep x batch size)."""
    from rich.table import Table

    con = console()
    table = Table(title="sweeps side by side (same analysis options); clocks in samples, "
                        "median [90% bootstrap]")
    for col in ("sweep", "target", "batch", "lr", "runs", "progress clock", "failure clock"):
        table.add_column(col)
    summary = Table(title="per sweep")
    for col in ("sweep", "recommended B_crit", "source", "failure-clock slope", "verdict"):
        summary.add_column(col)
    for a in analyses:
        for i, b in enumerate(a.batches):
            table.add_row(a.sweep if i == 0 else "", num(a.target.value) if i == 0 else "",
                          num(b.batch_samples), ", ".join(f"{x:.3g}" for x in b.lr) or "-",
                          str(b.n_runs), _clock(b.progress), _clock(b.failure))
        inv, rec = a.invariance, a.critical.recommended
        summary.add_row(a.sweep, estimate_text(rec), rec.source or "-",
                        f"{num(inv.slope, 3)} [{num(inv.low, 3)}, {num(inv.high, 3)}]",
                        inv.verdict)
    con.print(table)
    con.print(summary)
    for a in analyses:
        for w in a.warnings:
            con.print(f"[yellow]warning ({a.sweep}):[/yellow] {w}")


def estimate_text(e) -> str:
    """'36 [30, 41]', '>= 10,240', '<= 8', or 'none' (a critical.Estimate), in samples."""
    if e.b_crit is None:
        return "none"
    if e.bound in ("lower", "upper"):
        return f"{'>=' if e.bound == 'lower' else '<='} {num(e.b_crit)}"
    if e.low is not None:
        low = f"<= {num(e.low)}" if e.low_bound else num(e.low)
        return f"{num(e.b_crit)} [{low}, {'open' if e.high is None else num(e.high)}]"
    return num(e.b_crit)


def render_critical(con, crit) -> None:
    """Every B_crit estimate side by side (a result.Critical), then the recommended one and why."""
    from rich.table import Table

    t = Table(title="critical batch size (samples): E(B_crit) = 2 E_min")
    for col in ("estimate", "B_crit [90%]", "placement", "seeds", "note"):
        t.add_column(col)
    for label, e in (("empirical (model-free)", crit.empirical),
                     ("power fit E0(1+(B/Bk)^a)", crit.power),
                     ("linear fit (McCandlish)", crit.mccandlish)):
        note = e.note or ""
        if e.rel_residuals:
            note += "; residuals " + " ".join(f"{r:+.0%}" for r in e.rel_residuals)
        t.add_row(label, estimate_text(e), e.placement or "-", str(e.seeds or "-"), note)
    for label, ns in (("noise scale B_simple", crit.noise_scale),
                      ("sign noise scale B_sign", crit.sign_noise_scale)):
        t.add_row(label, "none" if ns.value is None else num(ns.value), "proxy",
                  str(ns.n_runs or "-"), ns.note)
    th = crit.theory
    if th is not None:
        value = "none" if th.b_crit is None else num(th.b_crit)
        t.add_row("theory (dense simulation)", value, th.method or "-", "-",
                  th.mechanism or th.note or "")
    con.print(t)
    rec = crit.recommended
    con.print(f"[bold]recommended B_crit: {estimate_text(rec)}[/bold] "
              f"({rec.source or 'none'}): {rec.why}")
    if rec.minimum_text():
        con.print(rec.minimum_text())


def write_csv(a, path: str) -> None:
    """One row per run of an analysis: both clocks, rule, censoring."""
    import csv

    from twoclocks_cli.core.errors import ConfigError

    cols = ["run_id", "name", "batch_samples", "batch_prompts", "lr", "clip_low", "clip_high",
            "seed", "status", "partial", "progress_samples", "progress_censored",
            "failure_samples", "failure_rule", "failure_censored", "failure_drift",
            "dips", "noise_scale"]
    try:
        with open(path, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(cols)
            for r in a.runs:
                w.writerow([r.run_id, r.name, r.batch_samples, r.batch_prompts, r.lr,
                            r.clip_low, r.clip_high, r.seed, r.status, r.partial,
                            r.progress.samples, r.progress.censored, r.failure.samples,
                            r.failure.rule, r.failure.censored, r.failure.drift,
                            len(r.failure.dips), r.noise_scale])
    except OSError as exc:
        raise ConfigError(f"--csv {path}: {exc.strerror}") from None
