"""`twoclocks export SWEEP | --run RUN`: step metrics with their runs' cell parameters as csv,
parquet or jsonl (long or wide), for pandas, polars or a spreadsheet."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from twoclocks_cli.options import DbOption, KeysOption, parse_keys

SUFFIXES = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl",
            ".ndjson": "jsonl"}


def _choose_format(fmt: str | None, out: Path | None) -> str:
    """--format, else the --out suffix, else csv; anything else is refused."""
    from twoclocks_cli.core.errors import ConfigError
    from twoclocks_cli.export import FORMATS

    if fmt is None:
        return SUFFIXES.get(out.suffix.lower(), "csv") if out is not None else "csv"
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: allowed are {', '.join(FORMATS)}")
    return fmt


def _select_runs(store, sweep: str | None, run_refs: list[str] | None) -> tuple[list, str]:
    """The runs to export (a sweep's, or the --run ones) and a phrase naming them."""
    from twoclocks_cli.core.errors import ConfigError

    if (sweep is None) == (not run_refs):
        raise ConfigError("name a SWEEP or one or more --run RUN (not both)")
    if sweep is not None:
        return store.list_runs(sweep), f"sweep {sweep}"
    runs = list({r.id: r for r in (store.find_run(ref) for ref in run_refs)}.values())
    return runs, "run " + ", ".join(str(r.id) for r in runs)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the exit-time flush into a closed pipe stays silent."""
    import os
    import sys

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (e.g. captured by a test runner)
        pass


def export(
    sweep: Annotated[str | None, typer.Argument(metavar="[SWEEP]", help="Sweep to export.")]
    = None,
    run_refs: Annotated[list[str] | None, typer.Option(
        "--run", help="Export this run instead (id or unique name; repeatable).")] = None,
    fmt: Annotated[str | None, typer.Option(
        "--format", "-f", help="csv, parquet or jsonl (default: from --out's suffix, else "
        "csv).")] = None,
    keys: KeysOption = None,
    layout: Annotated[str, typer.Option(
        "--layout", help="long: a row per (run, step, key); wide: a row per (run, step), a "
        "column per key.")] = "long",
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Output file (default: stdout; parquet needs a file).")] = None,
    db: DbOption = None,
) -> None:
    """Export step metrics, each row with its run's id, name, sweep, batch size, group size,
    lr, clip, seed, backend and status as columns."""
    from twoclocks_cli.core.errors import ConfigError
    from twoclocks_cli.core.numbers import num as fmt_num
    from twoclocks_cli.export import LAYOUTS, check_out, table, write
    from twoclocks_cli.store import Store
    from twoclocks_cli.store.records import check_keys

    fmt = _choose_format(fmt, out)
    if layout not in LAYOUTS:
        raise ConfigError(f"--layout {layout!r}: allowed are {', '.join(LAYOUTS)}")
    check_out(out, fmt)
    wanted = parse_keys(keys)
    store = Store.open(db)
    runs, what = _select_runs(store, sweep, run_refs)
    keys_ = check_keys(store, [r.id for r in runs], wanted, what)
    try:
        n = write(table(store, runs, keys_, layout), fmt, out)
    except BrokenPipeError:  # e.g. `| head`: the reader has what it wanted
        _quiet_stdout()
        return
    if out is not None:
        typer.echo(f"wrote {fmt_num(n)} rows ({len(runs)} run(s), {len(keys_)} key(s), "
                   f"{layout}) to {out}", err=True)
