"""`twoclocks runs`: list runs with their cell parameters and status."""

import json
from typing import Annotated

import typer

from twoclocks_cli.options import DbOption, JsonOption

app = typer.Typer(help="Runs in the store.", no_args_is_help=True)


def run_record(run) -> dict:
    """A run as plain JSON-ready values (the --json schema of `runs list`)."""
    return {
        "id": run.id,
        "sweep_id": run.sweep_id,
        "cell_id": run.cell_id,
        "name": run.name,
        "backend": run.backend,
        "batch_prompts": run.batch_prompts,
        "group_size": run.group_size,
        "batch_samples": run.batch_samples,
        "lr": run.lr,
        "clip_low": run.clip_low,
        "clip_high": run.clip_high,
        "seed": run.seed,
        "status": run.status,
        "job_id": run.job_id,
        "host": run.host,
        "attempts": run.attempts,
        "error": run.error,
        "created_at": run.created_at.isoformat() if run.created_at else None,
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
    }


@app.command("list")
def list_(
    sweep: Annotated[str | None, typer.Option("--sweep", help="Only runs of this sweep.")] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """List runs (all, or those of one sweep)."""
    from twoclocks_cli.store import Store

    store = Store.open(db)
    runs = store.list_runs(sweep)
    if as_json:
        typer.echo(json.dumps([run_record(r) for r in runs], indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"runs in {store.url}" + (f" (sweep {sweep})" if sweep else ""))
    for col in ("id", "name", "backend", "prompts", "samples/batch", "lr", "seed", "status"):
        table.add_column(col)
    for r in runs:
        table.add_row(
            str(r.id), r.name, r.backend, str(r.batch_prompts or "-"),
            str(r.batch_samples or "-"), f"{r.lr:.3g}" if r.lr is not None else "-",
            str(r.seed if r.seed is not None else "-"), r.status,
        )
    Console().print(table)
    if not runs:
        typer.echo("no runs yet")
