"""Sweep lifecycle against the store: register cells, submit the pending ones as one batch,
reconcile with the scheduler (one query per refresh), cancel."""

from __future__ import annotations

import os
import socket
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import func, select

from twoclocks_cli.config.models import SweepConfig
from twoclocks_cli.config.plan import Plan
from twoclocks_cli.errors import ConfigError, LaunchError
from twoclocks_cli.launch.base import JobState, Submission
from twoclocks_cli.launch.state import ACTIVE, PENDING, RETRYABLE, transition, transition_many
from twoclocks_cli.store.models import Metric, Run, RunStatus, Sweep

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
    """Create the sweep and its new cells in ONE transaction (all or nothing)."""
    cfg = plan.config
    with store.session() as s:
        sweep = s.scalar(select(Sweep).where(Sweep.name == cfg.name))
        if sweep is not None and sweep.backend != cfg.backend:
            raise ConfigError(f"{source}: key 'backend' = {cfg.backend!r}: sweep {cfg.name!r} "
                              f"already exists with backend {sweep.backend!r}; use a new name")
        # unique per registration: another store's sweep of the same name never shares (and
        # resumes from) these checkpoints
        folder = str(Path(cfg.workdir).resolve() / f"{cfg.name}-{uuid.uuid4().hex[:8]}")
        if sweep is None:
            sweep = Sweep(name=cfg.name, backend=cfg.backend, folder=folder,
                          config=redacted(cfg.model_dump(mode="json")))
            s.add(sweep)
            s.flush()
        else:
            sweep.config = redacted(cfg.model_dump(mode="json"))
            sweep.folder = sweep.folder or folder  # e.g. a sweep created by an ingest
        have = {r.cell_id: r for r in s.scalars(select(Run).where(Run.sweep_id == sweep.id))}
        new = 0
        for cell in plan.cells:
            if cell.cell_id in have:
                continue
            run = Run(sweep_id=sweep.id, cell_id=cell.cell_id, name=cell.name,
                      backend=cfg.backend, batch_prompts=cell.prompts,
                      group_size=cell.group_size, batch_samples=cell.batch_samples, lr=cell.lr,
                      clip_low=cell.clip_low, clip_high=cell.clip_high, seed=cell.seed,
                      config=cell.config, status=RunStatus.planned.value)
            s.add(run)
            have[cell.cell_id] = run
            new += 1
        s.flush()
        ids = {c.cell_id: have[c.cell_id].id for c in plan.cells}
        return Registered(cfg.name, sweep.folder, new, len(plan.cells) - new, ids)


def to_submit(store, reg: Registered, retry_failed: bool) -> list[Run]:
    """Runs of the current plan to send: planned and lost ones (reconciled first, so a job that
    vanished since the last look counts as lost), plus failed/cancelled with retry."""
    refresh(store, reg.sweep)
    wanted = {s.value for s in PENDING}
    if retry_failed:
        wanted |= {s.value for s in RETRYABLE}
    with store.session() as s:
        q = select(Run).where(Run.id.in_(list(reg.runs.values())), Run.status.in_(wanted))
        return list(s.scalars(q.order_by(Run.id)))


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
    sent = set(transition_many(store, [r.id for r in runs], RunStatus.submitted,
                               PENDING | RETRYABLE, f"submitting via {executor.name}",
                               job_id=placeholder, error=None))
    sub = Submission(sub.folder, sub.db_url, [x for x in sub.runs if x[0] in sent], sub.sweep)
    try:
        job_ids = executor.submit(sub)
    except Exception as exc:
        transition_many(store, sent, RunStatus.planned, {RunStatus.submitted},
                        f"submission failed: {' '.join(str(exc).split())[:300]}")
        if isinstance(exc, LaunchError):
            raise
        raise LaunchError(f"submitting {len(sent)} cell(s) via {executor.name} failed: "
                          f"{' '.join(str(exc).split())[:300]}") from None
    with store.session() as s:
        sweep = s.scalar(select(Sweep).where(Sweep.name == reg.sweep))
        sweep.executor = executor.name
        for rid, jid in job_ids.items():
            run = s.get(Run, rid)
            if run.status == RunStatus.submitted.value and run.job_id == placeholder:
                run.job_id = jid
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
    with store.session() as s:
        q = select(Run.id, Run.job_id, Run.status, Run.submitted_at).where(
            Run.status.in_([x.value for x in WAITING]), Run.job_id.is_not(None))
        if sweep is not None:
            q = q.join(Sweep, Run.sweep_id == Sweep.id).where(Sweep.name == sweep)
        rows = s.execute(q).all()
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
            if transition(store, r.id, to, WAITING, f"reconciled: {msg}", job_id_is=r.job_id,
                          error=msg if to is RunStatus.lost else None):
                out.fixed.append((r.id, to.value))
    return out


def cancel(store, sweep: str) -> tuple[int, list[str]]:
    """Mark every active or lost run of `sweep` cancelled (so a plain rerun leaves it), then
    stop the jobs of the active ones (one call per kind)."""
    store.get_sweep(sweep)  # NotFoundError names the known sweeps
    stoppable = ACTIVE | {RunStatus.lost}
    with store.session() as s:
        rows = s.execute(select(Run.id, Run.job_id, Run.status)
                         .join(Sweep, Run.sweep_id == Sweep.id)
                         .where(Sweep.name == sweep,
                                Run.status.in_([x.value for x in stoppable]))).all()
    changed = set(transition_many(store, [r.id for r in rows], RunStatus.cancelled, stoppable,
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


def counts(store, sweep: str | None = None) -> dict[str, Counter]:
    """Status counts per sweep name."""
    with store.session() as s:
        q = (select(Sweep.name, Run.status, func.count()).join(Run, Run.sweep_id == Sweep.id)
             .group_by(Sweep.name, Run.status))
        if sweep is not None:
            q = q.where(Sweep.name == sweep)
        out: dict[str, Counter] = {}
        for name, status, n in s.execute(q):
            out.setdefault(name, Counter())[status] = n
    return out


def last_steps(store, run_ids: list[int]) -> dict[int, int]:
    """The last logged step of each run (one query)."""
    if not run_ids:
        return {}
    with store.session() as s:
        q = (select(Metric.run_id, func.max(Metric.step)).where(Metric.run_id.in_(run_ids))
             .group_by(Metric.run_id))
        return {rid: step for rid, step in s.execute(q)}
