"""`twoclocks status [SWEEP] [--watch] [--json]`: cells and their state, reconciled with the
scheduler (one query per refresh) so a dead job is never shown as running."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from twoclocks_cli.core.numbers import num
from twoclocks_cli.options import DbOption, JsonOption
from twoclocks_cli.render.jsonout import print_json
from twoclocks_cli.render.tables import console

ORDER = ("planned", "submitted", "running", "lost", "completed", "diverged", "failed",
         "cancelled")
STYLE = {"completed": "green", "diverged": "yellow", "failed": "red", "cancelled": "magenta",
         "running": "cyan", "lost": "orange3"}
LOST_HINT = ("{n} lost cell(s) (their job vanished without reporting): a plain `twoclocks sweep "
             "CONFIG` resumes them from their checkpoints")


def snapshot(store, sweep: str | None) -> dict:
    """Reconcile once, then read: per-sweep counts, and the runs of `sweep` when given."""
    from twoclocks_cli.commands.runs import run_record
    from twoclocks_cli.launch import sweeps

    if sweep is not None:
        store.get_sweep(sweep)
    ref = sweeps.refresh(store, sweep)
    out = {"queries": ref.queries, "reconciled": ref.fixed, "problems": ref.problems,
           "sweeps": {k: dict(v) for k, v in store.status_counts(sweep).items()}}
    if sweep is not None:
        runs = store.list_runs(sweep)
        steps = store.last_steps([r.id for r in runs])
        out["runs"] = [{**run_record(r), "last_step": steps.get(r.id)} for r in runs]
    else:  # runs of `twoclocks train` (no sweep) are shown too
        alone = [r for r in store.list_runs() if r.sweep_id is None]
        steps = store.last_steps([r.id for r in alone])
        out["standalone"] = [{**run_record(r), "last_step": steps.get(r.id)} for r in alone]
    return out


def standalone_table(snap: dict):
    """The runs of `twoclocks train` (not in any sweep), or None when there are none."""
    from rich.table import Table

    rows = snap.get("standalone") or []
    if not rows:
        return None
    table = Table(title=f"runs of `twoclocks train` (no sweep): {len(rows)}")
    for col in ("run", "name", "B", "lr", "status", "step"):
        table.add_column(col, justify="right" if col in ("run", "B", "lr", "step") else "left",
                         no_wrap=True)
    table.add_column("error", overflow="fold")
    for r in rows:
        st = r["status"]
        table.add_row(str(r["id"]), str(r["name"] or "-"), num(r["batch_samples"]),
                      f"{r['lr']:.3g}" if r["lr"] else "-", f"[{STYLE.get(st, 'white')}]{st}[/]",
                      num(r["last_step"]), (r["error"] or "")[:80])
    return table


def sweep_table(snap: dict, sweep: str):
    from rich.table import Table

    counts = snap["sweeps"].get(sweep, {})
    summary = ", ".join(f"{counts[s]} {s}" for s in ORDER if counts.get(s))
    table = Table(title=f"sweep {sweep}: {summary or 'no cells'}")
    for col in ("run", "P", "B", "lr", "seed", "status", "job", "try", "step"):
        table.add_column(col, justify="right" if col not in ("status", "job") else "left",
                         no_wrap=True)
    table.add_column("error", overflow="fold")
    for r in snap["runs"]:
        st = r["status"]
        job = r["job_id"] or "-"
        if ":" in job:  # local:HOST:RUNNER[:PID] / debug:HOST:PID -> kind:pid
            job = f"{job.split(':')[0]}:{job.split(':')[-1]}"
        table.add_row(str(r["id"]), num(r["batch_prompts"]), num(r["batch_samples"]),
                      f"{r['lr']:.3g}" if r["lr"] else "-", str(r["seed"]),
                      f"[{STYLE.get(st, 'white')}]{st}[/]",
                      job, str(r["attempts"]), num(r["last_step"]),
                      (r["error"] or "")[:80])
    return table


def sweeps_table(snap: dict):
    from rich.table import Table

    table = Table(title="sweeps")
    table.add_column("sweep", no_wrap=True)
    for s in ORDER:
        table.add_column(s, justify="right")
    for name, counts in sorted(snap["sweeps"].items()):
        table.add_row(name, *[num(counts[s]) if counts.get(s) else "" for s in ORDER])
    return table


def waiting(snap: dict, sweep: str | None) -> bool:
    """Any run still submitted or running?"""
    tables = [snap["sweeps"].get(sweep, {})] if sweep else list(snap["sweeps"].values())
    return any(c.get("submitted") or c.get("running") for c in tables)


def follow(store, sweep: str | None, interval: float = 2.0) -> dict:
    """Live table until nothing of `sweep` is submitted or running; returns the last snapshot."""
    from rich.live import Live

    snap = snapshot(store, sweep)
    render = (lambda s: sweep_table(s, sweep)) if sweep else sweeps_table
    with Live(render(snap), console=console(), refresh_per_second=4) as live:
        while waiting(snap, sweep):
            time.sleep(interval)
            snap = snapshot(store, sweep)
            live.update(render(snap))
    _notes(snap)
    return snap


def wait_quietly(store, sweep: str, interval: float = 2.0) -> dict:
    """Like `follow` with nothing on stdout (for --json): poll until nothing of `sweep` is
    submitted or running; notes on stderr; returns the last snapshot."""
    snap = snapshot(store, sweep)
    while waiting(snap, sweep):
        time.sleep(interval)
        snap = snapshot(store, sweep)
    _notes(snap)
    return snap


def _notes(snap: dict) -> None:
    """Scheduler problems, and how to resume lost cells, on stderr."""
    for p in snap["problems"]:
        typer.echo(f"warning: {p}", err=True)
    lost = sum(c.get("lost", 0) for c in snap["sweeps"].values())
    if lost:
        typer.echo(LOST_HINT.format(n=lost), err=True)


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
    from twoclocks_cli.store import Store

    store = Store.open(db)
    if watch and as_json:  # one JSON object per line per refresh, until nothing runs
        while True:
            snap = snapshot(store, sweep)
            print_json(snap, indent=None)
            if not waiting(snap, sweep):
                return
            time.sleep(interval)
    if watch:
        follow(store, sweep, interval)
        return
    snap = snapshot(store, sweep)
    if as_json:
        print_json(snap)
        return
    con = console()
    con.print(sweep_table(snap, sweep) if sweep else sweeps_table(snap))
    if sweep is None and (alone := standalone_table(snap)) is not None:
        con.print(alone)
    _notes(snap)
