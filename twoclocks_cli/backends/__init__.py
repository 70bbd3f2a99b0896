"""Backends execute one run (a sweep cell) and write its step metrics through a MetricWriter.

Every backend is a module with one interface (`SweepBackend`), so neither the launcher nor the
planner branches on them. The job side is one function:

    run(cell: dict, writer: MetricWriter, workdir: pathlib.Path) -> RunStatus

`cell` is the run's fully resolved config (the `runs.config` JSON). Common keys that the sweep
planner sets for every backend: `prompts_per_batch`, `group_size`, `lr`, `clip_eps_low`,
`clip_eps_high`, `seed`, `sample_budget`, and optionally `phases` (a list of
{until_samples, prompts_per_batch, lr, clip_eps_low, clip_eps_high}); the `trl` and `command`
backends read their own `trl` / `command` table of the cell. `workdir` is a private
directory for checkpoints: a backend called again with the same workdir resumes from its last
checkpoint (the writer upserts, so replayed steps never duplicate rows). The backend returns
`completed` or `diverged`; an exception means `failed`.

The plan side (`SweepBackend`'s other members) checks the backend's table of the sweep config,
resolves each cell's config, validates it as `run` will read it and says how many steps it
runs, without importing torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from twoclocks_cli.core.errors import ConfigError

# name → "module:function"; imported only when a run of that backend executes. The one list of
# backend names: the sweep config's `backend` field takes these, in this order.
BACKENDS = {
    "trl": "twoclocks_cli.backends.trl:run",
    "command": "twoclocks_cli.backends.command:run",
    "grpo": "twoclocks_cli.backends.grpo:run",
    "sim": "twoclocks_cli.backends.sim:run",
}


# keys every cell holds, set by the sweep; the sweep key that sets each
COMMON_KEYS = ("prompts_per_batch", "group_size", "lr", "clip_eps_low", "clip_eps_high", "seed",
               "sample_budget")
SWEEP_KEYS = {"prompts_per_batch": "grid.batch", "group_size": "grid.group_size",
              "lr": "scaling.reference_lr", "clip_eps_low": "grid.clip_low",
              "clip_eps_high": "grid.clip_high", "seed": "grid.seeds",
              "sample_budget": "sample_budget"}
# the scaling keys Adam's beta1, beta2 and eps come from (with scaling.adam_adjust)
ADAM_SWEEP_KEYS = ("scaling.adam_beta1", "scaling.adam_beta2", "scaling.adam_eps")


class SweepBackend(Protocol):
    """What a backend module provides. `cfg` is the SweepConfig, `source` the name errors start
    with; a planned cell (`twoclocks_cli.config.plan.Cell`) has .config (the dict `run` gets),
    .name, .steps, .prompts, .group_size and .seed."""

    TABLE: str  # its options' table of the sweep config: [TABLE] and grid.TABLE
    ADAM_KEYS: tuple[str, str, str]  # its options' names for Adam's beta1, beta2 and eps

    def check_options(self, cfg, source: str) -> None:
        """Its table before the grid is read: there where required, no key the sweep sets."""

    def check_table(self, cfg, source: str, config_dir: str | None) -> dict:
        """Its table checked as a whole; returns the keys every cell carries."""

    def resolve_cell(self, cfg, common: dict, options: dict, table: dict) -> dict:
        """A cell's config: the common keys, the `table` keys, and `options` (the cell's option
        axes and its Adam settings, named as its options) where it reads its options."""

    def cell_checker(self, cfg, source: str) -> Callable[[Any], None]:
        """A function raising ConfigError for a planned cell `run` would refuse."""

    def steps(self, budget: int, batch: int) -> int:
        """Steps (rollout batches) a cell of `budget` samples at `batch` samples runs."""

    def clip_warning(self, cells: list, settings: int) -> str | None:
        """The warning when `settings` clip settings vary over `cells` but cannot bind."""

    LINE_KEY: str | None  # the --json key of what cell_line says, None when it says nothing

    def cell_line(self, cell) -> str | None:
        """What the backend runs for a planned cell, as one line a person can copy (the command
        line, the trainer's arguments), or None when the cell's table says it all."""

    def written_as(self, cfg, key: str) -> str | None:
        """The sweep config key a dotted cell key came from; None for a key of the cell's top
        level the backend does not own (a common key)."""

    def run(self, cell: dict, writer, workdir: Path):
        """Execute the cell (see above)."""


def _target(name: str) -> tuple[str, str]:
    try:
        target = BACKENDS[name]
    except KeyError:
        allowed = ", ".join(sorted(BACKENDS))
        raise ConfigError(f"unknown backend {name!r}: allowed are {allowed}") from None
    module, func = target.split(":")
    return module, func


def get_backend(name: str):
    """The run function of backend `name`."""
    module, func = _target(name)
    return getattr(importlib.import_module(module), func)


def sweep_backend(name: str) -> SweepBackend:
    """The module of backend `name` (imported now: only the planned backend is)."""
    return importlib.import_module(_target(name)[0])  # type: ignore[return-value]


def adam_keys(names: tuple[str, str, str]) -> dict[str, str]:
    """A backend's Adam option names -> the scaling keys that set them."""
    return dict(zip(names, ADAM_SWEEP_KEYS, strict=True))


def require_table(cfg, table: str, source: str) -> None:
    """A backend that reads nothing but its [table] needs one."""
    if getattr(cfg, table) is None:
        raise ConfigError(f"{source}: key {table!r} is required with backend = {cfg.backend!r} "
                          f"(a [{table}] table; see docs/sweeps.md)")


def refuse_owned(cfg, table: str, owned: set[str], source: str) -> None:
    """[table] and grid.table may not set a key the sweep sets itself."""
    for where, opts in ((table, getattr(cfg, table)), (f"grid.{table}", getattr(cfg.grid, table))):
        for key in opts:
            if key in owned:
                raise ConfigError(f"{source}: key '{where}.{key}': set by the sweep itself "
                                  "(grid, scaling, sample_budget); remove it here")


def cell_source(cell, source: str) -> str:
    """What errors about one planned cell start with."""
    return f"{source} (cell batch {cell.prompts}x{cell.group_size}, seed {cell.seed})"


def run_cell(store, run_id: int, workdir: Path):
    """Execute run `run_id` of `store` with its backend; returns the backend's RunStatus.

    Marking the run running/completed/failed is the caller's job (the launcher's job side).
    """
    run = store.get_run(run_id)
    backend = get_backend(run.backend)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    with store.metric_writer(run_id) as writer:
        return backend(dict(run.config), writer, workdir)
