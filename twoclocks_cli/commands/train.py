"""`twoclocks train CONFIG`: one GRPO run in-process, with a progress bar, recorded in the store.

The same entry point (`trainer.loop.train`) a sweep job reaches through the `grpo` backend.
Works under `accelerate launch` too: rank 0 owns the run row, the metrics and the bar.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from twoclocks_cli.options import DbOption


def _validate(cfg) -> None:
    """Fail on a missing model path, a bad dataset or a missing extra before anything is written."""
    import importlib.util

    from trainer.loop import load_data
    from trainer.tiny import TINY_MODEL_ID, resolve_model_path
    from twoclocks_cli.errors import ConfigError

    if cfg.model != TINY_MODEL_ID:
        resolve_model_path(cfg.model)
    load_data(cfg)
    if cfg.rollout_engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "rollout_engine = 'vllm' needs the vllm extra (pip install 'twoclocks[vllm]') and a "
            "GPU; use rollout_engine = 'hf' here"
        )


def _resume_row(store, cfg, workdir: Path, extend: bool) -> int:
    """The run `workdir/run.json` names, checked: same store, the run still there, the same
    config (or only a larger sample_budget with `extend`, then stored), its checkpoint its own.
    Every refusal is one ConfigError, raised before anything is written."""
    from trainer import checkpoint
    from twoclocks_cli.errors import ConfigError, NotFoundError
    from twoclocks_cli.launch import owner
    from twoclocks_cli.store.models import Run

    rec = owner.read(workdir) or {}
    here = owner.store_identity(store.engine.url)
    where = f"--workdir {workdir}"
    if rec.get("store") is None:
        raise ConfigError(f"{where}: its {owner.RUN_FILE} names no store (written by an older "
                          "twoclocks): resume refused; use another --workdir")
    if rec.get("store") != here:
        raise ConfigError(f"{where} belongs to {owner.describe(rec)}, not to a run of {here}: "
                          "resume refused; use another --workdir")
    try:
        run = store.get_run(int(rec["run_id"]))
    except (NotFoundError, KeyError, TypeError, ValueError):
        run = None
    if run is None or run.cell_id != rec.get("cell_id"):
        raise ConfigError(f"{where} belongs to {owner.describe(rec)} (cell {rec.get('cell_id')}), "
                          f"which that store no longer holds: resume refused; use another "
                          "--workdir")
    config = cfg.model_dump(mode="json")
    why = owner.config_refusal(run.config, config, extend)
    if why:
        raise ConfigError(f"{where}: run {run.id}: {why}")
    ckpt = checkpoint.latest(workdir)
    if ckpt is not None:
        why = checkpoint.refusal(ckpt, {"store": here, "run_id": run.id, "config": config}, extend)
        if why:
            raise ConfigError(why)
    if config != run.config:  # --extend: the run row says what the run is now trained to
        with store.session() as s:
            s.get(Run, run.id).config = config
    return run.id


def _run_row(store, cfg, name: str, workdir: Path | None, extend: bool = False
             ) -> tuple[int, Path]:
    """(run id, workdir): the run `workdir` names (a resume), else a new row in `workdir`
    (default: a fresh ./twoclocks-train/run-<id>-<uuid> that no other store's run can share)."""
    import uuid

    from trainer import checkpoint
    from twoclocks_cli.errors import ConfigError
    from twoclocks_cli.launch import owner
    from twoclocks_cli.store.models import Run

    if workdir is not None and owner.read(workdir) is not None:
        return _resume_row(store, cfg, workdir, extend), workdir
    if workdir is not None and (ckpt := checkpoint.latest(workdir)) is not None:
        rec = checkpoint.read_owner(ckpt) or {}
        raise ConfigError(f"--workdir {workdir} holds a checkpoint of {owner.describe(rec)} but "
                          f"no {owner.RUN_FILE}: resume refused; use another --workdir")
    if extend:
        raise ConfigError("--extend continues a run: give the --workdir of the run to extend")
    config = cfg.model_dump(mode="json")
    uid = uuid.uuid4().hex[:8]
    phase = cfg.phase_at(0)[1]
    with store.session() as s:
        run = Run(
            cell_id=f"train-{owner.config_hash(config)}-{uid}",
            name=name,
            backend="grpo",
            batch_prompts=phase.prompts_per_batch,
            group_size=cfg.group_size,
            batch_samples=phase.prompts_per_batch * cfg.group_size,
            lr=phase.lr,
            clip_low=phase.clip_eps_low,
            clip_high=phase.clip_eps_high,
            seed=cfg.seed,
            config=config,
        )
        s.add(run)
        s.flush()
        run_id, cell_id = run.id, run.cell_id
    workdir = workdir if workdir is not None else Path("twoclocks-train") / f"run-{run_id}-{uid}"
    owner.write(workdir, {"store": owner.store_identity(store.engine.url), "run_id": run_id,
                          "cell_id": cell_id, "config_hash": owner.config_hash(config)})
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
) -> None:
    """Train one GRPO run in-process; every step's metrics go to the store."""
    from trainer.config import load_config
    from trainer.loop import setup_dist
    from twoclocks_cli.errors import TwoclocksError
    from twoclocks_cli.store import Store
    from twoclocks_cli.store.models import RunStatus

    cfg = load_config(config)
    _validate(cfg)
    dist = setup_dist()
    store = writer = None
    run_id = None
    if dist.rank == 0:
        store = Store.open(db)
        run_id, workdir = _run_row(store, cfg, name or config.stem, workdir, extend)
    run_id, workdir = _broadcast((run_id, str(workdir)), dist)
    workdir = Path(workdir)
    if dist.rank == 0:
        store.set_status(
            run_id, RunStatus.running, host=os.uname().nodename,
            message=f"twoclocks train {config}" + (" --extend" if extend else ""),
        )
        writer = store.metric_writer(run_id)
    try:
        status = _train_with_bar(cfg, writer, workdir, run_id, dist.rank == 0, extend)
    except BaseException as err:
        if dist.rank == 0:
            state = RunStatus.cancelled if isinstance(err, KeyboardInterrupt) else RunStatus.failed
            writer.close()
            store.set_status(run_id, state, message=str(err)[:500], error=str(err)[:2000])
        if isinstance(err, TwoclocksError | KeyboardInterrupt | SystemExit):
            raise
        raise TwoclocksError(f"run {run_id} failed: {type(err).__name__}: {err}") from None
    if dist.rank == 0:
        writer.close()
        store.set_status(run_id, RunStatus(status))
        typer.echo(
            f"run {run_id} {status}: {store.count_metrics(run_id)} metric rows in "
            f"{store.url}; checkpoints in {workdir}"
        )


def _train_with_bar(cfg, writer, workdir: Path, run_id: int, show: bool, extend: bool) -> str:
    """Run the loop under a rich progress bar (samples/budget, reward, accuracy, ETA)."""
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

    from trainer.loop import train

    if not show:
        return train(cfg, writer, workdir, extend=extend)

    class Rate(ProgressColumn):
        """Samples per second over rich's recent window ('-' until there are two updates)."""

        def render(self, task) -> Text:
            return Text("-" if task.speed is None else f"{task.speed:,.0f} samples/s")
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
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("train", total=cfg.sample_budget, reward="-", acc="-", eval="-")

        def on_step(p) -> None:
            fields = {"reward": f"{p.reward:.3f}", "acc": f"{p.accuracy:.3f}"}
            if p.eval_accuracy is not None:
                fields["eval"] = f"{p.eval_accuracy:.3f}"
            bar.update(task, completed=min(p.samples, p.budget), **fields)

        return train(cfg, writer, workdir, on_step=on_step, extend=extend)
