"""The SLURM executor: every pending cell of a submission goes out as ONE job array (one
`sbatch`, `%array_parallelism`) through submitit; one `sacct` answers a whole status refresh."""

from __future__ import annotations

import shutil
import subprocess

from twoclocks_cli.config.models import Slurm
from twoclocks_cli.core.errors import LaunchError
from twoclocks_cli.launch.base import JobInfo, JobState, Submission
from twoclocks_cli.launch.job import CellJob

ALIVE = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING",
         "SUSPENDED", "CONFIGURING", "COMPLETING", "SIGNALING", "STAGE_OUT", "STOPPED",
         "RESV_DEL_HOLD", "SPECIAL_EXIT"}
SACCT_TIMEOUT_S = 30


def available() -> bool:
    """sbatch, sacct and srun are on PATH (the auto executor's test)."""
    return all(shutil.which(c) for c in ("sbatch", "sacct", "srun"))


def _array_id(job_id: str) -> str:
    return job_id.split("_", 1)[0]


class SlurmExecutor:
    """submitit's SlurmExecutor with the sweep's [slurm] parameters."""

    name = "slurm"

    def __init__(self, params: Slurm, job_name: str = "twoclocks"):
        self.params = params
        self.job_name = job_name

    def _executor(self, folder):
        import submitit

        p = self.params
        try:
            ex = submitit.SlurmExecutor(folder=folder / "%j", max_num_timeout=p.max_requeues)
        except RuntimeError as exc:
            raise LaunchError(f"slurm executor: {exc}") from None
        opts = {"job_name": self.job_name, "time": p.timeout_min, "nodes": p.nodes,
                "cpus_per_task": p.cpus_per_task, "array_parallelism": p.array_parallelism,
                "stderr_to_stdout": True}
        for key in ("partition", "gpus_per_node", "account", "qos", "constraint"):
            if getattr(p, key) is not None:
                opts[key] = getattr(p, key)
        if p.mem_gb is not None:
            opts["mem"] = f"{int(p.mem_gb * 1024)}MB"
        if p.setup:
            opts["setup"] = list(p.setup)
        if p.sbatch:
            opts["additional_parameters"] = dict(p.sbatch)
        try:
            ex.update_parameters(**opts)
        except ValueError as exc:
            raise LaunchError(f"slurm parameters rejected: {' '.join(str(exc).split())}") from None
        return ex

    def submit(self, sub: Submission) -> dict[int, str]:
        ex = self._executor(sub.folder)
        cells = [CellJob(sub.db_url, rid, wd) for rid, wd in sub.runs]
        try:
            with ex.batch():
                jobs = [ex.submit(c) for c in cells]
        except Exception as exc:  # sbatch refused: name the reason in one line
            raise LaunchError(f"sbatch failed: {' '.join(str(exc).split())[:500]}") from None
        return {rid: job.job_id for (rid, _), job in zip(sub.runs, jobs, strict=True)}

    def query(self, job_ids: list[str]) -> dict[str, JobInfo]:
        """One `sacct` for every array of these ids; states per array task."""
        from submitit.slurm.slurm import SlurmInfoWatcher

        if not job_ids:
            return {}
        arrays = sorted({_array_id(j) for j in job_ids}, key=int)
        cmd = ["sacct", "-X", "-o", "JobID,State,NodeList", "--parsable2", "-j", ",".join(arrays)]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=SACCT_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LaunchError(f"sacct failed: {exc}") from None
        if out.returncode != 0:
            raise LaunchError(f"sacct failed: {' '.join(out.stderr.split())[:300]}")
        info = SlurmInfoWatcher().read_info(out.stdout)
        return {j: _reduce(info.get(j, {}).get("State")) for j in job_ids}

    def cancel(self, job_ids: list[str]) -> None:
        """One `scancel` for every array (array tasks that already ended are unaffected)."""
        arrays = sorted({_array_id(j) for j in job_ids})
        if not arrays:
            return
        out = subprocess.run(["scancel", *arrays], capture_output=True, text=True)
        if out.returncode != 0:
            raise LaunchError(f"scancel failed: {' '.join(out.stderr.split())[:300]}")


def _reduce(state: str | None) -> JobInfo:
    """A sacct State ("CANCELLED by 0", "OUT_OF_MEMORY", ...) → JobInfo."""
    if not state:
        return JobInfo(JobState.unknown)
    word = state.split()[0].rstrip("+")
    if word in ALIVE:
        return JobInfo(JobState.alive, word)
    if word == "COMPLETED":
        return JobInfo(JobState.ended, word)
    if word == "CANCELLED":
        return JobInfo(JobState.cancelled, word)
    return JobInfo(JobState.failed, word)
