"""Sweep lifecycle against the store: register cells, submit the pending ones as one batch,
reconcile with the scheduler (one query per refresh), cancel."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from twoclocks_cli.backends import sweep_backend
from twoclocks_cli.config.models import SweepConfig
from twoclocks_cli.config.plan import Plan
from twoclocks_cli.core.errors import ConfigError, LaunchError, NotFoundError
from twoclocks_cli.launch.base import JobState, Submission
from twoclocks_cli.launch.state import ACTIVE, PENDING, RETRYABLE
from twoclocks_cli.store.models import Run, RunStatus
from twoclocks_cli.store.registry import NewCell

UNKNOWN_GRACE_S = 120  # a job id the scheduler never heard of this long after submission: lost
WAITING = frozenset({RunStatus.submitted, RunStatus.running})
SUBMITTING = "submitting"  # job id kind while `submit` sends a run: submitting:HOST:PID


def absolute_db_url(url: str) -> str:
    """Make a relative SQLite path absolute, so jobs that start elsewhere find the same file."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/"):
        rest = url[len(prefix):]
        if rest and not rest.startswith(":memory:"):
            path, _, query = rest.partition("?")
            url = prefix + str(Path(path).resolve()) + (f"?{query}" if query else "")
    return url


def check_executor(name: str | None) -> None:
    """Refuse an --executor that names no executor, before anything is read or written."""
    from twoclocks_cli.config.models import EXECUTORS

    if name is not None and name not in EXECUTORS:
        raise ConfigError(f"--executor {name!r}: allowed are {', '.join(EXECUTORS)}")


def choose_executor(cfg: SweepConfig, name: str | None = None):
    """The executor object for `name` (default: the config's; auto → slurm if present)."""
    from twoclocks_cli.launch import slurm
    from twoclocks_cli.launch.debug import DebugExecutor
    from twoclocks_cli.launch.local import LocalExecutor, default_parallel

    name = name or cfg.executor
    if name == "auto":
        name = "slurm" if slurm.available() else "local"
    if name == "slurm":
        if not slurm.available():
            raise LaunchError("executor 'slurm': sbatch/sacct/srun not found on PATH (start a "
                              "cluster with scripts/slurm-up.sh, or set executor = \"local\")")
        return slurm.SlurmExecutor(cfg.slurm, job_name=f"tc-{cfg.name}")
    if name == "debug":
        return DebugExecutor()
    loc = cfg.local
    return LocalExecutor(loc.max_parallel or default_parallel(loc.threads_per_job),
                         loc.threads_per_job, loc.timeout_min)


def executor_for_job(job_id: str | None) -> str:
    """Which executor kind a stored job id belongs to."""
    if not job_id:
        return "none"
    return job_id.split(":", 1)[0] if ":" in job_id else "slurm"


def redacted(config: dict) -> dict:
    """A sweep config as it may be stored or shown: the `store` URL's password masked."""
    from twoclocks_cli.store.engine import mask_url

    out = dict(config)
    if isinstance(out.get("store"), str):
        out["store"] = mask_url(out["store"])
    return out


@dataclass
class Registered:
    sweep: str
    folder: str
    new: int
    existing: int
    runs: dict[str, int] = field(default_factory=dict)  # cell id → run id (current plan)


def register(store, plan: Plan, source: str) -> Registered:
    """Create the sweep and its new cells in ONE transaction (all or nothing), once the sweeps
    its adaptive cells calibrate from are found in `store` (check_calibration)."""
    cfg = plan.config
    check_calibration(store, [c.config for c in plan.cells], source,
                      f"{sweep_backend(cfg.backend).TABLE}.adaptive.from_sweep")
    # unique per registration: another store's sweep of the same name never shares (and
    # resumes from) these checkpoints
    folder = str(Path(cfg.workdir).resolve() / f"{cfg.name}-{uuid.uuid4().hex[:8]}")
    cells = [NewCell(c.cell_id, c.name, {
        "batch_prompts": c.prompts, "group_size": c.group_size, "batch_samples": c.batch_samples,
        "lr": c.lr, "clip_low": c.clip_low, "clip_high": c.clip_high, "seed": c.seed},
        c.config) for c in plan.cells]
    reg = store.register_cells(cfg.name, cfg.backend, redacted(cfg.model_dump(mode="json")),
                               folder, cells, source)
    return Registered(cfg.name, reg.folder, reg.new, reg.existing, reg.runs)


def check_calibration(store, cells: list[dict], source: str, key: str) -> None:
    """Every sweep an adaptive cell calibrates from (its `adaptive.from_sweep`, written as
    `key`) is in `store` and has a stored analysis: a cell calibrates when it starts, from the
    store it writes to, so without them every such cell would fail there (ConfigError)."""
    names = sorted({c["adaptive"]["from_sweep"] for c in cells
                    if c.get("batch_schedule") == "adaptive" and isinstance(c.get("adaptive"), dict)
                    and isinstance(c["adaptive"].get("from_sweep"), str)})
    for name in names:
        where = f"{source}: key {key!r} = {name!r}"
        try:
            analysis = store.latest_analysis(name)
        except NotFoundError as err:
            raise ConfigError(f"{where}: {err} in {store.url}; run that sweep there and "
                              f"`twoclocks analyze {name} --save` first") from None
        if analysis is None:
            raise ConfigError(f"{where}: the sweep has no stored analysis in {store.url}: run "
                              f"`twoclocks analyze {name} --save` first")


def to_submit(store, reg: Registered, retry_failed: bool) -> list[Run]:
    """Runs of the current plan to send: planned and lost ones (reconciled first, so a job that
    vanished since the last look counts as lost), plus failed/cancelled with retry."""
    refresh(store, reg.sweep)
    wanted = PENDING | RETRYABLE if retry_failed else PENDING
    return store.runs_with_status(reg.runs.values(), wanted)


def submit(store, reg: Registered, runs: list[Run], executor, db_url: str) -> dict[int, str]:
    """Mark `runs` submitted, send them as one batch, store their job ids."""
    if not runs:
        return {}
    folder = Path(reg.folder)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    sub = Submission(folder=folder / "submissions" / f"{stamp}-{uuid.uuid4().hex[:8]}",
                     db_url=db_url, sweep=reg.sweep,
                     runs=[(r.id, str(folder / "cells" / r.cell_id[:16])) for r in runs])
    # until the executor answers, the job id names this process: if it dies here, the
    # reconciler finds the runs lost instead of leaving them submitted forever
    placeholder = f"{SUBMITTING}:{socket.gethostname()}:{os.getpid()}"
    sent = set(store.transition_many([r.id for r in runs], RunStatus.submitted,
                               PENDING | RETRYABLE, f"submitting via {executor.name}",
                               job_id=placeholder, error=None))
    sub = Submission(sub.folder, sub.db_url, [x for x in sub.runs if x[0] in sent], sub.sweep)
    try:
        job_ids = executor.submit(sub)
    except Exception as exc:
        store.transition_many(sent, RunStatus.planned, {RunStatus.submitted},
                        f"submission failed: {' '.join(str(exc).split())[:300]}")
        if isinstance(exc, LaunchError):
            raise
        raise LaunchError(f"submitting {len(sent)} cell(s) via {executor.name} failed: "
                          f"{' '.join(str(exc).split())[:300]}") from None
    store.record_jobs(reg.sweep, executor.name, job_ids, placeholder)
    if hasattr(executor, "run"):  # debug: execute now, in this process
        executor.run(sub)
    return job_ids


@dataclass
class Refresh:
    """What one reconciliation did: scheduler queries made and runs it corrected."""

    queries: dict[str, int] = field(default_factory=dict)
    fixed: list[tuple[int, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


class _Submitting:
    """Runs between `submitted` and their job id: alive while the submitting process is."""

    name = SUBMITTING

    def query(self, job_ids: list[str]):
        from twoclocks_cli.launch.local import process_states

        return process_states(job_ids)

    def cancel(self, job_ids: list[str]) -> None:
        return None  # marked cancelled: the job finds its run cancelled and does nothing


def _executors_by_kind() -> dict:
    """One executor per job-id kind, for queries and cancels (no submit parameters needed)."""
    from twoclocks_cli.config.models import Slurm
    from twoclocks_cli.launch.debug import DebugExecutor
    from twoclocks_cli.launch.local import LocalExecutor
    from twoclocks_cli.launch.slurm import SlurmExecutor

    return {"slurm": SlurmExecutor(Slurm()), "local": LocalExecutor(1), "debug": DebugExecutor(),
            SUBMITTING: _Submitting()}


def refresh(store, sweep: str | None = None) -> Refresh:
    """Reconcile every waiting run (of one sweep or all) with ONE query per executor kind.

    A job that ended without reporting (killed, node lost, out of memory, timed out for good,
    unknown to the scheduler) makes its run `lost`, which a plain rerun resumes; a cell that
    raised was marked `failed` by its job; a job cancelled outside twoclocks: `cancelled`."""
    out = Refresh()
    rows = store.jobs_with_status(WAITING, sweep, submitted_only=True)
    if not rows:
        return out
    by_kind: dict[str, list] = {}
    for row in rows:
        by_kind.setdefault(executor_for_job(row.job_id), []).append(row)
    executors = _executors_by_kind()
    now = datetime.now(timezone.utc)
    for kind, group in by_kind.items():
        ex = executors.get(kind)
        if ex is None:
            continue
        try:
            states = ex.query(sorted({r.job_id for r in group}))
        except LaunchError as exc:
            out.problems.append(str(exc))
            continue
        finally:
            out.queries[kind] = out.queries.get(kind, 0) + 1
        for r in group:
            info = states.get(r.job_id)
            if info is None or info.state is JobState.alive:
                continue
            if info.state is JobState.unknown:
                sub_at = r.submitted_at
                if sub_at is not None and sub_at.tzinfo is None:
                    sub_at = sub_at.replace(tzinfo=timezone.utc)
                if kind not in ("slurm", SUBMITTING) or sub_at is None or \
                        now - sub_at < timedelta(seconds=UNKNOWN_GRACE_S):
                    continue
                to, msg = RunStatus.lost, f"job {r.job_id} unknown to the scheduler"
            elif info.state is JobState.cancelled:
                to, msg = RunStatus.cancelled, f"job {r.job_id} cancelled ({info.detail})"
            elif info.state is JobState.failed:
                to, msg = RunStatus.lost, f"job {r.job_id} ended {info.detail} without reporting"
            else:
                to, msg = RunStatus.lost, (f"job {r.job_id} ended without reporting "
                                           f"({info.detail or 'no result'})")
            if store.transition(r.id, to, WAITING, f"reconciled: {msg}", job_id_is=r.job_id,
                          error=msg if to is RunStatus.lost else None):
                out.fixed.append((r.id, to.value))
    return out


def cancel(store, sweep: str) -> tuple[int, list[str]]:
    """Mark every active or lost run of `sweep` cancelled (so a plain rerun leaves it), then
    stop the jobs of the active ones (one call per kind)."""
    store.get_sweep(sweep)  # NotFoundError names the known sweeps
    stoppable = ACTIVE | {RunStatus.lost}
    rows = store.jobs_with_status(stoppable, sweep)
    changed = set(store.transition_many([r.id for r in rows], RunStatus.cancelled, stoppable,
                                  "cancelled by twoclocks cancel"))
    done = [r for r in rows if r.id in changed]
    by_kind: dict[str, set] = {}
    for r in done:
        if r.job_id and r.status != RunStatus.lost.value:
            by_kind.setdefault(executor_for_job(r.job_id), set()).add(r.job_id)
    problems = []
    executors = _executors_by_kind()
    for kind, ids in by_kind.items():
        try:
            executors[kind].cancel(sorted(ids))
        except (KeyError, LaunchError) as exc:
            problems.append(f"{kind}: {exc}")
    return len(done), problems
