"""`twoclocks theory`: the local quadratic model's predictions for a batch grid (+ simulation)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from twoclocks_cli.options import COUNT, SAMPLES, JsonOption, parse_numbers, within
from twoclocks_cli.render.theory import render_theory

MAX_BATCH = 1e9  # samples per batch the model is asked about


def _alpha(rule: str) -> float:
    """The lr scaling exponent of --rule: a named rule's, or alpha=X's X in [-4, 4]."""
    from twoclocks_cli.core.errors import ConfigError
    from twoclocks_cli.theory import SCALING_RULES

    if rule in SCALING_RULES:
        return SCALING_RULES[rule]
    if not rule.startswith("alpha="):
        raise ConfigError(f"--rule {rule!r}: allowed are sqrt, linear, constant, alpha=X")
    try:
        alpha = float(rule[6:])
    except ValueError:
        raise ConfigError(f"--rule {rule!r}: alpha=X needs a number") from None
    if not -4 <= alpha <= 4:  # also refuses nan
        raise ConfigError(f"--rule {rule!r}: alpha must be a number from -4 to 4")
    return alpha


def _parse_set(items: list[str]) -> dict:
    """--set KEY=VALUE items as a dict (a value is JSON where it parses, else the text)."""
    from twoclocks_cli.core.errors import ConfigError

    out = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE (a sim model field)")
        k, v = item.split("=", 1)
        try:
            val = json.loads(v)
        except json.JSONDecodeError:
            val = v
        out[k.strip()] = val
    return out


def _check_simulation(grid: list[float], seeds: int, budget: float) -> None:
    """Refuse a --simulate grid whose rows or steps could not finish in reason (every row
    steps until the smallest batch has spent the budget)."""
    from twoclocks_cli.core.errors import ConfigError
    from twoclocks_cli.core.limits import MAX_SIM_ROW_STEPS as MAX_ROW_STEPS
    from twoclocks_cli.core.limits import MAX_SIM_ROWS as MAX_ROWS

    rows = len(grid) * seeds
    if rows > MAX_ROWS:
        raise ConfigError(f"--seeds {seeds} x {len(grid)} batches = {rows:,} simulated runs; "
                          f"at most {MAX_ROWS:,}")
    work = rows * budget / min(grid)
    if work > MAX_ROW_STEPS:
        raise ConfigError(f"--simulate: {rows:,} runs x {budget / min(grid):,.0f} steps "
                          f"(--budget / the smallest batch) = {work:.3g} steps; at most "
                          f"{MAX_ROW_STEPS:.0e}: lower --budget or --seeds, or raise the "
                          "smallest batch")


def theory(
    batches: Annotated[
        str, typer.Option(help="Comma-separated batch sizes (samples).")
    ] = "16,32,64,128,256",
    lr0: Annotated[float, typer.Option(help="Learning rate at the reference batch, in (0, 1].",
                                       callback=within(0, 1, low_open=True))] = 0.01,
    b0: Annotated[float, typer.Option(help="Reference batch (samples).",
                                      callback=within(1, MAX_BATCH))] = 32,
    rule: Annotated[
        str, typer.Option(help="lr scaling: sqrt, linear, constant, or alpha=X.")
    ] = "sqrt",
    target: Annotated[float, typer.Option(
        help="Target progress p = 1 - L/L0 in (0,1).",
        callback=within(0, 1, low_open=True, high_open=True))] = 0.9,
    cap: Annotated[float | None, typer.Option(
        help="Per-step displacement cap (> 0).", callback=within(0, low_open=True))] = None,
    sets: Annotated[
        list[str] | None,
        typer.Option(
            "--set", help="Model field KEY=VALUE (dim, sigma, flat_dims, optimizer, ...)."
        ),
    ] = None,
    simulate: Annotated[bool, typer.Option("--simulate", help="Add simulated clocks.")] = False,
    seeds: Annotated[int, typer.Option(help="Seeds per batch when simulating.",
                                       callback=COUNT)] = 3,
    budget: Annotated[float, typer.Option(help="Samples per simulated run.",
                                          callback=SAMPLES)] = 1e5,
    lr_scan: Annotated[
        str | None, typer.Option(help="Also give B_crit at lr0 times these factors, e.g. 0.3,3.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Print the local quadratic model's predictions for a batch grid (--simulate: and clocks)."""
    grid = parse_numbers(batches, "--batches", 1, MAX_BATCH, most=64)
    alpha = _alpha(rule)
    factors = () if lr_scan is None else tuple(
        parse_numbers(lr_scan, "--lr-scan", 0, 1 / lr0, low_open=True, most=16))
    if simulate:
        _check_simulation(grid, seeds, budget)
    from twoclocks_cli.theory.table import theory_table

    out = theory_table(
        grid, lr0, b0, alpha, target, _parse_set(sets or []), simulate, seeds, budget, cap, factors
    )
    if as_json:
        typer.echo(json.dumps(out, indent=2))
    else:
        render_theory(out, simulate)
