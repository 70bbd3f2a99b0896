"""`twoclocks status [SWEEP] [--watch] [--json]`: cells and their state, reconciled with the
scheduler (one query per refresh) so a dead job is never shown as running."""

from __future__ import annotations

from typing import Annotated

import typer

from twoclocks_cli.options import DbOption, JsonOption
from twoclocks_cli.render.jsonout import print_json


def status(
    sweep: Annotated[str | None, typer.Argument(help="Sweep name (default: all sweeps).")] = None,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until no cell is running.")]
    = False,
    interval: Annotated[float, typer.Option("--interval", min=0.2, help="Seconds between "
                                            "refreshes with --watch.")] = 2.0,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show the cells of SWEEP (or a summary of all sweeps), reconciled with the scheduler."""
    from twoclocks_cli.launch.monitor import poll, snapshot, watcher
    from twoclocks_cli.render import status as view
    from twoclocks_cli.render.tables import console
    from twoclocks_cli.store import Store

    store = Store.open(db)
    if watch and as_json:  # one JSON object per line per refresh, until nothing runs
        poll(store, sweep, interval, lambda snap: print_json(snap, indent=None))
        return
    if watch:
        view.follow(watcher(store, sweep, interval), sweep)
        return
    snap = snapshot(store, sweep)
    if as_json:
        print_json(snap)
        return
    con = console()
    con.print(view.sweep_table(snap, sweep) if sweep else view.sweeps_table(snap))
    if sweep is None and (alone := view.standalone_table(snap)) is not None:
        con.print(alone)
    view.notes(snap)
