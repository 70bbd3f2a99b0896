"""The executor interface: submit a batch of cells, query their jobs at once, cancel them."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class Submission:
    """Cells going out together: one fresh submitit folder, the store URL, (run id, workdir)."""

    folder: Path
    db_url: str
    runs: list[tuple[int, str]]
    sweep: str


class JobState(StrEnum):
    """What the scheduler says about a job, reduced to what reconciliation needs."""

    alive = "alive"  # pending, running, requeued: leave the run as it is
    ended = "ended"  # finished normally; if the run is still active it never reported
    cancelled = "cancelled"
    failed = "failed"  # failed, timed out for good, node failure, out of memory
    unknown = "unknown"  # the scheduler does not (yet) know the id


@dataclass(frozen=True)
class JobInfo:
    state: JobState
    detail: str = ""  # the scheduler's own word, e.g. OUT_OF_MEMORY


class Executor(Protocol):
    """One way to run cells. `query` must ask the scheduler once for all ids."""

    name: str

    def submit(self, sub: Submission) -> dict[int, str]:
        """Send every run of `sub` out; return run id → job id."""
        ...

    def query(self, job_ids: list[str]) -> dict[str, JobInfo]:
        """The state of every job id, from one scheduler query."""
        ...

    def cancel(self, job_ids: list[str]) -> None:
        """Stop these jobs (one scheduler call)."""
        ...
