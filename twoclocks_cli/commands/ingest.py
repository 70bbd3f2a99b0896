"""`twoclocks ingest`: import training logs (TRL, verl, CSV, JSONL) and tracked runs (W&B,
MLflow, TensorBoard) as completed runs of a sweep."""

import json
from pathlib import Path
from typing import Annotated

import typer

from twoclocks_cli.core.limits import INT32_MAX, NAME_CHARS, SWEEP_NAME
from twoclocks_cli.options import DbOption, JsonOption, in_paths, within
from twoclocks_cli.render.ingest import render_ingested

FORMAT_HELP = (
    "trl (trainer_state.json), verl (console log), csv (header row), jsonl (one object per line), "
    "wandb (run directories), wandb-csv (a panel export), mlflow (a local store), tensorboard "
    "(event files). Default: told from each source's content."
)


def ingest(
    paths: Annotated[list[Path] | None, typer.Argument(
        help="Log files, TRL checkpoint folders, W&B run folders, TensorBoard run folders, "
        "MLflow stores (mlflow.db or mlruns).", callback=in_paths)] = None,
    sources: Annotated[list[str] | None, typer.Option(
        "--from", help="A tracking store by URI: mlflow:sqlite:///mlflow.db or "
        "mlflow:./mlruns (repeatable).")] = None,
    runs: Annotated[list[str] | None, typer.Option(
        "--run", help="Sources holding several runs (W&B, MLflow, TensorBoard): only runs "
        "whose id, full name (experiment/run) or own name (after the last /) matches this "
        "glob (repeatable).")] = None,
    experiments: Annotated[list[str] | None, typer.Option(
        "--experiment", help="MLflow: only this experiment, by name or id (repeatable).")] = None,
    mlflow_filter: Annotated[str | None, typer.Option(
        "--filter", help="MLflow: a search filter, e.g. \"params.lr = '0.001'\".")] = None,
    fmt: Annotated[str | None, typer.Option("--format", "-f", help=FORMAT_HELP)] = None,
    sweep: Annotated[str, typer.Option(
        "--sweep", help="Sweep the runs join (created when missing).")] = "imported",
    batch_prompts: Annotated[int | None, typer.Option(
        "--batch-prompts", help="Prompts per step, when the log does not state it.")] = None,
    group_size: Annotated[int | None, typer.Option(
        "--group-size", help="Completions per prompt, when the log does not state it.")] = None,
    lr: Annotated[float | None, typer.Option(
        "--lr", help="The run's learning rate, when the log does not state it.")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="The run's seed.")] = None,
    column_map: Annotated[list[str] | None, typer.Option(
        "--map", help="STORE_KEY=COLUMN pairs, comma-separated or repeated "
        "(e.g. step=global_step,reward_mean=rew); overrides the built-in names.")] = None,
    skip_bad: Annotated[bool, typer.Option(
        "--skip-bad", help="Skip malformed lines (listed) instead of refusing the file.")] = False,
    max_bytes: Annotated[int, typer.Option(
        "--max-bytes", help="Refuse files larger than this many bytes.",
        callback=within(1))] = 512 * 1024 * 1024,
    identity: Annotated[str, typer.Option(
        "--identity", help="A run is the same run when its file has the same 'content' "
        "(default) or the same 'path' (for a log that is still growing).")] = "content",
    follow: Annotated[bool, typer.Option(
        "--follow", help="Follow one log that is still being written: import new complete "
        "lines as they appear (the run is `running`), until the file has not changed for "
        "--idle seconds or the --pid process exited.")] = False,
    idle: Annotated[float, typer.Option(
        "--idle", help="--follow: stop after this many seconds without a change.")] = 30.0,
    poll: Annotated[float, typer.Option(
        "--poll", help="--follow: seconds between looks at the file.")] = 1.0,
    pid: Annotated[int | None, typer.Option(
        "--pid", help="--follow: also stop when this process (the writer) has exited.",
        callback=within(1, INT32_MAX))] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Import training logs as completed runs, one per file (or per run of a W&B, MLflow or
    TensorBoard source); re-importing changes nothing."""
    from twoclocks_cli.core.errors import ConfigError
    from twoclocks_cli.ingest import FORMATS, IngestOptions, ingest_files, parse_map
    from twoclocks_cli.store import Store

    if fmt is not None and fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: allowed are {', '.join(FORMATS)}")
    _check_options(sweep, lr, batch_prompts, group_size, seed)
    every = _sources(paths or [], sources or [])
    opts = IngestOptions(
        fmt=fmt, sweep=sweep, batch_prompts=batch_prompts, group_size=group_size, lr=lr,
        seed=seed, column_map=parse_map(column_map or []), skip_bad=skip_bad,
        max_bytes=max_bytes, identity=identity, finished=not follow, runs=tuple(runs or ()),
        experiments=tuple(experiments or ()), mlflow_filter=mlflow_filter,
    )
    if follow:
        _check_follow(every, idle, poll, pid)
    store = Store.open(db)
    if follow:
        results = [_follow(store, every[0], opts, idle, poll, pid, as_json)]
    else:
        results = ingest_files(store, every, opts)
    if as_json:
        typer.echo(json.dumps([r.to_json() for r in results], indent=2))
    else:
        render_ingested(results)


def _follow(store, source, opts, idle: float, poll: float, pid: int | None, as_json: bool):
    """Import one growing log until it rests (or its writer exits), each new batch of lines
    said as it lands (not with --json)."""
    from twoclocks_cli.ingest.follow import follow_file

    echo = None if as_json else (lambda line: typer.echo(line))
    return follow_file(store, source, opts, idle=idle, poll=poll, echo=echo, pid=pid)


def _sources(paths: list[Path], uris: list[str]) -> list:
    """The paths, then the --from URIs (only mlflow: ones are known); at least one."""
    from twoclocks_cli.core.errors import ConfigError

    for uri in uris:
        if not uri.startswith("mlflow:"):
            raise ConfigError(f"--from {uri!r}: expected mlflow:URI (mlflow:sqlite:///mlflow.db "
                              "or mlflow:./mlruns); files and folders are given as PATH")
    if not paths and not uris:
        raise ConfigError("nothing to import: give log files or folders, or --from mlflow:URI")
    return [*paths, *uris]


def _check_follow(paths: list, idle: float, poll: float, pid: int | None) -> None:
    """--follow takes one file or run folder and positive, finite waits."""
    import math

    from twoclocks_cli.core.errors import ConfigError

    if len(paths) != 1:
        raise ConfigError(f"--follow follows one file, got {len(paths)}")
    if isinstance(paths[0], str):
        raise ConfigError(f"--follow {paths[0]}: an MLflow store is imported whole; --follow "
                          "follows a log file, a W&B run folder or a TensorBoard run folder")
    for name, v in (("--idle", idle), ("--poll", poll)):
        if not (math.isfinite(v) and 0 < v <= 86_400):
            raise ConfigError(f"{name} {v}: must be a number of seconds in (0, 86400]")


def _check_options(sweep: str, lr, batch_prompts, group_size, seed) -> None:
    """The run columns given on the command line, checked like a sweep config's."""
    import re

    from twoclocks_cli.core.errors import ConfigError

    if not re.fullmatch(SWEEP_NAME, sweep):
        raise ConfigError(f"--sweep {sweep!r}: a sweep name is 1-{NAME_CHARS} letters, digits, "
                          "'.', '_' or '-', starting with a letter or digit")
    from twoclocks_cli.ingest.base import check_params

    check_params({"lr": lr, "batch_prompts": batch_prompts, "group_size": group_size,
                  "seed": seed})
