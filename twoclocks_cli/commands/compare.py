"""`twoclocks schedule-config` and `twoclocks compare`: train a schedule, then check it.

    twoclocks schedule-config SWEEP PHASES.toml --out TRAIN.toml   # phases + the sweep's settings
    twoclocks train TRAIN.toml --name schedule                     # one more run
    twoclocks compare SWEEP --run ID [--json]                      # its clocks vs the constants
"""

from __future__ import annotations

from typing import Annotated

import typer

from twoclocks_cli.options import DbOption, JsonOption


def schedule_config(
    sweep: Annotated[str, typer.Argument(help="The sweep the schedule was derived from.")],
    phases: Annotated[str, typer.Argument(help="The [[phases]] file `twoclocks schedule --out` "
                                               "wrote.")],
    out: Annotated[str, typer.Option("--out", help="Where to write the training config (TOML).")],
    budget: Annotated[int | None, typer.Option(help="Sample budget of the schedule run "
                                                    "(default: where its last phase ends, else "
                                                    "the sweep's).")] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Write a training config that runs a schedule with the sweep's own trainer settings."""
    import os

    from twoclocks_cli.core.errors import ConfigError
    from twoclocks_cli.launch.schedule_run import read_phases, schedule_train_config, to_toml
    from twoclocks_cli.store import Store

    plist = read_phases(phases)
    store = Store.open(db)
    name = store.get_sweep(sweep).name
    cfg = schedule_train_config(store, name, plist, budget)
    text = to_toml(cfg, [f"twoclocks schedule of sweep {name!r} ({phases}), with the sweep's "
                         "trainer settings; run it with `twoclocks train`"])
    tmp = f"{out}.tmp"
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, out)
    except OSError as exc:
        raise ConfigError(f"--out {out}: {exc.strerror}") from None
    if as_json:
        from twoclocks_cli.render.jsonout import print_json

        print_json({"sweep": name, "out": os.path.abspath(out), "phases": len(plist),
                    "sample_budget": cfg["sample_budget"], "config": cfg})
        return
    typer.echo(f"wrote {out}: {len(plist)} phase(s), budget {cfg['sample_budget']:,} samples")


def compare(
    sweep: Annotated[str, typer.Argument(help="The sweep of constant-batch runs.")],
    run: Annotated[int, typer.Option("--run", help="Id of the schedule or adaptive run (see "
                                                   "`twoclocks runs list`).")],
    large_lr: Annotated[str, typer.Option(
        "--large-lr", help="The static schedule's large-phase lr, as `twoclocks schedule "
        "--large-lr`: sweep or hold.")] = "sweep",
    cost: Annotated[str | None, typer.Option("--cost", metavar="FILE", help=(
        "Cost file (TOML) for the clocks in time and cost: step_overhead_s, gen_s_per_sample, "
        "update_s_per_sample, price_per_hour (default: the throughput the stored analysis "
        "measured from the runs' time_* metrics)."))] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Both clocks of a schedule or adaptive run beside the sweep's constant-batch clocks and the
    static schedule it recommends (same options), in samples and, with a throughput, in time
    and cost."""
    from twoclocks_cli.clocks.compare import compare_run
    from twoclocks_cli.clocks.cost import load_cost
    from twoclocks_cli.clocks.schedule import LARGE_LR
    from twoclocks_cli.core.errors import ConfigError
    from twoclocks_cli.store import Store

    if large_lr not in LARGE_LR:
        raise ConfigError(f"--large-lr {large_lr!r}: must be one of {', '.join(LARGE_LR)}")
    cost_model = load_cost(cost) if cost is not None else None
    result = compare_run(Store.open(db), sweep, run, large_lr=large_lr, cost=cost_model)
    if as_json:
        from twoclocks_cli.render.jsonout import print_json

        print_json(result)
        return
    from twoclocks_cli.render.compare import render

    render(result)
