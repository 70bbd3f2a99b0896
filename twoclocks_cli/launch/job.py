"""The job side: what runs on the node for one cell (submitit-checkpointable).

Marks the run running (job id, host, attempt), runs its backend with a private workdir, and
marks the outcome. The workdir's run.json names the run (store, run id, cell, config hash); a
workdir of another run is refused (the cell fails in one line; one without run.json is new and
claimed: sweep folders are unique per registration). On timeout or
preemption submitit calls `checkpoint`, which requeues the same callable; the backend resumes
from its checkpoint in `workdir` and the writer's upsert keeps replayed steps from duplicating
rows.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import traceback
from pathlib import Path

from submitit.helpers import Checkpointable, DelayedSubmission

from twoclocks_cli.core.errors import TwoclocksError
from twoclocks_cli.launch import owner
from twoclocks_cli.store.models import RunStatus

# set by the local runner so a local job id names its runner and its own process
RUNNER_ENV = "TWOCLOCKS_LOCAL_RUNNER"


def returned_status(returned) -> RunStatus:
    """A run's final status from what its backend (or the trainer) returned: completed or
    diverged; anything else is a failure."""
    status = RunStatus(returned)
    return status if status in (RunStatus.completed, RunStatus.diverged) else RunStatus.failed


def failed_status(exc: BaseException) -> RunStatus:
    """A run's final status when its training raised: cancelled on Ctrl-C, else failed."""
    return RunStatus.cancelled if isinstance(exc, KeyboardInterrupt) else RunStatus.failed


def job_identity() -> tuple[str, str]:
    """(job id, host) of the current process: SLURM array task, local process or debug."""
    host = socket.gethostname()
    if os.environ.get("SLURM_JOB_ID"):
        array = os.environ.get("SLURM_ARRAY_JOB_ID")
        task = os.environ.get("SLURM_ARRAY_TASK_ID")
        return (f"{array}_{task}" if array and task else os.environ["SLURM_JOB_ID"]), host
    runner = os.environ.get(RUNNER_ENV)
    if runner:
        return f"local:{host}:{runner}:{os.getpid()}", host
    return f"debug:{host}:{os.getpid()}", host


def one_line(exc: BaseException) -> str:
    """An exception as one line: type and message, newlines folded."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def cell_error(exc: BaseException, workdir: Path, attempt: int) -> str:
    """The run's one-line error. A project error (bad input) is its message; anything else is a
    bug: its traceback goes to the job's stderr (the job log) and to a file in the cell's
    workdir, and the line names both, so the evidence outlives the attempt."""
    line = one_line(exc)
    if isinstance(exc, TwoclocksError):
        return line[:2000]
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    print(text, file=sys.stderr, flush=True)
    where = []
    try:
        path = Path(workdir) / f"traceback-attempt-{attempt}.log"
        path.write_text(text, encoding="utf-8")
        where.append(f"traceback: {path}")
    except OSError:
        pass  # e.g. the workdir itself is what failed
    if (log := job_log()) is not None:
        where.append(f"job log: {log}")
    suffix = f" ({'; '.join(where)})" if where else ""
    return line[:2000 - len(suffix)] + suffix


def job_log() -> str | None:
    """The stderr file submitit gives this job (None outside a submitit job, e.g. debug)."""
    try:
        import submitit

        return str(submitit.JobEnvironment().paths.stderr)
    except Exception:  # not in a submitit job: no environment to ask
        return None


def requeue_taken(exc: BaseException) -> bool:
    """True when submitit's `scontrol requeue` was killed by SIGTERM: SLURM accepted the requeue
    and is stopping every process of the job, the scontrol child included, before it could
    exit 0. The cell is not failed; it restarts from its checkpoint."""
    return (isinstance(exc, subprocess.CalledProcessError)
            and list(exc.cmd[:2]) == ["scontrol", "requeue"]
            and exc.returncode == -signal.SIGTERM)


class CellJob(Checkpointable):
    """Run cell `run_id` of the store at `db_url`, checkpointing into `workdir`."""

    def __init__(self, db_url: str, run_id: int, workdir: str):
        self.db_url = db_url
        self.run_id = int(run_id)
        self.workdir = str(workdir)
        self.requeues = 0

    def __call__(self) -> str:
        from twoclocks_cli.backends import run_cell
        from twoclocks_cli.store import Store

        store = Store.open(self.db_url, migrate=False)
        try:
            run = store.get_run(self.run_id)
            if RunStatus(run.status).finished:  # cancelled (or done) before this attempt began
                return run.status
            job_id, host = job_identity()
            resume = store.max_step(self.run_id)
            wd = Path(self.workdir)
            has_ckpt = wd.is_dir() and any(p.name != owner.RUN_FILE for p in wd.iterdir())
            ckpt = "found" if has_ckpt else "none"
            note = (f"attempt {run.attempts + 1} on {host} pid {os.getpid()} job {job_id}; "
                    f"requeues {self.requeues}; "
                    + (f"resuming after step {resume} (checkpoint {ckpt})" if resume
                       else "starting"))
            if not store.transition(self.run_id, RunStatus.running,
                              {RunStatus.planned, RunStatus.submitted, RunStatus.running}, note,
                              job_id=job_id, host=host, attempts=run.attempts + 1, error=None):
                return store.get_run(self.run_id).status  # cancelled or given up meanwhile
            try:
                owner.claim(Path(self.workdir), self.owner(store, run))
                status = returned_status(run_cell(store, self.run_id, Path(self.workdir)))
            except Exception as exc:  # the backend's error is the run's outcome
                if requeue_taken(exc):
                    sys.exit(-1)  # as submitit exits after a requeue: the next attempt records it
                status = failed_status(exc)
                store.transition(self.run_id, status, {RunStatus.running},
                                 "backend raised", error=cell_error(exc, wd, run.attempts + 1))
                return status.value
            store.transition(self.run_id, status, {RunStatus.running}, "backend returned")
            return status.value
        finally:
            store.close()

    def owner(self, store, run) -> dict:
        """The record naming this cell's run in its workdir (run.json)."""
        return owner.run_record(store.engine.url, run.id, run.cell_id, run.config)

    def checkpoint(self, *args, **kwargs) -> DelayedSubmission:
        """Requeue the same cell (called by submitit on timeout/preemption, inside a signal
        handler: no database work here — the next attempt records the requeue)."""
        self.requeues += 1
        return DelayedSubmission(self, *args, **kwargs)
