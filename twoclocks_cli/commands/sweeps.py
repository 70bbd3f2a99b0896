"""`twoclocks sweeps`: list sweeps with their cell counts; delete a sweep with everything in it."""

from __future__ import annotations

from typing import Annotated

import typer

from twoclocks_cli.options import DbOption, ForceOption, JsonOption, YesOption
from twoclocks_cli.render.jsonout import print_json

app = typer.Typer(help="Sweeps in the store.", no_args_is_help=True)


@app.command("list")
def list_sweeps(db: DbOption = None, as_json: JsonOption = False) -> None:
    """List sweeps with their cell counts by status."""
    from twoclocks_cli.render.sweeps import render_sweeps
    from twoclocks_cli.store import Store

    store = Store.open(db)
    counts = store.status_counts()
    rows = store.all_sweeps()
    records = [{"id": w.id, "name": w.name, "backend": w.backend, "executor": w.executor,
                "folder": w.folder, "created_at": w.created_at.isoformat(),
                "cells": dict(counts.get(w.name, {}))} for w in rows]
    if as_json:
        print_json(records)
        return
    render_sweeps(records, store.url)


@app.command("delete")
def delete(
    name: Annotated[str, typer.Argument(metavar="NAME", help="Sweep to delete.")],
    yes: YesOption = False,
    force: ForceOption = False,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Delete sweep NAME with its runs, their metrics and status history, and its stored
    analyses, in one transaction. Submitted/running runs are refused unless --force."""
    from twoclocks_cli.launch import delete as deletion
    from twoclocks_cli.render import deletion as say
    from twoclocks_cli.store import Store

    store = Store.open(db)
    runs = store.list_runs(name)
    busy = deletion.prepare(store, runs, force, alone=False)
    metrics = store.count_metrics_of([r.id for r in runs])
    what = f"sweep {name}"
    say.confirm(what, {"runs": len(runs), "metrics": metrics}, yes)
    notes, counts = deletion.execute(store, busy, lambda refuse: store.delete_sweep(name, refuse),
                                     lambda: deletion.cancel_sweep(store, name))
    say.report(what, notes, counts, as_json)
