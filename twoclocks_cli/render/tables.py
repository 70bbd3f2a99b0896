"""Shared helpers for the human tables of every command: how a number is written and the console
they are printed on (full width in a log, so a redirected table never wraps at 80 columns)."""

from __future__ import annotations

import math

LOG_WIDTH = 4096
"""Console width when the output is not a terminal (a file, a pipe, a SLURM log): wide enough
that a table keeps its natural width instead of wrapping at rich's default 80 columns."""


def num(x, digits: int = 4) -> str:
    """A number for a person: thousands separators and no decimals from 1,000 up (10175.3 ->
    '10,175'), `digits` significant digits below (0.01234, 1.5e-05) and from 1e15; '-' for
    None. The full precision stays in --json."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}"
    x = float(x)
    if not math.isfinite(x):
        return str(x)
    if abs(x) >= 1e15:  # beyond a count anyone reads digit by digit
        return f"{x:.{digits}g}"
    if abs(x) >= 1000 or abs(float(f"{x:.{digits}g}")) >= 1000:  # 999.96 -> '1,000'
        return f"{x:,.0f}"
    if x == int(x):
        return f"{int(x):,}"
    return f"{x:.{digits}g}"


def count(x) -> str:
    """A count of samples or steps: rounded to a whole number, with thousands separators
    (10175.3 -> '10,175'); '-' for None, 'inf'/'nan' as such."""
    if x is None:
        return "-"
    x = float(x)
    return f"{round(x):,}" if math.isfinite(x) else str(x)


def console(stderr: bool = False):
    """A rich Console on stdout (or stderr); when that is not a terminal, LOG_WIDTH wide, so
    tables and lines come out whole in logs."""
    from rich.console import Console

    out = Console(stderr=stderr)
    if not out.is_terminal:
        out = Console(stderr=stderr, width=LOG_WIDTH)
    return out
