"""The console every command prints its tables on (full width in a log, so a redirected table
never wraps at 80 columns). How a number is written lives in `core.numbers`."""

from __future__ import annotations

LOG_WIDTH = 4096
"""Console width when the output is not a terminal (a file, a pipe, a SLURM log): wide enough
that a table keeps its natural width instead of wrapping at rich's default 80 columns."""


def console(stderr: bool = False):
    """A rich Console on stdout (or stderr); when that is not a terminal, LOG_WIDTH wide, so
    tables and lines come out whole in logs."""
    from rich.console import Console

    out = Console(stderr=stderr)
    if not out.is_terminal:
        out = Console(stderr=stderr, width=LOG_WIDTH)
    return out
