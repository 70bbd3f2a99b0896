"""Bounds every config shares: what the store's columns hold, how big a grid may get, what a path
may look like. One place, so the sweep planner and the training config say the same thing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.core.numbers import short

INT32_MAX = 2**31 - 1  # runs.seed/batch_* and metrics.step are INTEGER (32-bit on PostgreSQL)
INT64_MAX = 2**63 - 1  # metrics.samples is BIGINT
MAX_CELLS = 10_000  # cells one sweep may plan
MAX_RANGE_STEPS = 10_000  # progression steps a {start, stop, factor} batch range may take
MAX_SIM_ROW_STEPS = 5e6  # simulated runs x steps one command may ask for (about a minute)
MAX_SIM_ROWS = 10_000  # simulated runs side by side: each holds the model's state
PATH_MAX = 4096  # Linux's PATH_MAX; NAME_MAX comes from the file system (usually 255)
PATH_RESERVE = 160  # what twoclocks appends below a workdir (sweep folder, submissions, logs)
NAME_CHARS = 200  # sweeps.name and runs.name are VARCHAR(200)
# a sweep name, from a sweep config or `ingest --sweep`: a letter or digit, then letters, digits,
# '.', '_' or '-', as long as the column holds
SWEEP_NAME = rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{NAME_CHARS - 1}}}"


def name_max(path: Path) -> int:
    """NAME_MAX of the file system the nearest existing ancestor of `path` lives on."""
    for parent in (path, *path.parents):
        try:
            return os.pathconf(parent, "PC_NAME_MAX")
        except (OSError, ValueError):
            continue
    return 255


def path_problem(value: str, reserve: int = 0) -> str | None:
    """Why the OS would refuse `value` as a path (NUL, a part or the whole too long), or None."""
    if not value:
        return "must not be empty"
    if "\x00" in value:
        return "must not contain a NUL character"
    path = Path(value).expanduser()
    longest = name_max(path.absolute())
    for part in path.parts:
        if len(os.fsencode(part)) > longest:
            return f"a path component is {len(os.fsencode(part))} bytes; at most {longest}"
    total = len(os.fsencode(str(path.absolute()))) + reserve
    if total > PATH_MAX:
        room = f" (twoclocks adds up to {reserve} below it)" if reserve else ""
        return f"the absolute path is too long{room}; at most {PATH_MAX - reserve} bytes"
    return None


def nul_key(data: Any, prefix: str = "") -> str | None:
    """The dotted key of the first string (value or key) holding a NUL character, or None."""
    if isinstance(data, dict):
        for key, value in data.items():
            here = f"{prefix}.{key}" if prefix else str(key)
            if "\x00" in str(key):
                return here
            found = nul_key(value, here)
            if found:
                return found
    elif isinstance(data, list):
        for i, value in enumerate(data):
            found = nul_key(value, f"{prefix}[{i}]")
            if found:
                return found
    elif isinstance(data, str) and "\x00" in data:
        return prefix or "value"
    return None


def refuse_nul(data: Any, source: str) -> None:
    """ConfigError naming the first key whose name or value holds a NUL character: no file,
    column or argv can carry one."""
    bad = nul_key(data)
    if bad:
        raise ConfigError(f"{source}: key {short(bad)}: contains a NUL character, which no key or "
                          "value may hold")
