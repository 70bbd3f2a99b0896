"""`twoclocks plan CONFIG`: the cells a sweep config resolves to, with warnings; `--json`.

For the command backend each cell's exact command line follows the table; for the trl backend
the GRPOConfig fields the sweep sets."""

from __future__ import annotations

import json

import typer

from twoclocks_cli.options import ConfigArg, JsonOption
from twoclocks_cli.render.plan import render_plan


def cell_lines(p) -> dict[str, str]:
    """cell id -> what its backend runs (the command line, the GRPOConfig fields the sweep
    sets); empty when the cells' tables say it all."""
    from twoclocks_cli.backends import sweep_backend

    backend = sweep_backend(p.config.backend)
    lines = {c.cell_id: backend.cell_line(c) for c in p.cells}
    return {k: v for k, v in lines.items() if v is not None}


def plan_cmd(config: ConfigArg, as_json: JsonOption = False) -> None:
    """Show the cells CONFIG resolves to (lr by the scaling rule, steps, identity) and warnings."""
    from twoclocks_cli.config import load_plan

    p = load_plan(config)
    from twoclocks_cli.backends import sweep_backend

    lines = cell_lines(p)
    key = sweep_backend(p.config.backend).LINE_KEY
    if as_json:
        cells = [{**c.record(), **({key: lines[c.cell_id]} if lines else {})} for c in p.cells]
        typer.echo(json.dumps({"sweep": p.config.name, "backend": p.config.backend,
                               "sample_budget": p.config.sample_budget, "cells": cells,
                               "warnings": p.warnings}, indent=2))
        return
    render_plan(p, lines)
