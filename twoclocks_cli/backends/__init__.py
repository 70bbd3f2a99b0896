"""Backends execute one run (a sweep cell) and write its step metrics through a MetricWriter.

Every backend is a function with one signature, so the launcher never branches on them:

    run(cell: dict, writer: MetricWriter, workdir: pathlib.Path) -> RunStatus

`cell` is the run's fully resolved config (the `runs.config` JSON). Common keys that the sweep
planner sets for every backend: `prompts_per_batch`, `group_size`, `lr`, `clip_eps_low`,
`clip_eps_high`, `seed`, `sample_budget`, and optionally `phases` (a list of
{until_samples, prompts_per_batch, lr, clip_eps_low, clip_eps_high}); the `trl` and `command`
backends read their own `trl` / `command` table of the cell. `workdir` is a private
directory for checkpoints: a backend called again with the same workdir resumes from its last
checkpoint (the writer upserts, so replayed steps never duplicate rows). The backend returns
`completed` or `diverged`; an exception means `failed`.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from twoclocks_cli.core.errors import ConfigError

# name → "module:function"; imported only when a run of that backend executes.
BACKENDS = {
    "sim": "twoclocks_cli.backends.sim:run",
    "grpo": "twoclocks_cli.backends.grpo:run",
    "trl": "twoclocks_cli.backends.trl:run",
    "command": "twoclocks_cli.backends.command:run",
}


def get_backend(name: str):
    """The run function of backend `name`."""
    try:
        target = BACKENDS[name]
    except KeyError:
        allowed = ", ".join(sorted(BACKENDS))
        raise ConfigError(f"unknown backend {name!r}: allowed are {allowed}") from None
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


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
