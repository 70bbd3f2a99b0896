"""A grpo probe's cells through the sweep executors, in two stages: the replay, then the branches.

The branches start from the replay's final checkpoint, so they are submitted once it completed;
each call does what is due (register the cells, submit what is planned or lost — failed and
cancelled ones too with `retry_failed` — and with `wait` follow them), so running the same
probe again continues where it stands, as a rerun of `twoclocks sweep` does. The executor and
its settings are the run's sweep's (local, slurm), or local for a run outside a sweep.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from twoclocks_cli.core.errors import LaunchError
from twoclocks_cli.launch import sweeps
from twoclocks_cli.launch.monitor import watcher
from twoclocks_cli.launch.state import PENDING, RETRYABLE
from twoclocks_cli.store.models import RunStatus


@dataclass
class Stage:
    """Where a probe stands after one call: its cells' statuses and what it submitted."""

    replay: str | None  # the replay cell's status (None at 0 samples: no replay)
    branches: dict[str, int]  # status -> count
    submitted: int
    runs: dict[str, int]  # cell id -> run id

    @property
    def done(self) -> bool:
        """Every branch ended (completed or diverged): the result can be computed."""
        return sum(self.branches.get(s, 0) for s in ("completed", "diverged")) == \
            sum(self.branches.values())


def executor(parent_sweep_config: dict | None, name: str | None, sweep: str):
    """The executor for the probe's cells (refused before anything is written)."""
    from twoclocks_cli.config.models import Local, Slurm

    sweeps.check_executor(name)
    d = parent_sweep_config or {}
    cfg = SimpleNamespace(name=sweep, executor=name or d.get("executor") or "local",
                          local=Local.model_validate(d.get("local") or {}),
                          slurm=Slurm.model_validate(d.get("slurm") or {}))
    return sweeps.choose_executor(cfg)


def advance(store, probe, ex, db_url: str, wait: bool, retry_failed: bool, source: str,
            follow=None) -> Stage:
    """Register the probe's cells and submit what is due; `follow(watch, sweep)` (a view of
    render.status) waits on the sweep's snapshots."""
    from twoclocks_cli.adaptive.probe.grpo import register

    runs = register(store, probe, source)
    wanted = PENDING | RETRYABLE if retry_failed else PENDING
    reg = sweeps.Registered(probe.sweep, probe.folder, 0, 0, runs)
    submitted = 0
    replay_id = runs[probe.replay.cell_id] if probe.replay is not None else None
    if replay_id is not None:
        submitted += _submit(store, reg, [replay_id], wanted, ex, db_url)
        if wait and store.get_run(replay_id).status != RunStatus.completed.value:
            follow(watcher(store, probe.sweep), probe.sweep)
        status = store.get_run(replay_id).status
        if status in (RunStatus.failed.value, RunStatus.cancelled.value, RunStatus.diverged.value):
            run = store.get_run(replay_id)
            hint = ("" if status == RunStatus.diverged.value
                    else "; rerun the probe with --retry-failed")
            raise LaunchError(f"the replay of run {probe.run_id} to {probe.at_samples:,} samples "
                              f"(run {replay_id}) {status}: {run.error or 'no error recorded'}"
                              f"{hint}")
        if status != RunStatus.completed.value:
            return _stage(store, probe, runs, submitted)
    ids = [runs[b.cell.cell_id] for b in probe.branches]
    submitted += _submit(store, reg, ids, wanted, ex, db_url)
    if wait:
        follow(watcher(store, probe.sweep), probe.sweep)
    return _stage(store, probe, runs, submitted)


def _submit(store, reg, ids: list[int], wanted, ex, db_url: str) -> int:
    sweeps.refresh(store, reg.sweep)  # a job that vanished since the last look is lost now
    todo = store.runs_with_status(ids, wanted)
    return len(sweeps.submit(store, reg, todo, ex, db_url))


def _stage(store, probe, runs: dict[str, int], submitted: int) -> Stage:
    sweeps.refresh(store, probe.sweep)
    counts: dict[str, int] = {}
    for b in probe.branches:
        s = store.get_run(runs[b.cell.cell_id]).status
        counts[s] = counts.get(s, 0) + 1
    replay = store.get_run(runs[probe.replay.cell_id]).status if probe.replay else None
    return Stage(replay, counts, submitted, runs)


def failed_branches(store, probe, stage: Stage) -> str | None:
    """One line naming failed or cancelled branches, when there are any."""
    bad = []
    for b in probe.branches:
        run = store.get_run(stage.runs[b.cell.cell_id])
        if run.status in (RunStatus.failed.value, RunStatus.cancelled.value):
            bad.append(f"run {run.id} (B={b.batch}, r{b.replicate}) {run.status}: "
                       f"{run.error or 'no error recorded'}")
    if not bad:
        return None
    return (f"{len(bad)} branch(es) of the probe failed or were cancelled: {bad[0]}"
            + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
            + "; rerun the probe with --retry-failed")
