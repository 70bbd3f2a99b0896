"""How the project writes a number or a value for a person: the one rule every table, message
and report follows (the full precision stays in --json)."""

from __future__ import annotations

import math

# a number of a JSON document as it was written: read back through pydantic, an int stays an
# int (a `float` field would make it one)
Number = int | float


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


def short(value, limit: int = 80) -> str:
    """`repr(value)` for quoting a user's value in a one-line error: at most `limit` characters,
    a longer one cut with an ellipsis and its full length (a 2 MB string stays one short line)."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's digit limit for str()
        return f"an integer of {value.bit_length():,} bits"
    if len(text) <= limit:
        return text
    size = (f"{len(value):,} characters" if isinstance(value, str | bytes)
            else f"{len(value):,} items" if isinstance(value, list | tuple | dict | set)
            else f"{len(text):,} characters written out")
    return f"{text[: max(limit - 1, 1)]}… ({size})"
