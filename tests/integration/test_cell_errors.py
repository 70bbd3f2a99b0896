"""A traceback is a bug and keeps its evidence: a sweep cell that raises something other than a
project error fails with one line that names a file holding the full traceback (and the job's
log under submitit); a project error stays its own one-line message."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import submitit

from tests.integration.simsweep import make_sweep
from twoclocks_cli.launch.job import CellJob, requeue_taken
from twoclocks_cli.store import Store

pytestmark = pytest.mark.subprocess

SIM = {"dim": 8, "log_every": 1}


def _one_cell(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    store = Store.open(url)
    (rid,) = make_sweep(store, "bug", [2], 1, 64, SIM, tmp_path / "cells", run=False)
    store.close()
    return url, rid


def test_a_bug_in_a_cell_names_its_traceback_file(tmp_path):
    url, rid = _one_cell(tmp_path)
    home = tmp_path / "cell"
    home.mkdir()
    (home / "run.json").mkdir()  # the record cannot be read as a file: an OS error, not ours
    assert CellJob(url, rid, str(home))() == "failed"
    store = Store.open(url)
    error = store.get_run(rid).error
    store.close()
    assert "\n" not in error and error.startswith(("IsADirectoryError", "PermissionError"))
    trace = Path(error.split("traceback: ")[1].split(")")[0].split(";")[0])
    assert trace == home / "traceback-attempt-1.log"
    text = trace.read_text()
    assert text.startswith("Traceback (most recent call last)") and "run.json" in text


def test_a_project_error_is_its_message_alone(tmp_path):
    url, rid = _one_cell(tmp_path)
    other = {"store": "sqlite:////elsewhere.db", "run_id": 99, "cell_id": "x", "config_hash": "y"}
    home = tmp_path / "cell"
    home.mkdir()
    (home / "run.json").write_text(json.dumps(other))
    assert CellJob(url, rid, str(home))() == "failed"
    store = Store.open(url)
    error = store.get_run(rid).error
    store.close()
    assert error.startswith("ConfigError: workdir") and "traceback" not in error
    assert not list(home.glob("traceback-*"))


def test_under_submitit_the_job_log_holds_the_traceback(tmp_path):
    url, rid = _one_cell(tmp_path)
    home = tmp_path / "cell"
    home.mkdir()
    (home / "run.json").mkdir()
    ex = submitit.LocalExecutor(folder=tmp_path / "jobs")
    ex.update_parameters(timeout_min=5)
    job = ex.submit(CellJob(url, rid, str(home)))
    assert job.result() == "failed"
    store = Store.open(url)
    error = store.get_run(rid).error
    store.close()
    log = Path(error.split("job log: ")[1].rstrip(")"))
    assert log == Path(job.paths.stderr).resolve() or log == Path(job.paths.stderr)
    assert "Traceback (most recent call last)" in log.read_text()


def _scontrol(tmp_path, body: str) -> subprocess.CalledProcessError:
    """The error submitit's requeue raises when `scontrol` ends as `body` makes it end."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "scontrol"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    try:
        subprocess.check_call(["scontrol", "requeue", "21"], env=env, timeout=30)
    except subprocess.CalledProcessError as exc:
        return exc
    raise AssertionError("scontrol exited 0")


def test_a_requeue_whose_scontrol_slurm_stopped_is_taken_not_failed(tmp_path):
    # SLURM's requeue SIGTERMs every process of the job, the scontrol that asked for it too
    assert requeue_taken(_scontrol(tmp_path, "kill -TERM $$"))


def test_a_refused_requeue_is_a_failure(tmp_path):
    assert not requeue_taken(_scontrol(tmp_path, "echo 'Invalid job id' >&2; exit 1"))
