"""`twoclocks runs`: list runs, show one run's config, history and metrics, delete runs."""

from typing import Annotated

import typer

from twoclocks_cli.options import (
    DbOption,
    ForceOption,
    JsonOption,
    KeysOption,
    YesOption,
    parse_keys,
)
from twoclocks_cli.render.jsonout import print_json
from twoclocks_cli.render.runs import render_run, render_runs

app = typer.Typer(help="Runs in the store.", no_args_is_help=True)


@app.command("list")
def list_(
    sweep: Annotated[str | None, typer.Option("--sweep", help="Only runs of this sweep.")] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """List runs (all, or those of one sweep)."""
    from twoclocks_cli.store import Store
    from twoclocks_cli.store.records import run_record

    store = Store.open(db)
    runs = store.list_runs(sweep)
    if as_json:
        print_json([run_record(r) for r in runs])
        return
    render_runs(runs, store.url, sweep)


# -- runs show ------------------------------------------------------------------------------


@app.command("show")
def show(
    run_ref: Annotated[str, typer.Argument(metavar="RUN", help="Run id (or a unique run name).")],
    keys: KeysOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show one run: cell parameters, config, status history, and per metric key the number
    of points, first/last step and samples, min/max and last value."""
    from twoclocks_cli.store import Store
    from twoclocks_cli.store.records import show_record

    store = Store.open(db)
    rec = show_record(store, store.find_run(run_ref), parse_keys(keys))
    if as_json:
        print_json(rec)
        return
    render_run(rec)


# -- runs delete ----------------------------------------------------------------------------


@app.command("delete")
def delete(
    run_refs: Annotated[list[str], typer.Argument(metavar="RUN...", help="Run ids (or unique "
                                                  "run names).")],
    yes: YesOption = False,
    force: ForceOption = False,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Delete runs with their metrics, status history and the stored analyses that used them,
    in one transaction. Submitted/running runs are refused unless --force."""
    from twoclocks_cli.launch import delete as deletion
    from twoclocks_cli.render import deletion as say
    from twoclocks_cli.store import Store

    store = Store.open(db)
    runs = list({r.id: r for r in (store.find_run(ref) for ref in run_refs)}.values())
    busy = deletion.prepare(store, runs, force)
    ids = [r.id for r in runs]
    what = f"run {ids[0]}" if len(ids) == 1 else f"{len(ids)} runs ({', '.join(map(str, ids))})"
    say.confirm(what, {"metrics": store.count_metrics_of(ids)}, yes)
    notes, counts = deletion.execute(store, busy, lambda refuse: store.delete_runs(ids, refuse))
    say.report(what, notes, counts, as_json)
