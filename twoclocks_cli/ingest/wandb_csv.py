"""A W&B panel exported as CSV: `Step, <run> - <metric>, <run> - <metric>__MIN, ...`, one
column group per run and metric (the panel's "Export CSV").

The first column is the panel's x axis (`Step`, or the metric it plots against, which must hold
step numbers). `__MIN` / `__MAX` are the range of the points a downsampled panel averaged into
one: where they differ, the value is not one logged value, and a note says how many rows are so.
The export keeps no config: a run's prompts per step, group size and lr come from the options,
so a sweep's runs are imported one at a time (`--run NAME` with that run's own options); one set
of options for several runs says they share one setting (a note says so).
"""

from __future__ import annotations

import csv
import hashlib
import io
import re
from pathlib import Path

from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.ingest import scalars
from twoclocks_cli.ingest.base import (
    IngestOptions,
    ParsedLog,
    decode_text,
    read_bytes,
    to_number,
    to_step,
)

_COLUMN = re.compile(r"^(?P<run>.+) - (?P<metric>.+?)(?P<edge>__MIN|__MAX)?$")


def is_panel_header(header: list[str]) -> bool:
    """Whether a CSV header is a W&B panel export's: an x axis, then `<run> - <metric>`
    columns, with `__MIN`/`__MAX` ones or the x axis named `Step`."""
    if len(header) < 2 or " - " in header[0]:
        return False
    groups = [_COLUMN.match(h) for h in header[1:]]
    if not all(groups):
        return False
    return header[0] == "Step" or any(g.group("edge") for g in groups)


def _columns(path: Path, header: list[str]) -> dict[str, dict[str, dict[str, int]]]:
    """run -> metric -> {"value"|"__MIN"|"__MAX": column index}."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for i, h in enumerate(header[1:], start=1):
        m = _COLUMN.match(h)
        if m is None:
            raise ConfigError(f"{path}:1: column {h!r} is not '<run> - <metric>'")
        out.setdefault(m.group("run"), {}).setdefault(m.group("metric"), {})[
            m.group("edge") or "value"] = i
    return out


def _cell(row: list[str], i: int | None):
    """A cell's number, None when empty; ValueError when it is no number."""
    if i is None or i >= len(row) or not row[i].strip():
        return None
    return to_number(row[i])


def parse_runs(path: Path, opts: IngestOptions) -> list[ParsedLog]:
    """One run per `<run>` of the export."""
    data = read_bytes(path, opts.max_bytes)
    text = decode_text(path, data)
    rows = list(csv.reader(io.StringIO(text, newline="")))
    if not rows:
        raise ConfigError(f"{path}: empty file, expected a W&B panel export's header row")
    header = [h.strip() for h in rows[0]]
    if not is_panel_header(header):
        raise ConfigError(f"{path}:1: not a W&B panel export (expected 'Step, <run> - "
                          "<metric>, <run> - <metric>__MIN, ...')")
    columns = _columns(path, header)
    file_sha = hashlib.sha256(data).hexdigest()
    runs = []
    for name, metrics in columns.items():
        run = scalars.TrackedRun(
            key=name, name=name, sha256=hashlib.sha256(f"{file_sha}\0{name}".encode()).hexdigest(),
            size=len(data), config_from="W&B panel export (it keeps no config)",
            step_key=header[0])
        averaged = _rows(path, rows, header[0], metrics, run)
        if averaged:
            run.notes.append(f"{averaged} row(s) where __MIN and __MAX differ: the panel was "
                             "downsampled and those values are averages of several logged "
                             "points, not logged values")
        runs.append(run)
    chosen = scalars.select_runs(path, runs, opts)
    given = [f"--{n.replace('_', '-')}" for n in ("batch_prompts", "group_size", "lr")
             if getattr(opts, n) is not None]
    logs = []
    for run in chosen:
        if len(chosen) > 1 and given:
            run.notes.append(f"{' '.join(given)} given for all {len(chosen)} runs of this "
                             "export: analyze takes runs of one batch and lr as seeds of one "
                             "setting (import each with --run NAME and its own options if "
                             "they differ)")
        log = scalars.to_log(run, path, "wandb-csv", opts)
        log.batch_hint = ("a W&B panel export keeps no config: import each run with --run NAME "
                          "and its own --batch-prompts, --group-size and --lr")
        logs.append(log)
    return logs


def _rows(path: Path, rows: list[list[str]], axis: str, metrics: dict,
          run: scalars.TrackedRun) -> int:
    """Fill the run's steps from the table; returns the rows whose value is an average."""
    averaged = 0
    for number, row in enumerate(rows[1:], start=2):
        if not row or not any(c.strip() for c in row):
            continue
        if len(row) != len(rows[0]):
            run.bad_lines.append((number, f"expected {len(rows[0])} fields, got {len(row)}"))
            continue
        try:
            step = to_step(row[0])
        except ValueError:
            raise ConfigError(f"{path}:{number}: the x axis {axis!r} is {row[0]!r}, not a step: "
                              "export the panel with Step as its x axis") from None
        values, bad, wide = {}, None, False
        for metric, at in metrics.items():
            try:
                v, lo, hi = (_cell(row, at.get(k)) for k in ("value", "__MIN", "__MAX"))
            except ValueError:
                bad = f"a {run.name} - {metric} cell is not a number"
                break
            if v is not None:
                values[metric] = v
                # NaN != NaN: a NaN range is one NaN logged, not an average
                wide = wide or (lo is not None and hi is not None and lo != hi
                                and not (lo != lo and hi != hi))
        if bad:
            run.bad_lines.append((number, bad))
            continue
        if values:
            have = run.steps.setdefault(step, {})
            run.duplicates += sum(1 for k in values if k in have)
            have.update(values)
            averaged += wide
    return averaged
