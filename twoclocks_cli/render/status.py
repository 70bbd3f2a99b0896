"""The tables of a sweep's cells and of all sweeps, live or once, and the notes under them."""

from __future__ import annotations

import typer

from twoclocks_cli.core.numbers import num
from twoclocks_cli.render.tables import console

ORDER = ("planned", "submitted", "running", "lost", "incomplete", "completed", "diverged",
         "failed", "cancelled")
STYLE = {"completed": "green", "diverged": "yellow", "failed": "red", "cancelled": "magenta",
         "running": "cyan", "lost": "orange3", "incomplete": "orange3"}
LOST_HINT = ("{n} lost cell(s) (their job vanished without reporting): a plain `twoclocks sweep "
             "CONFIG` resumes them from their checkpoints")


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
    """The cells of `sweep` in a snapshot: batch, lr, seed, status, job, attempts, last step."""
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
    """Cell counts by status, a row per sweep."""
    from rich.table import Table

    table = Table(title="sweeps")
    table.add_column("sweep", no_wrap=True)
    for s in ORDER:
        table.add_column(s, justify="right")
    for name, counts in sorted(snap["sweeps"].items()):
        table.add_row(name, *[num(counts[s]) if counts.get(s) else "" for s in ORDER])
    return table


def follow(watch, sweep: str | None) -> dict:
    """A live table of each snapshot `watch(on_snapshot)` delivers (launch.monitor.watcher:
    until nothing of `sweep` is submitted or running); returns the last snapshot."""
    from rich.live import Live

    render = (lambda s: sweep_table(s, sweep)) if sweep else sweeps_table
    with Live(console=console(), refresh_per_second=4) as live:
        snap = watch(lambda s: live.update(render(s)))
    notes(snap)
    return snap


def wait_quietly(watch, sweep: str | None = None) -> dict:
    """Like `follow` with nothing on stdout (for --json): wait for `watch`'s last snapshot;
    notes on stderr."""
    snap = watch(None)
    notes(snap)
    return snap


def notes(snap: dict) -> None:
    """Scheduler problems, and how to resume lost cells, on stderr."""
    for p in snap["problems"]:
        typer.echo(f"warning: {p}", err=True)
    lost = sum(c.get("lost", 0) for c in snap["sweeps"].values())
    if lost:
        typer.echo(LOST_HINT.format(n=lost), err=True)
