"""The `grpo` backend: one sweep cell (a TrainConfig dict) trained by `trainer.loop.train`.

Contract (see `twoclocks_cli.backends`): `run(cell, writer, workdir) -> RunStatus`; called
again with the same workdir it resumes from the last checkpoint there.
"""

from __future__ import annotations

from pathlib import Path

from trainer.config import TrainConfig
from twoclocks_cli.store.models import RunStatus


def run(cell: dict, writer, workdir: Path) -> RunStatus:
    """Train the cell; `completed`, or `diverged` when the loss/gradient went non-finite."""
    from trainer.loop import train

    cfg = TrainConfig.from_dict(cell, source="cell config")
    return RunStatus(train(cfg, writer, Path(workdir)))
