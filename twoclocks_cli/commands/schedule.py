"""`twoclocks schedule [SWEEP]`: small batch first, switch to a large batch before failure."""

from __future__ import annotations

from typing import Annotated

import typer

from twoclocks_cli.options import SAFETY, SAMPLES, DbOption, JsonOption, out_path, within
from twoclocks_cli.render.jsonout import print_json
from twoclocks_cli.render.schedule import render_schedule


def schedule(
    sweep: Annotated[
        str | None, typer.Argument(help="Sweep name (default: the only sweep).")
    ] = None,
    out: Annotated[str | None, typer.Option(
        "--out", help="Write the phase list as TOML.", callback=out_path)] = None,
    safety: Annotated[float, typer.Option(
        help="Switch at safety x lower bound of N_fail, in (0, 1].", callback=SAFETY)] = 0.8,
    budget: Annotated[
        float | None,
        typer.Option(help="Samples the schedule runs to (default: the sweep's longest run).",
                     callback=SAMPLES),
    ] = None,
    reanalyze: Annotated[
        bool,
        typer.Option(
            help="Analyse afresh with default options instead "
            "of reusing the latest stored analysis."
        ),
    ] = False,
    large_lr: Annotated[
        str,
        typer.Option(
            "--large-lr",
            help="The large phase's lr: sweep (the large batch's own, by the scaling rule) or "
            "hold (the small phase's: the large batch's sqrt lr can break a trained policy).",
        ),
    ] = "sweep",
    stability: Annotated[int, typer.Option(help=(
        "Seed resamples of the decision: how settled the schedule is (0: not measured)."),
        callback=within(0, 100_000))
    ] = 200,
    objective: Annotated[str, typer.Option(help=(
        "The clock the small batch minimises: samples (B_crit's rule), time or cost to the "
        "target (measured time_* throughput, or --cost)."))] = "samples",
    cost: Annotated[str | None, typer.Option("--cost", metavar="FILE", help=(
        "Cost file (TOML): step_overhead_s, gen_s_per_sample, update_s_per_sample, "
        "price_per_hour (examples/gpu-cost.toml)."))] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Recommend phases (until_samples, batch, lr, clip) from the analysed clocks of a sweep."""
    from twoclocks_cli.clocks.cost import OBJECTIVES, load_cost
    from twoclocks_cli.clocks.sweep_schedule import schedule_sweep
    from twoclocks_cli.core.errors import ConfigError
    from twoclocks_cli.store import Store

    if objective not in OBJECTIVES:
        raise ConfigError(f"--objective {objective!r}: must be one of {', '.join(OBJECTIVES)}")
    cost_model = load_cost(cost) if cost is not None else None
    if objective == "cost" and cost_model is not None and cost_model.price_per_hour is None:
        raise ConfigError(f"--objective cost: {cost} has no price_per_hour: give one")
    store = Store.open(db)
    name = store.sweep_named(sweep)
    result = schedule_sweep(store, name, safety=safety, budget=budget, reanalyze=reanalyze,
                            large_lr=large_lr, stability=stability, objective=objective,
                            cost=cost_model)
    if out:
        _write_toml(out, result)
    if as_json:
        print_json(result)
    else:
        render_schedule(result, name, out)


def _write_toml(out: str, result: dict) -> None:
    """The schedule's phase list as TOML at --out."""
    from twoclocks_cli.clocks import to_toml
    from twoclocks_cli.core.errors import ConfigError

    try:
        with open(out, "w") as fh:
            fh.write(to_toml(result))
    except OSError as exc:
        raise ConfigError(f"--out {out}: {exc.strerror}") from None
