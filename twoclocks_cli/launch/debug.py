"""The debug executor: runs each cell in this process, one after another (blocking).

`twoclocks cancel` stops it from another shell: it sends SIGINT to the process running the
cells (same host only; other hosts are refused in one line), and `run` stops once it finds the
interrupted cell marked cancelled. A plain Ctrl-C leaves the cell running in the store; the
next refresh finds its process gone and marks it lost (a plain rerun resumes it).
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import typer

from twoclocks_cli.core.errors import LaunchError
from twoclocks_cli.core.process import pid_alive
from twoclocks_cli.launch.base import JobInfo, Submission
from twoclocks_cli.launch.job import CellJob
from twoclocks_cli.launch.local import process_states


def _is_twoclocks(pid: int) -> bool:
    """Whether `pid` still runs twoclocks (a reused pid is never signalled)."""
    try:
        return b"twoclocks" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _cancelled(db_url: str, run_id: int) -> bool:
    from twoclocks_cli.store import Store
    from twoclocks_cli.store.models import RunStatus

    store = Store.open(db_url, migrate=False)
    try:
        return store.get_run(run_id).status == RunStatus.cancelled.value
    finally:
        store.close()


class DebugExecutor:
    """In-process and sequential: the simplest way to run a cell and see its outcome."""

    name = "debug"

    def submit(self, sub: Submission) -> dict[int, str]:
        job_id = f"debug:{socket.gethostname()}:{os.getpid()}"
        return {run_id: job_id for run_id, _ in sub.runs}

    def run(self, sub: Submission) -> None:
        """Execute the submitted cells now (called after they were marked submitted)."""
        import gc

        for run_id, workdir in sub.runs:
            interrupted = False
            try:
                CellJob(sub.db_url, run_id, workdir)()
            except KeyboardInterrupt:
                interrupted = True
            if not interrupted:
                continue
            # Outside the except block the interrupt's traceback — and the frames holding the
            # interrupted cell's database connection, possibly mid-transaction with SQLite's
            # write lock — are gone; collect them so the lock is released before we read.
            gc.collect()
            if not _cancelled(sub.db_url, run_id):
                raise KeyboardInterrupt  # a real Ctrl-C
            typer.echo(f"run {run_id} cancelled by twoclocks cancel; stopping", err=True)
            return

    def query(self, job_ids: list[str]) -> dict[str, JobInfo]:
        return process_states(job_ids)

    def cancel(self, job_ids: list[str]) -> None:
        """SIGINT the processes running these cells; refuse ones on another host."""
        host = socket.gethostname()
        refused = []
        for jid in job_ids:
            parts = jid.split(":")
            if len(parts) < 3 or parts[1] != host:
                refused.append(f"{jid} runs on another host")
                continue
            pid = int(parts[-1])
            if pid == os.getpid() or not pid_alive(pid):
                continue  # this process (nothing runs concurrently), or already gone
            if not _is_twoclocks(pid):
                refused.append(f"process {pid} is not a twoclocks process")
                continue
            try:
                os.kill(pid, signal.SIGINT)
            except ProcessLookupError:
                pass
        if refused:
            raise LaunchError(f"cannot stop debug cells ({'; '.join(refused)}): they run inside "
                              "the `twoclocks sweep` process that started them; press Ctrl-C "
                              "there")
