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

    from twoclocks_cli.clocks.compare import read_phases, schedule_train_config, to_toml
    from twoclocks_cli.core.errors import ConfigError
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
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Both clocks of a schedule or adaptive run beside the sweep's constant-batch clocks and the
    static schedule it recommends (same options)."""
    from twoclocks_cli.clocks.compare import compare_run
    from twoclocks_cli.clocks.schedule import LARGE_LR
    from twoclocks_cli.core.errors import ConfigError
    from twoclocks_cli.store import Store

    if large_lr not in LARGE_LR:
        raise ConfigError(f"--large-lr {large_lr!r}: must be one of {', '.join(LARGE_LR)}")
    result = compare_run(Store.open(db), sweep, run, large_lr=large_lr)
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


def render(result: dict) -> None:
    """A rich table: constant batches, then the schedule row; the phases; the verdict."""
    from rich.table import Table

    from twoclocks_cli.core.numbers import count, num
    from twoclocks_cli.render.tables import console

    con = console()
    t = result["target"]
    table = Table(title=f"schedule vs constant batches ({result['sweep']}): samples to "
                  f"{result['metric']} {t['value']:.3g} ({t['spec']}), samples to failure")
    for col in ("run", "batch: samples (prompts)", "lr", "seeds", "to target", "failure",
                "final"):
        table.add_column(col)
    for row in result["constant"]:
        final = "-" if row["final"] is None else f"{row['final']:.3f}"
        prompts = ",".join(str(x) for x in row["batch_prompts"])
        table.add_row("constant", f"{num(row['batch_samples'])} ({prompts})",
                      ", ".join(f"{x:.3g}" for x in row["lr"]), str(row["n_runs"]),
                      _clock(row["progress"]), _clock(row["failure"]), final)
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
                      "unknown" if pf is None else count(pf), "-")
    table.add_row(f"{kind} #{s['run_id']}", batches, lrs, "1", _one(s["progress"]),
                  _one(s["failure"]), f"{s['final']:.3f}")
    con.print(table)
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
