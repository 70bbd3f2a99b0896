"""What `trainer.loop.train` is handed, as small Protocols: where its metrics and events go, who
picks the batch when `batch_schedule = "adaptive"`, and who owns its checkpoints.

The trainer imports nothing of the CLI, so it can be read and reused alone: any object with
these methods will do. `twoclocks_cli.backends.grpo` builds them for a run of the store (its
metric writer, the controller of `twoclocks_cli.adaptive.controller`, the store and run as the
checkpoints' owner); `trainer.ownership.CheckpointOwner` is the owner of a training without one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class MetricSink(Protocol):
    """Where rank 0 writes each step's metrics and the run's events."""

    def log(self, step: int, samples: int, values: Mapping[str, float]) -> None:
        """Record `values` (key -> number) at `step`, which had consumed `samples` samples."""

    def flush(self) -> None:
        """Make what was logged durable (before each checkpoint: metrics never lag it)."""

    def event(self, message: str) -> None:
        """Record a one-line event of the run: an adaptive decision's reason, or a warning
        (e.g. no learning signal at the start)."""


@dataclass
class BranchResult:
    """What one branch of a `rule = "branch"` decision measured, from the decision's state.

    prompts: its batch; samples: what it spent; gain: its progress over the branch (the
    backend's evaluation, the same problems and draws for every branch of a decision); drift:
    the `drift_key` value at its end. A branch that diverged has NaN gain and drift."""

    prompts: int
    samples: float
    gain: float
    drift: float


class Decision(Protocol):
    """One decision of a controller: the new batch and lr, and why."""

    @property
    def reason(self) -> str:
        """One line: what changed and why (the run's event)."""

    def metrics(self) -> dict[str, float]:
        """The decision as step metrics, logged with the step that took it."""


class Controller(Protocol):
    """Picks the next step's batch and lr from the steps so far (`batch_schedule =
    "adaptive"`); the config's clip range stays."""

    @property
    def prompts(self) -> int:
        """The next step's batch, in prompts."""

    @property
    def lr(self) -> float:
        """The next step's learning rate."""

    @property
    def decisions(self) -> int:
        """Decisions taken so far: the next step's phase index."""

    def mode_metrics(self) -> dict[str, float]:
        """The mode the next step runs in, as step metrics."""

    @property
    def cfg(self):
        """Its `[adaptive]` options (`trainer.adaptive.config.AdaptiveConfig`): the trainer
        reads `rule` (whether decisions branch) and `drift_key` (the drift a branch reports)."""

    def lr_at(self, prompts: int) -> float:
        """The learning rate the controller gives a batch of `prompts` (a branch's lr)."""

    def observe(self, step: int, samples: float, signals: dict,
                brancher: Callable | None = None) -> Decision | None:
        """Fold in one step's metrics; at a decision point set the next batch and lr and return
        the decision (None between decisions). `brancher(batches, samples)` runs branches
        from the current state and returns one BranchResult each (None: no budget)."""

    def to_dict(self) -> dict:
        """Its whole state, JSON-able: saved with each checkpoint, handed back on resume."""


ControllerFactory = Callable[[dict | None], Controller]
"""The run's controller, restored from the state a checkpoint saved (None: a fresh run). Called
once, after the resume: a controller calibrated at its start is not calibrated again."""


class Owner(Protocol):
    """Who the checkpoints in a workdir belong to."""

    @property
    def record(self) -> dict:
        """What every checkpoint records as its owner (JSON-able)."""

    def refusal(self, path: Path, extend: bool) -> str | None:
        """Why checkpoint directory `path` must not be resumed by this owner (None: it may);
        `extend`: the resume may raise sample_budget."""
