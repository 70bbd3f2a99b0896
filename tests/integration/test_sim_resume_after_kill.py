"""The sim backend killed with SIGKILL mid-run and resumed: the metrics it stores equal those of
the same cell run without interruption (its other behaviour: tests/unit/test_theory_sim_backend.py).
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.unit.test_theory_sim_backend import COMMON, _all_metrics, _run_row
from twoclocks_cli.backends import run_cell
from twoclocks_cli.store import RunStatus, Store

_CHILD = """
import sys
from pathlib import Path
from twoclocks_cli.backends import run_cell
from twoclocks_cli.store import Store
run_cell(Store.open(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
"""


@pytest.mark.subprocess
def test_resume_after_kill_gives_the_uninterrupted_metrics(sqlite_url, tmp_path):
    store = Store.open(sqlite_url)
    cell = {**COMMON, "sample_budget": 60_000, "sim": {"checkpoint_every": 300, "log_every": 2}}
    a = _run_row(store, cell, "killed")
    b = _run_row(store, cell, "straight")
    work = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, sqlite_url, str(a), str(work)])
    deadline = time.time() + 60
    while not (work / "sim_state.npz").exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = store.max_step(a)
    assert run_cell(store, a, work) == RunStatus.completed
    assert run_cell(store, b, tmp_path / "straight") == RunStatus.completed
    assert killed_at is not None and killed_at < store.max_step(b)  # really interrupted
    assert _all_metrics(store, a) == _all_metrics(store, b)
