"""`twoclocks probe RUN --at SAMPLES`: the local critical batch size at one point of a run."""

from __future__ import annotations

from typing import Annotated

import typer

from twoclocks_cli.options import DbOption, JsonOption


def _floats(text: str, option: str) -> list[float]:
    from twoclocks_cli.core.errors import ConfigError

    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{option} {text!r}: a comma-separated list of numbers") from None


def probe(
    run_id: Annotated[int, typer.Argument(metavar="RUN", help="The run id to branch.")],
    at: Annotated[float, typer.Option("--at", help="Branch at this many samples of the run.")],
    batches: Annotated[str, typer.Option(
        "--batches", help="Batch sizes of the branches, in samples (e.g. 8,16,32,64,128).")],
    branch_samples: Annotated[float, typer.Option(
        "--branch-samples", help="Samples each branch may spend.")],
    seeds: Annotated[int, typer.Option(help="Branches per batch size.")] = 3,
    seed: Annotated[int, typer.Option(help="Seed of the branches' noise.")] = 0,
    truth: Annotated[bool, typer.Option(
        "--truth/--no-truth", help="Also the theory model's local B_crit from the same state "
        "(sim runs; a dense simulation, seconds to a minute).")] = False,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Branch a run at one point over several batch sizes and measure its local B_crit.

    Supported for sim runs (the state is rebuilt by replaying the run); the GRPO trainer's
    branching is not built yet.
    """
    import json

    from twoclocks_cli.probe import probe_run
    from twoclocks_cli.store import Store

    sizes = _floats(batches, "--batches")
    store = Store.open(db)
    result = probe_run(store, run_id, at, sizes, branch_samples, seeds=seeds, seed=seed,
                       truth=truth)
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=2, allow_nan=False))
        return
    from rich.table import Table

    from twoclocks_cli.core.numbers import count, num
    from twoclocks_cli.render.tables import console

    con = console()
    t = Table(title=f"run {run_id} branched at {result.at_samples:,.0f} samples: samples from "
                    f"progress {result.progress_at:.4g} to {result.target:.4g}")
    for col in ("batch", "lr", "median", "per seed"):
        t.add_column(col)
    for b, lr in zip(result.batches, result.lrs, strict=True):
        vals = result.clocks[b]
        got = sorted(v for v in vals if v is not None)
        med = "censored" if len(got) * 2 <= len(vals) else count(got[len(vals) // 2])
        t.add_row(num(b), num(lr, 3), med,
                  ", ".join("censored" if v is None else count(v) for v in vals))
    con.print(t)
    est = result.b_crit
    con.print(f"[bold]local B_crit: {est.text()}[/bold] ({est.placement}; {est.note})")
    if result.truth is not None:
        tb = result.truth.b_crit
        con.print(f"theory's local B_crit from the same state: "
                  f"{'none' if tb is None else num(tb)} ({result.truth.mechanism})")
    for n in result.notes:
        con.print(f"note: {n}")
