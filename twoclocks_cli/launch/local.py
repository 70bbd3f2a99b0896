"""The local executor: a detached runner process drains the cells through submitit's
LocalExecutor, at most `max_parallel` at once (cores // threads per job by default).

Job ids are `local:HOST:RUNNER_PID` while a cell waits and `local:HOST:RUNNER_PID:PID` once it
runs; a status refresh checks those processes (on this host) to find cells that died silently.

    python -m twoclocks_cli.launch.local FOLDER     # the runner (started by `submit`)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from twoclocks_cli.core.errors import LaunchError
from twoclocks_cli.core.process import pid_alive
from twoclocks_cli.launch.base import JobInfo, JobState, Submission
from twoclocks_cli.launch.job import RUNNER_ENV, CellJob

SPEC = "runner.json"


def default_parallel(threads_per_job: int) -> int:
    """Cells at once: usable cores // threads per cell, at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // threads_per_job)


def process_states(job_ids: list[str]) -> dict[str, JobInfo]:
    """Liveness of local/debug job ids (`KIND:HOST:PID[:PID]`); other hosts stay unknown."""
    host = socket.gethostname()
    out = {}
    for jid in job_ids:
        parts = jid.split(":")
        if len(parts) < 3 or parts[1] != host:
            out[jid] = JobInfo(JobState.unknown, "not on this host")
            continue
        pid = int(parts[-1])
        out[jid] = (JobInfo(JobState.alive) if pid_alive(pid)
                    else JobInfo(JobState.ended, f"process {pid} exited"))
    return out


class LocalExecutor:
    """Runs cells as local processes (submitit LocalExecutor) under a concurrency cap."""

    name = "local"

    def __init__(self, max_parallel: int, threads_per_job: int = 1, timeout_min: float = 1440):
        self.max_parallel = max_parallel
        self.threads_per_job = threads_per_job
        self.timeout_min = timeout_min

    def submit(self, sub: Submission) -> dict[int, str]:
        sub.folder.mkdir(parents=True, exist_ok=True)
        spec = {"db_url": sub.db_url, "runs": sub.runs, "max_parallel": self.max_parallel,
                "threads_per_job": self.threads_per_job, "timeout_min": self.timeout_min}
        # the jobs need the store URL with its password: readable by this user only
        fd = os.open(sub.folder / SPEC, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(spec))
        log = open(sub.folder / "runner.log", "ab")  # noqa: SIM115 (handed to the child)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "twoclocks_cli.launch.local", str(sub.folder)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=sub.folder)
        except OSError as exc:
            raise LaunchError(f"cannot start the local runner: {exc}") from None
        finally:
            log.close()
        _CHILDREN.append(proc)  # keeps a handle so the runner can be reaped if we outlive it
        job_id = f"local:{socket.gethostname()}:{proc.pid}"
        return {run_id: job_id for run_id, _ in sub.runs}

    def query(self, job_ids: list[str]) -> dict[str, JobInfo]:
        for proc in _CHILDREN:
            proc.poll()
        return process_states(job_ids)

    def cancel(self, job_ids: list[str]) -> None:
        """SIGTERM each runner (it stops its cells) and SIGKILL running cell processes."""
        host = socket.gethostname()
        runners, cells = set(), set()
        for jid in job_ids:
            parts = jid.split(":")
            if len(parts) >= 3 and parts[1] == host:
                runners.add(int(parts[2]))
                if len(parts) == 4:
                    cells.add(int(parts[3]))
        for pid, sig in [(p, signal.SIGTERM) for p in runners] + \
                        [(p, signal.SIGKILL) for p in cells]:
            if pid_alive(pid):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass


_CHILDREN: list[subprocess.Popen] = []


def run_runner(folder: Path) -> None:
    """The runner's loop: keep up to max_parallel submitit local jobs going until all ran."""
    import submitit

    spec = json.loads((folder / SPEC).read_text())
    threads = str(spec["threads_per_job"])
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = threads
    os.environ[RUNNER_ENV] = str(os.getpid())
    ex = submitit.LocalExecutor(folder=folder / "jobs")
    ex.update_parameters(timeout_min=spec["timeout_min"])
    pending = [CellJob(spec["db_url"], rid, wd) for rid, wd in spec["runs"]]
    running: list = []
    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while (pending or running) and not stopping:
        running = [j for j in running if not j.done()]
        while pending and len(running) < spec["max_parallel"]:
            running.append(ex.submit(pending.pop(0)))
        time.sleep(0.2)
    if stopping:
        for job in running:
            if not job.done():
                job.cancel()


if __name__ == "__main__":
    run_runner(Path(sys.argv[1]))
