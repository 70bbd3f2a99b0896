"""`twoclocks train CONFIG`: one GRPO run in-process, with a progress bar, recorded in the store.

The same entry point a sweep job reaches through the `grpo` backend
(`twoclocks_cli.backends.grpo.train`, which hands `trainer.loop.train` its sink, controller and
checkpoint owner). Works under `accelerate launch` too: rank 0 owns the run row, the metrics and
the bar.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from twoclocks_cli.options import DbOption


def _validate(cfg, source: str) -> None:
    """Refuse what the run would fail on (the model, the dataset and its rows, the reward's
    module, the rollout engine) before anything is written, as `sweep` does for its cells
    (an `hf:` dataset is loaded here: this process trains on it next)."""
    from twoclocks_cli.backends.grpo import check_needs

    check_needs(cfg, source, hub=True)


def _check_calibration(store, cfg, workdir: Path | None, source: str) -> None:
    """A fresh adaptive run calibrates from `adaptive.from_sweep` in this store when it starts:
    the sweep and its analysis must be there (a resumed run carries its calibration in its
    checkpoint)."""
    from trainer import checkpoint
    from twoclocks_cli.launch.sweeps import check_calibration

    if workdir is not None and Path(workdir).exists() and checkpoint.latest(workdir) is not None:
        return
    check_calibration(store, [cfg.model_dump(mode="json")], source, "adaptive.from_sweep")


def _resume_row(store, cfg, workdir: Path, extend: bool) -> int:
    """The run `workdir/run.json` names, checked: same store, the run still there, the same
    config (or only a larger sample_budget with `extend`, then stored), its checkpoint its own.
    Every refusal is one ConfigError, raised before anything is written."""
    from trainer import checkpoint
    from trainer.ownership import CheckpointOwner, config_refusal, describe
    from twoclocks_cli.core.errors import ConfigError, NotFoundError
    from twoclocks_cli.launch import owner
    from twoclocks_cli.store.engine import store_identity

    rec = owner.read(workdir) or {}
    here = store_identity(store.engine.url)
    where = f"--workdir {workdir}"
    if rec.get("store") is None:
        raise ConfigError(f"{where}: its {owner.RUN_FILE} names no store (written by an older "
                          "twoclocks): resume refused; use another --workdir")
    if rec.get("store") != here:
        raise ConfigError(f"{where} belongs to {describe(rec)}, not to a run of {here}: "
                          "resume refused; use another --workdir")
    try:
        run = store.get_run(int(rec["run_id"]))
    except (NotFoundError, KeyError, TypeError, ValueError):
        run = None
    if run is None or run.cell_id != rec.get("cell_id"):
        raise ConfigError(f"{where} belongs to {describe(rec)} (cell {rec.get('cell_id')}), "
                          f"which that store no longer holds: resume refused; use another "
                          "--workdir")
    config = cfg.model_dump(mode="json")
    why = config_refusal(run.config, config, extend)
    if why:
        raise ConfigError(f"{where}: run {run.id}: {why}")
    ckpt = checkpoint.latest(workdir)
    if ckpt is not None:
        why = CheckpointOwner(config, here, run.id).refusal(ckpt, extend)
        if why:
            raise ConfigError(why)
    if config != run.config:  # --extend: the run row says what the run is now trained to
        store.set_run_config(run.id, config)
    return run.id


def _run_row(store, cfg, name: str, workdir: Path | None, extend: bool = False
             ) -> tuple[int, Path]:
    """(run id, workdir): the run `workdir` names (a resume), else a new row in `workdir`
    (default: a fresh ./twoclocks-train/run-<id>-<uuid> that no other store's run can share)."""
    import uuid

    from trainer import checkpoint
    from trainer.ownership import config_hash, describe, read_owner
    from twoclocks_cli.core.errors import ConfigError
    from twoclocks_cli.launch import owner

    if workdir is not None and owner.read(workdir) is not None:
        return _resume_row(store, cfg, workdir, extend), workdir
    if workdir is not None and (ckpt := checkpoint.latest(workdir)) is not None:
        rec = read_owner(ckpt) or {}
        raise ConfigError(f"--workdir {workdir} holds a checkpoint of {describe(rec)} but "
                          f"no {owner.RUN_FILE}: resume refused; use another --workdir")
    if extend:
        raise ConfigError("--extend continues a run: give the --workdir of the run to extend")
    config = cfg.model_dump(mode="json")
    uid = uuid.uuid4().hex[:8]
    phase = cfg.phase_at(0)[1]
    cell_id = f"train-{config_hash(config)}-{uid}"
    run_id = store.create_run(cell_id, name, "grpo", config, {
        "batch_prompts": phase.prompts_per_batch, "group_size": cfg.group_size,
        "batch_samples": phase.prompts_per_batch * cfg.group_size, "lr": phase.lr,
        "clip_low": phase.clip_eps_low, "clip_high": phase.clip_eps_high, "seed": cfg.seed})
    workdir = workdir if workdir is not None else Path("twoclocks-train") / f"run-{run_id}-{uid}"
    owner.write(workdir, owner.run_record(store.engine.url, run_id, cell_id, config))
    return run_id, workdir


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
    from twoclocks_cli.core.errors import TwoclocksError
    from twoclocks_cli.launch.job import failed_status, one_line, returned_status
    from twoclocks_cli.render.jsonout import print_json, stdout_to_stderr
    from twoclocks_cli.store import Store
    from twoclocks_cli.store.models import RunStatus

    cfg = load_config(config)
    _validate(cfg, str(config))
    from trainer.dist import setup_dist  # torch: only once the config is known to be good

    dist = setup_dist()
    store = writer = None
    run_id = None
    if dist.rank == 0:
        store = Store.open(db)
        _check_calibration(store, cfg, workdir, str(config))
        run_id, workdir = _run_row(store, cfg, name or config.stem, workdir, extend)
    run_id, workdir = _broadcast((run_id, str(workdir)), dist)
    workdir = Path(workdir)
    if dist.rank == 0:
        store.set_status(
            run_id, RunStatus.running, host=os.uname().nodename,
            message=f"twoclocks train {config}" + (" --extend" if extend else ""),
        )
        writer = store.metric_writer(run_id)
    start = _checkpoint_step(workdir)
    if dist.rank == 0 and start is not None:
        typer.echo(f"resuming run {run_id} from its checkpoint at step {start} "
                   f"({_samples_at(store, run_id, start):,} samples) in {workdir}", err=True)
    try:
        with stdout_to_stderr(as_json):  # with --json, stdout is the summary alone
            status = _train_with_bar(cfg, writer, workdir, run_id, dist.rank == 0, extend,
                                     _samples_at(store, run_id, start) if start else 0,
                                     to_stderr=as_json)
    except BaseException as err:
        if dist.rank == 0:
            writer.close()
            text = str(err) if isinstance(err, TwoclocksError) else one_line(err)
            store.set_status(run_id, failed_status(err), message=text[:500], error=text[:2000])
        if isinstance(err, KeyboardInterrupt) and dist.rank == 0:
            _say_how_to_resume(store, run_id, workdir, config, db)
            if as_json:
                print_json(train_record(store, run_id, workdir))
            raise typer.Exit(130) from None
        # a project error is the user's one line; anything else is a bug, which the CLI logs
        # with its traceback (the run row already says it failed)
        raise
    if dist.rank == 0:
        writer.close()
        store.set_status(run_id, returned_status(status))
        if as_json:
            print_json(train_record(store, run_id, workdir))
            return
        typer.echo(
            f"run {run_id} {status}: {store.count_metrics(run_id)} metric rows in "
            f"{store.url}; checkpoints in {workdir}"
        )


def train_record(store, run_id: int, workdir: Path) -> dict:
    """The --json summary of `train`: the run's id, name, status, last step and samples, the
    last value of each metric key, and its newest complete checkpoint."""
    from trainer import checkpoint
    from twoclocks_cli.store.engine import mask_url

    run = store.get_run(run_id)
    summary = store.metric_summary(run_id)
    ckpt = checkpoint.latest(workdir) if Path(workdir).exists() else None
    return {"run_id": run.id, "name": run.name, "status": run.status,
            "steps": max((m["last_step"] for m in summary.values()), default=0),
            "samples": max((m.get("last_samples") or 0 for m in summary.values()), default=0),
            "metric_rows": store.count_metrics(run_id),
            "metrics": {k: m.get("last") for k, m in summary.items()},
            "checkpoint": str(ckpt) if ckpt is not None else None,
            "checkpoint_step": _checkpoint_step(workdir), "workdir": str(workdir),
            "db": mask_url(store.url)}


def _checkpoint_step(workdir: Path) -> int | None:
    """The step of the newest complete checkpoint in `workdir`, or None."""
    from trainer import checkpoint

    path = checkpoint.latest(workdir) if Path(workdir).exists() else None
    try:
        return int(path.name.split("-")[-1]) if path is not None else None
    except ValueError:
        return None


def _samples_at(store, run_id: int, step: int | None) -> int:
    """Samples the run had consumed at `step`, from its stored metrics (0 when unknown)."""
    if not step or store is None:
        return 0
    s = store.load_metric([run_id], "batch_samples").get(run_id)
    if s is None:
        return 0
    hit = [int(x) for st, x in zip(s.steps, s.samples, strict=True) if st == step]
    return hit[-1] if hit else 0


def _say_how_to_resume(store, run_id: int, workdir: Path, config: Path, db) -> None:
    """After Ctrl-C: where the checkpoint is and the exact command that resumes."""
    from twoclocks_cli.store.engine import mask_url

    step = _checkpoint_step(workdir)
    if step is not None:
        where = (f"the last checkpoint is step {step} "
                 f"({_samples_at(store, run_id, step):,} samples) in {workdir}")
    else:
        where = f"no checkpoint was written yet in {workdir}"
    cmd = f"twoclocks train {config} --workdir {workdir}" + (f" --db {mask_url(db)}" if db else "")
    typer.echo(f"run {run_id} interrupted: {where}; resume with: {cmd}", err=True)


def _train_with_bar(cfg, writer, workdir: Path, run_id: int, show: bool, extend: bool,
                    start_samples: int = 0, to_stderr: bool = False) -> str:
    """Run the loop under a rich progress bar (samples/budget, reward, accuracy, ETA) on stdout
    (stderr with `to_stderr`); when that is not a terminal (a SLURM log), one plain line every
    `$TWOCLOCKS_PROGRESS_S` seconds (default 30) instead."""
    import sys

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    from twoclocks_cli.backends.grpo import train

    if not show:
        return train(cfg, writer, workdir, extend=extend)
    stream = sys.stderr if to_stderr else sys.stdout
    if not stream.isatty():
        return train(cfg, writer, workdir, extend=extend,
                     on_step=_plain_progress(run_id, start_samples, to_stderr))

    class Rate(ProgressColumn):
        """Samples per second over rich's recent window ('-' until there are two updates)."""

        def render(self, task) -> Text:
            return Text("-" if task.speed is None else rate_text(task.speed))
    columns = (
        TextColumn(f"run {run_id}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(
            "samples  reward {task.fields[reward]}  acc {task.fields[acc]}  "
            "eval {task.fields[eval]}"
        ),
        Rate(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    from twoclocks_cli.render.tables import console

    with Progress(*columns, transient=False, console=console(stderr=to_stderr)) as bar:
        task = bar.add_task("train", total=cfg.sample_budget, reward="-", acc="-", eval="-",
                            completed=start_samples)

        def on_step(p) -> None:
            fields = {"reward": f"{p.reward:.3f}", "acc": f"{p.accuracy:.3f}"}
            if p.eval_accuracy is not None:
                fields["eval"] = f"{p.eval_accuracy:.3f}"
            bar.update(task, completed=min(p.samples, p.budget), **fields)

        return train(cfg, writer, workdir, on_step=on_step, extend=extend)


def rate_text(rate: float) -> str:
    """Samples per second with two significant digits below 10 (a real model on a CPU trains
    at 0.3 samples/s, which a whole-number format shows as 0) and whole numbers above."""
    if rate >= 10:
        return f"{rate:,.0f} samples/s"
    return f"{rate:.2g} samples/s"


def eta_text(left: float, rate: float) -> str:
    """H:M:S until `left` more samples at `rate` per second ('-' with no rate yet). A last step
    may pass the budget (whole batches): nothing is left then, never a negative time."""
    import time

    if not rate > 0:
        return "-"
    return time.strftime("%H:%M:%S", time.gmtime(max(left, 0) / rate))


def _plain_progress(run_id: int, start_samples: int, to_stderr: bool = False):
    """An on_step callback printing one plain line (on stdout, or stderr) every
    $TWOCLOCKS_PROGRESS_S seconds (and at the last step): samples, reward, accuracy, eval,
    samples/s and ETA, for logs."""
    import sys
    import time

    try:
        every = max(0.0, float(os.environ.get("TWOCLOCKS_PROGRESS_S", "30")))
    except ValueError:
        every = 30.0
    t0 = time.monotonic()
    state = {"last": None, "eval": "-"}

    def on_step(p) -> None:
        now = time.monotonic()
        if p.eval_accuracy is not None:
            state["eval"] = f"{p.eval_accuracy:.3f}"
        done = p.samples >= p.budget
        if state["last"] is not None and now - state["last"] < every and not done:
            return
        state["last"] = now
        rate = (p.samples - start_samples) / max(now - t0, 1e-9)
        eta_txt = eta_text(p.budget - p.samples, rate)
        typer.echo(f"run {run_id}: {p.samples:,}/{p.budget:,} samples  step {p.step}  reward "
                   f"{p.reward:.3f}  acc {p.accuracy:.3f}  eval {state['eval']}  "
                   f"{rate_text(rate)}  ETA {eta_txt}", nl=True, err=to_stderr)
        (sys.stderr if to_stderr else sys.stdout).flush()

    return on_step
