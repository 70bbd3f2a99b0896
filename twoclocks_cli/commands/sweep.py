"""`twoclocks sweep CONFIG`, `twoclocks cancel SWEEP` (`sweeps list` is in sweeps.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from twoclocks_cli.commands.plan import ConfigArg
from twoclocks_cli.options import DbOption

ExecutorOption = Annotated[
    str | None,
    typer.Option("--executor", help="Override the config's executor: local, slurm, debug, auto."),
]


def sweep(
    config: ConfigArg,
    retry_failed: Annotated[bool, typer.Option(
        "--retry-failed", help="Also resubmit failed and cancelled cells.")] = False,
    wait: Annotated[bool, typer.Option(
        "--wait", help="Follow with a live table; exit 1 if a cell failed.")] = False,
    executor: ExecutorOption = None,
    db: DbOption = None,
) -> None:
    """Register CONFIG's cells and submit the pending ones as one batch (one job array).

    Re-running submits nothing completed or running; a changed config adds its new cells.
    """
    from rich.console import Console

    from twoclocks_cli.commands.plan import load_plan, print_warnings
    from twoclocks_cli.commands.status import follow, snapshot, sweep_table
    from twoclocks_cli.errors import ConfigError
    from twoclocks_cli.launch import sweeps
    from twoclocks_cli.store import Store
    from twoclocks_cli.store.engine import resolve_url

    if executor is not None and executor not in ("local", "slurm", "debug", "auto"):
        raise ConfigError(f"--executor {executor!r}: allowed are local, slurm, debug, auto")
    p = load_plan(config)
    cfg = p.config
    print_warnings(p.warnings)
    ex = sweeps.choose_executor(cfg, executor)
    url = sweeps.absolute_db_url(db or cfg.store or resolve_url(None))
    store = Store.open(url)
    reg = sweeps.register(store, p, str(config))
    runs = sweeps.to_submit(store, reg, retry_failed)
    job_ids = sweeps.submit(store, reg, runs, ex, url)
    typer.echo(f"sweep {cfg.name}: {len(p.cells)} cells ({reg.new} new), submitted "
               f"{len(job_ids)} via {ex.name}" + (f" to {store.url}" if job_ids else ""))
    if wait:
        snap = follow(store, cfg.name)
    else:
        snap = snapshot(store, cfg.name)
        Console().print(sweep_table(snap, cfg.name))
    if wait:
        bad = [r for r in snap["runs"] if r["cell_id"] in reg.runs and
               r["status"] in ("failed", "cancelled", "lost")]
        if bad:
            typer.echo(f"{len(bad)} cell(s) failed, were cancelled or lost: "
                       + "; ".join(f"run {r['id']}: {r['error'] or r['status']}" for r in bad[:3]),
                       err=True)
            raise typer.Exit(1)


def cancel(
    sweep_name: Annotated[str, typer.Argument(metavar="SWEEP", help="Sweep to cancel.")],
    db: DbOption = None,
) -> None:
    """Cancel every planned, submitted or running cell of SWEEP (one scheduler call)."""
    from twoclocks_cli.errors import LaunchError
    from twoclocks_cli.launch import sweeps
    from twoclocks_cli.store import Store

    store = Store.open(db)
    n, problems = sweeps.cancel(store, sweep_name)
    typer.echo(f"sweep {sweep_name}: cancelled {n} cell(s)")
    if problems:
        raise LaunchError("cells marked cancelled, but stopping their jobs failed: "
                          + "; ".join(problems))
