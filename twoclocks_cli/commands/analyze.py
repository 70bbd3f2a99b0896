"""`twoclocks analyze [SWEEP]`: both clocks per run and batch, B_crit three ways, invariance.

Its analysis options are `clocks.options.AnalysisOptions`' fields, generated from the model
(default and help in one place); the tables and the CSV are `render.analysis`'s."""

from __future__ import annotations

from typing import Annotated

import typer

from twoclocks_cli.clocks.options import AnalysisOptions
from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.options import DbOption, JsonOption, out_path, with_model_options
from twoclocks_cli.render.analysis import render_analysis, render_side_by_side, write_csv
from twoclocks_cli.render.jsonout import print_json


@with_model_options(AnalysisOptions, after="sweeps")
def analyze(
    sweeps: Annotated[
        list[str] | None, typer.Argument(
            metavar="[SWEEP]...",
            help="Sweep name (default: the only sweep); several sweeps are analysed with the "
                 "same options and put side by side.")
    ] = None,
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
    **options,
) -> None:
    """Measure the progress and failure clocks of a sweep and fit the critical batch size.

    Nothing is stored unless --save (then `analysis_id` in --json is its row; else null)."""
    from twoclocks_cli.clocks.cost import load_cost
    from twoclocks_cli.store import Store

    opts = AnalysisOptions(**options)  # every option's bounds, before the store is opened
    cost_model = load_cost(cost) if cost is not None else None
    store = Store.open(db)
    if sweeps and len(sweeps) > 1:
        if csv or plot:
            raise ConfigError("--csv and --plot take one sweep; several sweeps are compared "
                              "side by side (drop --csv/--plot, or name one sweep)")
        _analyze_several(store, sweeps, opts, cost_model, save, as_json)
    else:
        _analyze_one(store, sweeps[0] if sweeps else None, opts, cost_model, save, as_json,
                     csv, plot)


def _analyze_several(store, sweeps: list[str], opts, cost_model, save: bool,
                     as_json: bool) -> None:
    """Several sweeps with the same options, side by side (--json: one list)."""
    from twoclocks_cli.clocks import analyze_sweep
    from twoclocks_cli.clocks.saved import save_analysis

    names = [store.get_sweep(n).name for n in dict.fromkeys(sweeps)]  # NotFound first
    analyses = [analyze_sweep(store, n, opts, cost_model) for n in names]
    if save:
        for n, a in zip(names, analyses, strict=True):
            save_analysis(store, n, a)
    if as_json:
        print_json({"sweeps": [a.to_json() for a in analyses]})
    else:
        render_side_by_side(analyses)


def _analyze_one(store, sweep: str | None, opts, cost_model, save: bool, as_json: bool,
                 csv: str | None, plot: str | None) -> None:
    """One sweep (the only one when unnamed): tables or --json, and the CSV and plot asked for."""
    from twoclocks_cli.clocks import analyze_sweep
    from twoclocks_cli.clocks.saved import save_analysis

    name = store.sweep_named(sweep)
    result = analyze_sweep(store, name, opts, cost_model)
    if save:
        save_analysis(store, name, result)
    if csv:
        write_csv(result, csv)
    if plot:
        from twoclocks_cli.render.plot import plot_analysis

        curves = store.load_metric([r.run_id for r in result.runs], result.metric)
        plot_analysis(curves, result, plot)
    if as_json:
        typer.echo(result.dumps())
    else:
        render_analysis(result)
