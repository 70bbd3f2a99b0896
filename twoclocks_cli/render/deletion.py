"""What a delete asks and says: the confirmation prompt and the report of deleted rows."""

from __future__ import annotations

import typer

from twoclocks_cli.core.numbers import num
from twoclocks_cli.render.jsonout import print_json

# table → (one, many) in messages
ROWS = {"metrics": ("metric row", "metric rows"),
        "run_events": ("status event", "status events"), "analyses": ("analysis", "analyses"),
        "runs": ("run", "runs"), "sweeps": ("sweep", "sweeps")}


def _rows(counts: dict[str, int], skip_zero: bool) -> str:
    return ", ".join(f"{num(n)} {ROWS[t][n != 1]}" for t, n in counts.items()
                     if n or not skip_zero)


def confirm(what: str, counts: dict[str, int], yes: bool) -> None:
    """Ask before deleting (unless --yes); 'no' exits 1 with nothing changed."""
    if yes:
        return
    if not typer.confirm(f"Delete {what} ({_rows(counts, True) or 'no rows'})?", default=False,
                         err=True):
        typer.echo("nothing deleted", err=True)
        raise typer.Exit(1)


def report(what: str, notes: list[str], counts: dict[str, int], as_json: bool) -> None:
    """Say what was deleted (a line, or JSON with the per-table row counts)."""
    if as_json:
        print_json({"deleted": what, "cancelled": notes, "rows": counts})
        return
    for note in notes:
        typer.echo(note)
    typer.echo(f"deleted {what}: " + _rows(counts, False))
