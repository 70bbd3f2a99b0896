"""`twoclocks analyze [SWEEP]`: both clocks per run and batch, B_crit three ways, invariance."""

from __future__ import annotations

from typing import Annotated

import typer

from twoclocks_cli.core.numbers import count, num
from twoclocks_cli.options import DbOption, JsonOption, out_path
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


def render(a) -> None:
    """Rich tables of an analysis (a clocks.result.Analysis)."""
    from rich.table import Table

    con = console()
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
    con.print(table)
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
        ct = Table(title="clipping")
        for col in ("clip_low", "clip_high", "batch", "runs", "progress", "failure"):
            ct.add_column(col)
        for row in a.clipping:
            ct.add_row(num(row.clip_low), num(row.clip_high), num(row.batch_samples),
                       str(row.n_runs), num(row.progress_median), num(row.failure_median))
        con.print(ct)
    for w in a.warnings:
        con.print(f"[yellow]warning:[/yellow] {w}")


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
    con.print(f"B_crit in time: {where} (in samples: {_est(a.critical.recommended)}): {tc.note}")


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
        summary.add_row(a.sweep, _est(rec), rec.source or "-",
                        f"{num(inv.slope, 3)} [{num(inv.low, 3)}, {num(inv.high, 3)}]",
                        inv.verdict)
    con.print(table)
    con.print(summary)
    for a in analyses:
        for w in a.warnings:
            con.print(f"[yellow]warning ({a.sweep}):[/yellow] {w}")


def _est(e) -> str:
    """'36 [30, 41]', '>= 10,240', '<= 8', or 'none' (a critical.Estimate), in samples."""
    if e.b_crit is None:
        return "none"
    if e.bound in ("lower", "upper"):
        return f"{'>=' if e.bound == 'lower' else '<='} {num(e.b_crit)}"
    if e.low is not None:
        return f"{num(e.b_crit)} [{num(e.low)}, {'open' if e.high is None else num(e.high)}]"
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
        t.add_row(label, _est(e), e.placement or "-", str(e.seeds or "-"), note)
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
    con.print(f"[bold]recommended B_crit: {_est(rec)}[/bold] ({rec.source or 'none'}): {rec.why}")


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


def analyze(
    sweeps: Annotated[
        list[str] | None, typer.Argument(
            metavar="[SWEEP]...",
            help="Sweep name (default: the only sweep); several sweeps are analysed with the "
                 "same options and put side by side.")
    ] = None,
    metric: Annotated[
        str | None,
        typer.Option(
            help="Progress metric (default: eval_accuracy when logged, else reward_mean)."
        ),
    ] = None,
    target: Annotated[
        str,
        typer.Option(
            help="Target: a value, or frac:X of the way from the initial value to the sweep's best."
        ),
    ] = "frac:0.5",
    smoothing: Annotated[str, typer.Option(help="ma (centred moving average), ema, none.")] = "ma",
    window: Annotated[int, typer.Option(help="Moving-average window (logged points).")] = 5,
    span_samples: Annotated[
        float | None,
        typer.Option(help="Moving average over this many samples instead of --window points."),
    ] = None,
    ema_alpha: Annotated[float, typer.Option(help="EMA weight of the newest point.")] = 0.3,
    drop: Annotated[bool, typer.Option("--drop/--no-drop", help="The drop collapse rule.")] = True,
    drop_rho: Annotated[
        float, typer.Option(help="drop: fraction of the gain that may be lost.")
    ] = 0.3,
    drop_delta: Annotated[float, typer.Option(help="drop: minimum fall, metric units.")] = 0.05,
    drop_k: Annotated[int, typer.Option(help="drop: consecutive points below the floor.")] = 3,
    dips: Annotated[bool, typer.Option("--dips/--no-dips", help=(
        "A fall that climbs back later in the run is a dip, counted apart from collapses "
        "(--no-dips: every fall is a collapse)."))] = True,
    dip_recover: Annotated[float, typer.Option(help=(
        "dips: back above peak - this x the fall's allowance counts as recovered (0: the "
        "full peak, 1: the floor)."))] = 0.5,
    drop_metric: Annotated[str | None, typer.Option(help=(
        "held-out drop rule: the drop rule also on this metric (e.g. eval_accuracy while "
        "--metric is the training reward): a failure where the progress metric still rises. "
        "Default: off."))] = None,
    drift_key: Annotated[str, typer.Option(help="drift rule metric.")] = "drift_abs",
    drift_threshold: Annotated[
        float | None, typer.Option(help="drift rule threshold D (default: rule off).")
    ] = None,
    entropy_low: Annotated[float | None, typer.Option(help="entropy rule: band low edge.")] = None,
    entropy_high: Annotated[
        float | None, typer.Option(help="entropy rule: band high edge.")
    ] = None,
    length_max: Annotated[
        float | None, typer.Option(help="length rule: resp_len_mean bound.")
    ] = None,
    truncated_max: Annotated[
        float | None, typer.Option(help="length rule: truncated_frac bound.")
    ] = None,
    invariance_margin: Annotated[
        float, typer.Option(help="Equivalence margin on the failure-clock slope (0: per sample).")
    ] = 0.25,
    bootstrap: Annotated[int, typer.Option(help="Bootstrap replicates.")] = 1000,
    stability: Annotated[int, typer.Option(help=(
        "Seed resamples of the whole decision (B_crit, collapses, schedule): how settled it is "
        "(0: not measured)."))] = 200,
    seed: Annotated[int, typer.Option(help="Bootstrap RNG seed.")] = 0,
    theory: Annotated[
        bool, typer.Option("--theory/--no-theory", help="Theory B_crit for sim sweeps.")
    ] = True,
    csv: Annotated[
        str | None, typer.Option("--csv", help="Write per-run clocks to this CSV.",
                                  callback=out_path)
    ] = None,
    plot: Annotated[str | None, typer.Option(
        "--plot", help="Write a two-panel PNG here.", callback=out_path)] = None,
    save: Annotated[
        bool, typer.Option("--save/--no-save", "--store/--no-store", help=(
            "Save the result in the analyses table (an identical stored one is reused, not "
            "stored twice); `schedule` and `report` then use it. Default: nothing is stored."))
    ] = False,
    cost: Annotated[str | None, typer.Option("--cost", metavar="FILE", help=(
        "Cost file (TOML) for the clocks in time and cost: step_overhead_s, gen_s_per_sample, "
        "update_s_per_sample, price_per_hour (default: the runs' time_* metrics)."))] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Measure the progress and failure clocks of a sweep and fit the critical batch size.

    Nothing is stored unless --save (then `analysis_id` in --json is its row; else null)."""
    from twoclocks_cli.clocks import AnalysisOptions, analyze_sweep
    from twoclocks_cli.clocks.saved import save_analysis
    from twoclocks_cli.store import Store

    opts = AnalysisOptions(
        metric=metric,
        target=target,
        smoothing=smoothing,
        window=window,
        span_samples=span_samples,
        invariance_margin=invariance_margin,
        ema_alpha=ema_alpha,
        drop=drop,
        drop_rho=drop_rho,
        drop_delta=drop_delta,
        drop_k=drop_k,
        dips=dips,
        dip_recover=dip_recover,
        drop_metric=drop_metric,
        drift_key=drift_key,
        drift_threshold=drift_threshold,
        entropy_low=entropy_low,
        entropy_high=entropy_high,
        length_max=length_max,
        truncated_max=truncated_max,
        bootstrap=bootstrap,
        stability=stability,
        seed=seed,
        theory=theory,
    )
    from twoclocks_cli.clocks.cost import load_cost

    cost_model = load_cost(cost) if cost is not None else None
    store = Store.open(db)
    if sweeps and len(sweeps) > 1:
        if csv or plot:
            from twoclocks_cli.core.errors import ConfigError

            raise ConfigError("--csv and --plot take one sweep; several sweeps are compared "
                              "side by side (drop --csv/--plot, or name one sweep)")
        names = [store.get_sweep(n).name for n in dict.fromkeys(sweeps)]  # NotFound first
        analyses = [analyze_sweep(store, n, opts, cost_model) for n in names]
        if save:
            for n, a in zip(names, analyses, strict=True):
                save_analysis(store, n, a)
        if as_json:
            from twoclocks_cli.render.jsonout import print_json

            print_json({"sweeps": [a.to_json() for a in analyses]})
        else:
            render_side_by_side(analyses)
        return
    name = store.sweep_named(sweeps[0] if sweeps else None)
    result = analyze_sweep(store, name, opts, cost_model)
    if save:
        save_analysis(store, name, result)
    if csv:
        write_csv(result, csv)
    if plot:
        from twoclocks_cli.render.plot import plot_analysis

        plot_analysis(store, result, plot)
    if as_json:
        typer.echo(result.dumps())
    else:
        render(result)
