"""The one --json style of every command: a single JSON document on stdout (strict JSON: NaN
and infinities are null; datetimes ISO strings), nothing else on stdout; notes go to stderr."""

from __future__ import annotations

import contextlib
import math
import sys


def strict(x):
    """Strict JSON values: NaN and +-inf become null, in nested dicts and lists too."""
    if isinstance(x, dict):
        return {k: strict(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [strict(v) for v in x]
    return x if not isinstance(x, float) or math.isfinite(x) else None


def _default(obj):
    """Values json cannot write itself: numpy scalars as numbers, datetimes ISO, else str."""
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalar
        return strict(obj.item())
    if hasattr(obj, "isoformat"):
        return obj.isoformat()
    return str(obj)


def dumps(doc, indent: int | None = 2) -> str:
    """`doc` as the project's JSON text (indent=None: one line, for streams of objects)."""
    import json

    return json.dumps(strict(doc), indent=indent, allow_nan=False, default=_default)


def print_json(doc, indent: int | None = 2) -> None:
    """Print `doc` as the command's one JSON document on stdout."""
    import typer

    typer.echo(dumps(doc, indent))


@contextlib.contextmanager
def stdout_to_stderr(active: bool = True):
    """While the work of a --json command runs, anything printed to stdout (progress, notes,
    an in-process job's output) goes to stderr, so stdout holds the JSON document only."""
    if not active:
        yield
        return
    with contextlib.redirect_stdout(sys.stderr):
        yield
