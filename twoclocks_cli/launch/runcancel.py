"""Cancel ONE run (for `runs delete --force`): mark it cancelled, then stop only its own process.

`twoclocks cancel` stops a whole sweep (a SLURM array, a local runner); here only runs whose
own process can be stopped alone are cancelled, and every other case is refused in one line
that says what to do instead.
"""

from __future__ import annotations

import os
import signal
import socket
import time

from twoclocks_cli.core.errors import LaunchError
from twoclocks_cli.launch.state import ACTIVE
from twoclocks_cli.store.models import RunStatus

STOP_WAIT_S = 10.0  # how long to wait for a killed cell process to go away


def why_not(run) -> str | None:
    """Why `run` (submitted or running) cannot be cancelled alone, or None when it can."""
    job, host = run.job_id or "", socket.gethostname()
    parts = job.split(":")
    what = f"run {run.id} ({run.name}) is {run.status}"
    if not job:
        where = f" on host {run.host}" if run.host else ""
        return (f"{what}{where} without a job id (a `twoclocks train` in the foreground?): "
                "stop that process (Ctrl-C), then delete it")
    if parts[0] == "local" and len(parts) >= 3:
        if parts[1] != host:
            return f"{what} as {job} on host {parts[1]}: run this delete on that host"
        return None
    if parts[0] == "debug":
        return (f"{what} inside the `twoclocks sweep` process {parts[-1]} on {parts[1]} "
                "(debug executor): stop that process (Ctrl-C), then delete it")
    if ":" not in job:
        return (f"{what} as SLURM job {job}: one cell of an array cannot be cancelled alone "
                f"here (`twoclocks cancel SWEEP` stops the whole sweep); run `scancel {job}`, "
                "wait until `twoclocks status` shows it ended, then delete it")
    return f"{what} as job {job}: cancel it with `twoclocks cancel SWEEP` first"


def cancel_run(store, run) -> str:
    """Cancel one local run: mark it cancelled (if still active), SIGKILL its cell process if
    it has one, wait for it to exit. Returns what was done; LaunchError if it cannot."""
    reason = why_not(run)
    if reason is not None:
        raise LaunchError(reason)
    store.transition(run.id, RunStatus.cancelled, ACTIVE, "cancelled by twoclocks runs delete")
    run = store.get_run(run.id)  # the job id now: the cell may have started meanwhile
    parts = (run.job_id or "").split(":")
    if len(parts) < 4 or parts[0] != "local" or parts[1] != socket.gethostname():
        # still waiting in its runner, which finds it cancelled (or gone) and skips it
        return f"run {run.id}: cancelled (it had not started)"
    pid = int(parts[3])
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return f"run {run.id}: cancelled (process {pid} had already exited)"
    deadline = time.monotonic() + STOP_WAIT_S
    from twoclocks_cli.core.process import pid_alive

    while pid_alive(pid):
        if time.monotonic() > deadline:
            raise LaunchError(f"run {run.id}: process {pid} still alive {STOP_WAIT_S:.0f} s "
                              "after SIGKILL; not deleted")
        time.sleep(0.05)
    return f"run {run.id}: cancelled, process {pid} stopped"
