"""Step metrics as a flat table (`twoclocks export`): each row carries its run's cell parameters,
so pandas or polars read it without a schema lookup.

Layouts: `long` is one row per (run, step, key) with `key` and `value` columns; `wide` is one
row per (run, step) with one column per metric key (a key that is also a parameter column,
e.g. `lr`, becomes `metric_lr`). Values keep full precision; NaN stays NaN in csv ('nan') and
parquet; jsonl is strict JSON, so NaN and ±inf are null there. A key not logged at a step is
an empty csv cell, a parquet null, a jsonl null.
"""

from __future__ import annotations

import csv
import json
import math
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from twoclocks_cli.core.errors import ConfigError

FORMATS = ("csv", "parquet", "jsonl")
LAYOUTS = ("long", "wide")
RUN_COLUMNS = ("run_id", "run", "sweep", "backend", "batch_prompts", "group_size",
               "batch_samples", "lr", "clip_low", "clip_high", "seed", "status")
STEP_COLUMNS = ("step", "samples")
INT_COLUMNS = frozenset({"run_id", "batch_prompts", "group_size", "batch_samples", "seed",
                         "step", "samples"})
STR_COLUMNS = frozenset({"run", "sweep", "backend", "status", "key"})
PARQUET_BATCH = 65_536


@dataclass(frozen=True)
class Table:
    """Column names and a stream of row tuples in that order."""

    columns: tuple[str, ...]
    rows: Iterator[tuple]


def cell_values(run) -> tuple:
    """A run's parameter columns (RUN_COLUMNS order)."""
    return (run.id, run.name, run.sweep.name if run.sweep is not None else None, run.backend,
            run.batch_prompts, run.group_size, run.batch_samples, run.lr, run.clip_low,
            run.clip_high, run.seed, run.status)


def wide_name(key: str) -> str:
    """A metric's column in the wide layout (prefixed when it would shadow a fixed column)."""
    return f"metric_{key}" if key in RUN_COLUMNS or key in STEP_COLUMNS else key


def table(store, runs: list, keys: list[str], layout: str) -> Table:
    """The export of `keys` of `runs` in `layout`, streamed from the store."""
    cells = {r.id: cell_values(r) for r in runs}
    metrics = store.iter_metrics([r.id for r in runs], keys)
    if layout == "long":
        rows = (cells[rid] + (step, samples, key, value)
                for rid, step, samples, key, value in metrics)
        return Table(RUN_COLUMNS + STEP_COLUMNS + ("key", "value"), rows)
    return Table(RUN_COLUMNS + STEP_COLUMNS + tuple(wide_name(k) for k in keys),
                 _wide_rows(metrics, cells, keys))


def _wide_rows(metrics, cells: dict, keys: list[str]) -> Iterator[tuple]:
    """Fold (run, step, key) rows, ordered by run and step, into one row per (run, step)."""
    index = {k: i for i, k in enumerate(keys)}
    current, samples, values = None, None, None
    for rid, step, smp, key, value in metrics:
        if (rid, step) != current:
            if current is not None:
                yield cells[current[0]] + (current[1], samples) + tuple(values)
            current, samples, values = (rid, step), smp, [None] * len(keys)
        values[index[key]] = value
    if current is not None:
        yield cells[current[0]] + (current[1], samples) + tuple(values)


def check_out(out: Path | None, fmt: str) -> None:
    """Refuse an output path that cannot be written, before anything is read or written."""
    if out is None:
        if fmt == "parquet":
            raise ConfigError("--format parquet needs --out FILE (parquet is binary; only csv "
                              "and jsonl go to stdout)")
        return
    from twoclocks_cli.options import out_path_problem

    if why := out_path_problem(out):
        raise ConfigError(f"--out {out}: {why}")


def write(tab: Table, fmt: str, out: Path | None) -> int:
    """Write `tab` as `fmt` to `out` (atomically: a temp file renamed at the end) or stdout.
    Returns the number of rows written."""
    if out is None:
        return _WRITERS[fmt](tab, sys.stdout)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent)
    except OSError as exc:  # e.g. a read-only file system that os.access calls writable
        raise ConfigError(f"--out {out}: cannot write ({exc.strerror or exc})") from None
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # as a plain open() would create it
        with os.fdopen(fd, "wb" if fmt == "parquet" else "w", newline="" if fmt == "csv"
                       else None, encoding=None if fmt == "parquet" else "utf-8") as fh:
            n = _WRITERS[fmt](tab, fh)
        os.replace(tmp, out)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise ConfigError(f"--out {out}: cannot write ({exc.strerror or exc})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return n


def _umask() -> int:
    """The process umask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _csv(tab: Table, fh) -> int:
    """CSV with a header row; floats in full precision (repr: 'nan', 'inf' included)."""
    w = csv.writer(fh, lineterminator="\n")
    w.writerow(tab.columns)
    n = 0
    for row in tab.rows:
        w.writerow(row)
        n += 1
    return n


def _jsonl(tab: Table, fh) -> int:
    """One strict-JSON object per row (NaN and ±inf as null)."""
    n = 0
    cols = tab.columns
    for row in tab.rows:
        rec = {c: (v if not isinstance(v, float) or math.isfinite(v) else None)
               for c, v in zip(cols, row, strict=True)}
        fh.write(json.dumps(rec, allow_nan=False) + "\n")
        n += 1
    return n


def _parquet(tab: Table, fh) -> int:
    """Parquet (pyarrow) in row groups of PARQUET_BATCH rows; ints int64, floats float64."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("--format parquet needs pyarrow: pip install 'twoclocks[export]'") \
            from None

    def kind(col: str):
        if col in INT_COLUMNS:
            return pa.int64()
        return pa.string() if col in STR_COLUMNS else pa.float64()

    schema = pa.schema([(c, kind(c)) for c in tab.columns])
    n = 0
    with pq.ParquetWriter(fh, schema) as writer:
        batch: list[tuple] = []
        for row in tab.rows:
            batch.append(row)
            if len(batch) == PARQUET_BATCH:
                writer.write_batch(_batch(pa, schema, batch))
                n, batch = n + len(batch), []
        if batch or n == 0:
            writer.write_batch(_batch(pa, schema, batch))
            n += len(batch)
    return n


def _batch(pa, schema, rows: list[tuple]):
    """Row tuples → one pyarrow RecordBatch (NaN kept as NaN; None as null)."""
    cols = list(zip(*rows, strict=True)) if rows else [()] * len(schema)
    return pa.record_batch([pa.array(list(c), type=f.type, from_pandas=False)
                            for c, f in zip(cols, schema, strict=True)], schema=schema)


_WRITERS = {"csv": _csv, "jsonl": _jsonl, "parquet": _parquet}
