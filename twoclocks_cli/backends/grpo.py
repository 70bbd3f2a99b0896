"""The `grpo` backend, and the one place that wires the trainer to the store and the launcher.

Contract (see `twoclocks_cli.backends`): `run(cell, writer, workdir) -> RunStatus` trains one
sweep cell (a TrainConfig dict) with `trainer.loop.train`; called again with the same workdir it
resumes from the last checkpoint there. `twoclocks train` trains through `train` here too.

The trainer knows no store and no CLI: it is handed what it needs (`trainer.ports`), built here
for a run of the store: its metric sink (the run's MetricWriter, events as notes of the run),
its adaptive controller (`twoclocks_cli.clocks.controller`, calibrated from a sweep in the store)
and its checkpoints' owner (the store and the run). Module-level imports stay light (no torch,
no sqlalchemy): the launcher imports this module for `store_identity`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainer.config import TrainConfig
    from trainer.ownership import CheckpointOwner
    from trainer.ports import ControllerFactory
    from twoclocks_cli.store.models import RunStatus


def store_identity(url) -> str:
    """The store's URL without its password; a relative SQLite path made absolute: what a
    workdir's and a checkpoint's owner record name the store by."""
    from sqlalchemy.engine import make_url

    from twoclocks_cli.store.engine import mask_url

    parsed = make_url(url) if isinstance(url, str) else url
    db = parsed.database
    if parsed.get_backend_name() == "sqlite" and db and db != ":memory:" and \
            not db.startswith("file:"):
        parsed = parsed.set(database=str(Path(db).resolve()))
    return mask_url(parsed)


class StoreSink:
    """The trainer's metric sink for a run of the store: metrics through its MetricWriter,
    events as notes of the run."""

    def __init__(self, writer):
        self.writer = writer
        self._store = None

    @property
    def store(self):
        """A Store over the writer's engine (made on first use: only adaptive runs need one)."""
        if self._store is None:
            from twoclocks_cli.store import Store

            self._store = Store(self.writer.engine)
        return self._store

    def log(self, step: int, samples: int, values) -> None:
        self.writer.log(step, samples, values)

    def flush(self) -> None:
        self.writer.flush()

    def event(self, message: str) -> None:
        from twoclocks_cli.clocks.controller import record_event

        record_event(self.store, self.writer.run_id, message)


def sink_of(writer):
    """The sink the trainer writes to: a StoreSink over a MetricWriter of the store; any other
    sink as it is; None (ranks other than 0) stays None."""
    if writer is not None and getattr(writer, "engine", None) is not None:
        return StoreSink(writer)
    return writer


def owner_of(cfg: TrainConfig, writer) -> CheckpointOwner:
    """Who the training's checkpoints belong to: its config and, when `writer` writes to a
    store, that store and run."""
    from trainer.ownership import CheckpointOwner

    config = cfg.model_dump(mode="json")
    engine, run_id = getattr(writer, "engine", None), getattr(writer, "run_id", None)
    if engine is None or run_id is None:
        return CheckpointOwner(config)
    return CheckpointOwner(config, store_identity(engine.url), int(run_id))


def controller_of(cfg: TrainConfig, sink) -> ControllerFactory | None:
    """The adaptive controller's factory (None unless batch_schedule = "adaptive"): a fresh run
    calibrates from `adaptive.from_sweep` in the sink's store (recorded as an event of its run);
    a resumed one carries its calibration in the checkpointed state."""
    if cfg.batch_schedule != "adaptive":
        return None
    from twoclocks_cli.clocks import controller

    base = cfg.phase_at(0)[1]
    store = run_id = None
    if isinstance(sink, StoreSink):
        store, run_id = sink.store, sink.writer.run_id

    def make(state: dict | None):
        return controller.start(cfg.adaptive, cfg.group_size, base.prompts_per_batch, base.lr,
                                store, run_id, state)

    return make


def train(cfg: TrainConfig, writer, workdir: Path, **options) -> str:
    """`trainer.loop.train` for a run of the store: `writer` is its MetricWriter (None on ranks
    other than 0); the sink, the controller and the checkpoints' owner are built from it.
    `options`: on_step, extend, make_rollout (as `trainer.loop.train`)."""
    from trainer.loop import train as train_loop

    sink = sink_of(writer)
    return train_loop(cfg, sink, Path(workdir), controller=controller_of(cfg, sink),
                      owner=owner_of(cfg, writer), **options)


def run(cell: dict, writer, workdir: Path) -> RunStatus:
    """Train the cell; `completed`, or `diverged` when the loss/gradient went non-finite."""
    from trainer.config import TrainConfig
    from twoclocks_cli.store.models import RunStatus

    cfg = TrainConfig.from_dict(cell, source="cell config")
    return RunStatus(train(cfg, writer, Path(workdir)))
