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
    render(result)


def merged_phases(phases: list[dict]) -> list[dict]:
    """Consecutive phases with the same batch as one (an adaptive run's decisions that kept
    the batch), its lr the last one's: the controller's lr follows the batch, so within one
    batch only an lr warm-up moves it, and the lr it reached is the one to show."""
    out: list[dict] = []
    for p in phases:
        last = out[-1] if out else None
        if last and last["prompts_per_batch"] == p["prompts_per_batch"]:
            last["to_samples"], last["steps"] = p["to_samples"], last["steps"] + p["steps"]
            last["lr"] = p["lr"]
        else:
            out.append(dict(p))
    return out


def _clock(c: dict) -> str:
    from twoclocks_cli.core.numbers import count

    if c.get("median") is not None:
        lo, hi = c.get("low"), c.get("high")
        return count(c["median"]) + (f" [{count(lo)}, {count(hi)}]" if lo is not None else "")
    lb = c.get("lower_bound")
    return f">= {count(lb)} (censored)" if lb is not None else "censored"


def _one(c: dict) -> str:
    from twoclocks_cli.core.numbers import count

    if c["samples"] is not None:
        return count(c["samples"]) + (f" ({c['rule']})" if c.get("rule") else "")
    return f">= {count(c['censored_at'])} (censored)"


def _hours(sp: dict | None, money: bool = False) -> str:
    """One clock in hours (or money): median [interval], '>= bound' when censored, '-' when
    unknown."""
    from twoclocks_cli.core.numbers import num

    if sp is None:
        return "-"
    value, low, high = (sp["cost"], sp["cost_low"], sp["cost_high"]) if money else (
        sp["seconds"], sp["low"], sp["high"])
    scale, unit = (1.0, "") if money else (3600.0, " h")
    if value is None:
        bound = sp["lower_bound"]
        return "-" if money or bound is None else f">= {num(bound / scale, 3)}{unit} (censored)"
    text = f"{num(value / scale, 3)}{unit}"
    if low is None or low == high:  # one seed at an exact throughput: no interval
        return text
    hi = "censored" if high is None else num(high / scale, 3)
    return f"{text} [{num(low / scale, 3)}-{hi}]"


def _time_cells(time: dict | None, sp: tuple[dict, dict] | None) -> list[str]:
    """The time (and cost) columns of one row: to target, to failure."""
    if time is None:
        return []
    prog, fail = sp if sp is not None else (None, None)
    cells = [_hours(prog), _hours(fail)]
    if time["price_per_hour"] is not None:
        cells += [_hours(prog, True), _hours(fail, True)]
    return cells


def _pair(doc: dict | None) -> tuple[dict, dict] | None:
    return None if doc is None else (doc["progress"], doc["failure"])


def render(result: dict) -> None:
    """A rich table: constant batches, then the schedule row, in samples and (with a
    throughput) in hours and cost; the phases; the verdict."""
    from rich.table import Table

    from twoclocks_cli.core.numbers import count, num
    from twoclocks_cli.render.tables import console

    con = console()
    t = result["target"]
    time = result.get("time")
    title = (f"schedule vs constant batches ({result['sweep']}): samples to "
             f"{result['metric']} {t['value']:.3g} ({t['spec']}), samples to failure")
    if time is not None:
        title += (f"; hours ({time['source']} throughput" + (
            f", cost at {time['price_per_hour']:g} per hour" if time["price_per_hour"]
            is not None else "") + "), median [90%]")
    table = Table(title=title)
    cols = ["run", "batch: samples (prompts)", "lr", "seeds", "to target", "failure", "final"]
    if time is not None:
        cols += ["time to target", "time to failure"]
        cols += ["cost to target", "cost to failure"] if time["price_per_hour"] is not None \
            else []
    for col in cols:
        table.add_column(col)
    timed = {b["batch_samples"]: b for b in (time or {}).get("batches", [])}
    for row in result["constant"]:
        final = "-" if row["final"] is None else f"{row['final']:.3f}"
        prompts = ",".join(str(x) for x in row["batch_prompts"])
        tb = timed.get(row["batch_samples"])
        table.add_row("constant", f"{num(row['batch_samples'])} ({prompts})",
                      ", ".join(f"{x:.3g}" for x in row["lr"]), str(row["n_runs"]),
                      _clock(row["progress"]), _clock(row["failure"]), final,
                      *_time_cells(time, tb and (tb["progress"], tb["failure"])))
    s = result["schedule"]
    kind = result.get("kind", "schedule")
    phases = merged_phases(s["phases"])
    batches = " -> ".join(f"({p['prompts_per_batch']})" for p in phases) or "-"
    lrs = " -> ".join("-" if p["lr"] is None else f"{p['lr']:.3g}" for p in phases) or "-"
    static = result.get("static_schedule")
    if static and static["phases"]:
        pred = static["predicted"]
        pp, pf = pred["progress_samples"], pred["failure_samples"]
        table.add_row("static schedule (predicted)",
                      " -> ".join(f"({p['prompts_per_batch']})" for p in static["phases"]),
                      " -> ".join(f"{p['lr']:.3g}" for p in static["phases"]), "-",
                      "unknown" if pp is None else count(pp),
                      "unknown" if pf is None else count(pf), "-",
                      *_time_cells(time, _pair((time or {}).get("static_schedule"))))
    table.add_row(f"{kind} #{s['run_id']}", batches, lrs, "1", _one(s["progress"]),
                  _one(s["failure"]), f"{s['final']:.3f}",
                  *_time_cells(time, _pair((time or {}).get("schedule"))))
    con.print(table)
    if time is None and result.get("time_note"):
        con.print(result["time_note"])
    if static and static["phases"]:
        pred = static["predicted"]
        con.print(f"static schedule (`twoclocks schedule`): progress {pred['progress_why']}; "
                  f"failure {pred['failure_why']}")
    elif static:
        con.print(f"static schedule: none ({static['why']})")
    con.print(f"{kind} run {s['run_id']} ({s['status']}):")
    for p in phases:
        lr = "-" if p["lr"] is None else f"{p['lr']:.4g}"
        con.print(f"  phase {p['phase']}: samples {count(p['from_samples'])}-"
                  f"{count(p['to_samples'])}, "
                  f"{p['prompts_per_batch']} prompts/batch, lr {lr}, {p['steps']} steps")
    for line in result["verdict"]:
        con.print(f"  {line}")
