"""`twoclocks train CONFIG`: one GRPO run in-process, with a progress bar, recorded in the store.

The same entry point (`trainer.loop.train`) a sweep job reaches through the `grpo` backend.
Works under `accelerate launch` too: rank 0 owns the run row, the metrics and the bar.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from twoclocks_cli.options import DbOption

RUN_FILE = "run.json"  # in the workdir: which run row a resumed `train` continues


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


def _run_row(store, cfg, name: str, workdir: Path | None) -> tuple[int, Path]:
    """(run id, workdir): the run recorded in `workdir` (a resume), else a new row."""
    import hashlib

    from twoclocks_cli.errors import NotFoundError
    from twoclocks_cli.store.models import Run

    if workdir is not None and (workdir / RUN_FILE).is_file():
        run_id = json.loads((workdir / RUN_FILE).read_text())["run_id"]
        try:
            store.get_run(run_id)
            return run_id, workdir
        except NotFoundError:  # recorded in another database: start a new row
            pass
    config = cfg.model_dump(mode="json")
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
    phase = cfg.phase_at(0)[1]
    with store.session() as s:
        run = Run(
            cell_id=f"train-{digest}-{os.getpid()}",
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
        run_id = run.id
    workdir = workdir if workdir is not None else Path("twoclocks-train") / f"run-{run_id}"
    workdir.mkdir(parents=True, exist_ok=True)
    tmp = workdir / (RUN_FILE + ".tmp")
    tmp.write_text(json.dumps({"run_id": run_id}))
    os.replace(tmp, workdir / RUN_FILE)
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
            "directory resumes its run. Default: ./twoclocks-train/run-<id>.",
        ),
    ] = None,
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
        run_id, workdir = _run_row(store, cfg, name or config.stem, workdir)
    run_id, workdir = _broadcast((run_id, str(workdir)), dist)
    workdir = Path(workdir)
    if dist.rank == 0:
        store.set_status(
            run_id, RunStatus.running, message=f"twoclocks train {config}", host=os.uname().nodename
        )
        writer = store.metric_writer(run_id)
    try:
        status = _train_with_bar(cfg, writer, workdir, run_id, dist.rank == 0)
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


def _train_with_bar(cfg, writer, workdir: Path, run_id: int, show: bool) -> str:
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
        return train(cfg, writer, workdir)

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

        return train(cfg, writer, workdir, on_step=on_step)
