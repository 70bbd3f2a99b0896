"""What `twoclocks plan` prints: the planned cells as a table, each cell's command line or
GRPOConfig fields (plain lines), and the plan's warnings."""

from __future__ import annotations

import typer

from twoclocks_cli.core.numbers import num
from twoclocks_cli.render.tables import console
from twoclocks_cli.render.warnings import print_warnings


def render_plan(p, lines: dict[str, str]) -> None:
    """The plan `p` (config.Plan) and, per cell id, what its backend runs."""
    console().print(plan_table(p, f"sweep {p.config.name}: {len(p.cells)} cells, backend "
                                  f"{p.config.backend}, {num(p.config.sample_budget)} samples "
                                  "each"))
    for cid, line in lines.items():  # plain lines, never wrapped: they can be copied
        typer.echo(f"cell {cid[:10]}: {line}")
    print_warnings(p.warnings)


def plan_table(p, title: str):
    """A rich table of planned cells."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("cell", "prompts", "G", "samples/batch", "lr", "clip", "seed", "steps",
                "samples"):
        table.add_column(col, justify="right" if col not in ("cell", "clip") else "left")
    for c in p.cells:
        clip = f"{c.clip_low:g}" if c.clip_low == c.clip_high else f"{c.clip_low:g}/{c.clip_high:g}"
        table.add_row(c.cell_id[:10], num(c.prompts), num(c.group_size), num(c.batch_samples),
                      num(c.lr), clip, str(c.seed), num(c.steps), num(c.samples))
    return table
