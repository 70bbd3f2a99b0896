"""What `twoclocks sweeps list` prints: one row per sweep with its cells by status."""

from __future__ import annotations

import typer

from twoclocks_cli.render.status import ORDER
from twoclocks_cli.render.tables import console


def render_sweeps(records: list[dict], url: str) -> None:
    """The sweeps (`sweeps list --json`'s records) of the store at `url`."""
    from rich.table import Table

    table = Table(title=f"sweeps in {url}")
    for col in ("id", "sweep", "backend", "executor", "cells", "created"):
        table.add_column(col)
    for r in records:
        cells = ", ".join(f"{r['cells'][s]} {s}" for s in ORDER if r["cells"].get(s))
        table.add_row(str(r["id"]), r["name"], r["backend"], r["executor"] or "-",
                      cells or "-", r["created_at"][:19])
    console().print(table)
    if not records:
        typer.echo("no sweeps yet")
