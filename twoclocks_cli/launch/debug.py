"""The debug executor: runs each cell in this process, one after another (blocking)."""

from __future__ import annotations

import os
import socket

from twoclocks_cli.launch.base import JobInfo, Submission
from twoclocks_cli.launch.job import CellJob
from twoclocks_cli.launch.local import process_states


class DebugExecutor:
    """In-process and sequential: the simplest way to run a cell and see its outcome."""

    name = "debug"

    def submit(self, sub: Submission) -> dict[int, str]:
        job_id = f"debug:{socket.gethostname()}:{os.getpid()}"
        return {run_id: job_id for run_id, _ in sub.runs}

    def run(self, sub: Submission) -> None:
        """Execute the submitted cells now (called after they were marked submitted)."""
        for run_id, workdir in sub.runs:
            CellJob(sub.db_url, run_id, workdir)()

    def query(self, job_ids: list[str]) -> dict[str, JobInfo]:
        return process_states(job_ids)

    def cancel(self, job_ids: list[str]) -> None:
        return None  # the cells run inside the submitting command; Ctrl-C stops them
