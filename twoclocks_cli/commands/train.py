"""`twoclocks train CONFIG`: one GRPO run in-process, with a progress bar, recorded in the store.

The same entry point a sweep job reaches through the `grpo` backend
(`twoclocks_cli.backends.grpo.train`, which hands `trainer.loop.train` its sink, controller and
checkpoint owner). Works under `accelerate launch` too: rank 0 owns the run row, the metrics and
the bar.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from twoclocks_cli.launch import train_run
from twoclocks_cli.options import DbOption
from twoclocks_cli.render.jsonout import print_json, stdout_to_stderr
from twoclocks_cli.render.progress import progress


def _validate(cfg, source: str) -> None:
    """Refuse what the run would fail on (the model, the dataset and its rows, the reward's
    module, the rollout engine) before anything is written, as `sweep` does for its cells
    (an `hf:` dataset is loaded here: this process trains on it next)."""
    from twoclocks_cli.backends.grpo import check_needs

    check_needs(cfg, source, hub=True)


def _broadcast(value, dist):
    """Rank 0's `value` on every rank."""
    if dist.world == 1:
        return value
    import torch.distributed

    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def train(
    config: Annotated[Path, typer.Argument(help="Training config (TOML).")],
    db: DbOption = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Run name (default: config stem).")
    ] = None,
    workdir: Annotated[
        Path | None,
        typer.Option(
            "--workdir",
            help="Checkpoint directory; training again with the same "
            "directory resumes its run (same store and config only). "
            "Default: a new ./twoclocks-train/run-<id>-<uuid>.",
        ),
    ] = None,
    extend: Annotated[
        bool,
        typer.Option(
            "--extend",
            help="Resume --workdir's run with a larger sample_budget (nothing else may change).",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the final summary (run id, status, steps, samples, last value "
        "of each metric, checkpoint) as JSON; progress goes to stderr.")] = False,
) -> None:
    """Train one GRPO run in-process; every step's metrics go to the store."""
    from trainer.config import load_config

    cfg = load_config(config)
    _validate(cfg, str(config))
    from trainer.dist import setup_dist  # torch: only once the config is known to be good

    dist = setup_dist()
    store, run_id, workdir = _open_run(dist, db, cfg, config, name, workdir, extend)
    writer = None
    if dist.rank == 0:
        writer = train_run.start(store, run_id, f"twoclocks train {config}"
                                 + (" --extend" if extend else ""))
    start_samples = _say_where_it_resumes(store, run_id, workdir, dist.rank == 0)
    try:
        status = _train(cfg, writer, workdir, run_id, dist.rank == 0, extend, start_samples,
                        as_json)
    except BaseException as err:
        if dist.rank == 0:
            _stopped(store, writer, run_id, workdir, err, config, db, as_json)
        # a project error is the user's one line; anything else is a bug, which the CLI logs
        # with its traceback (the run row already says it failed)
        raise
    if dist.rank == 0:
        train_run.finish(store, writer, run_id, status)
        if as_json:
            print_json(train_run.summary(store, run_id, workdir))
            return
        typer.echo(
            f"run {run_id} {status}: {store.count_metrics(run_id)} metric rows in "
            f"{store.url}; checkpoints in {workdir}"
        )


def _open_run(dist, db, cfg, config: Path, name: str | None, workdir: Path | None,
              extend: bool) -> tuple:
    """(store, run id, workdir) on every rank: rank 0 opens the store and creates or resumes
    the run row (other ranks get no store), then tells the other ranks which run it is."""
    from twoclocks_cli.store import Store

    store = run_id = None
    if dist.rank == 0:
        store = Store.open(db)
        train_run.check_calibration(store, cfg, workdir, str(config))
        run_id, workdir = train_run.run_row(store, cfg, name or config.stem, workdir, extend)
    run_id, workdir = _broadcast((run_id, str(workdir)), dist)
    return store, run_id, Path(workdir)


def _say_where_it_resumes(store, run_id: int, workdir: Path, show: bool) -> int:
    """The samples already trained when the run resumes from a checkpoint (0 on a fresh run),
    said on stderr by rank 0."""
    start = train_run.checkpoint_step(workdir)
    if show and start is not None:
        typer.echo(f"resuming run {run_id} from its checkpoint at step {start} "
                   f"({train_run.samples_at(store, run_id, start):,} samples) in {workdir}",
                   err=True)
    return train_run.samples_at(store, run_id, start) if start else 0


def _train(cfg, writer, workdir: Path, run_id: int, show: bool, extend: bool,
           start_samples: int, as_json: bool) -> str:
    """The loop under its progress display; with --json, stdout is the summary alone (the
    progress goes to stderr)."""
    from twoclocks_cli.backends.grpo import train

    with stdout_to_stderr(as_json), progress(run_id, cfg.sample_budget, start_samples, show,
                                              to_stderr=as_json) as on_step:
        return train(cfg, writer, workdir, extend=extend,
                     **({} if on_step is None else {"on_step": on_step}))


def _stopped(store, writer, run_id: int, workdir: Path, err: BaseException, config: Path, db,
             as_json: bool) -> None:
    """Rank 0 when training raised: the run marked failed (or cancelled); after Ctrl-C, how to
    resume, the --json summary and exit 130."""
    train_run.fail(store, writer, run_id, err)
    if isinstance(err, KeyboardInterrupt):
        _say_how_to_resume(store, run_id, workdir, config, db)
        if as_json:
            print_json(train_run.summary(store, run_id, workdir))
        raise typer.Exit(130) from None


def _say_how_to_resume(store, run_id: int, workdir: Path, config: Path, db) -> None:
    """After Ctrl-C: where the checkpoint is and the exact command that resumes."""
    from twoclocks_cli.store.engine import mask_url

    step = train_run.checkpoint_step(workdir)
    if step is not None:
        where = (f"the last checkpoint is step {step} "
                 f"({train_run.samples_at(store, run_id, step):,} samples) in {workdir}")
    else:
        where = f"no checkpoint was written yet in {workdir}"
    cmd = f"twoclocks train {config} --workdir {workdir}" + (f" --db {mask_url(db)}" if db else "")
    typer.echo(f"run {run_id} interrupted: {where}; resume with: {cmd}", err=True)
