"""Planner warnings, one line each on stderr (stdout may be a --json document)."""

from __future__ import annotations

import typer


def print_warnings(warnings: list[str]) -> None:
    """Each warning as `warning: ...` on stderr."""
    for w in warnings:
        typer.echo(f"warning: {w}", err=True)
