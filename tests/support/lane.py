"""The fast lane's guard, as a pytest plugin: with TWOCLOCKS_TEST_LANE=fast, a test that starts a
process fails, so a test lacking its `subprocess` mark cannot hide in the lane.

tests/conftest.py takes its hooks; a test can load it into an in-process pytest run with
`-p tests.support.lane`. The guard is an audit hook (sys.addaudithook), which cannot be removed:
it is installed once per process and armed only while a test of a fast-lane session runs, so a
nested session (pytester) arms and disarms it for its own tests and restores the outer state.
"""

from __future__ import annotations

import os
import platform
import sys

import pytest

LANE_VAR = "TWOCLOCKS_TEST_LANE"
# The markers that keep a test out of the fast lane (pyproject's [tool.pytest.ini_options]).
OUTSIDE_FAST_LANE = ("slow", "postgres", "slurm", "tiny_model", "subprocess")
# The audit events of starting a process (os.fork covers multiprocessing's fork context).
PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.posix_spawn", "os.spawn",
                            "os.fork", "os.forkpty", "os.exec"})
_FAST = pytest.StashKey[bool]()


class _Guard:
    """Refuses a process start while armed; armed only inside a fast-lane test."""

    armed = False
    installed = False

    def __call__(self, event: str, args) -> None:
        if self.armed and event in PROCESS_EVENTS:
            raise RuntimeError(f"{event} in the fast lane: mark the test or its module "
                               "pytest.mark.subprocess (it starts a process)")


GUARD = _Guard()


def in_fast_lane() -> bool:
    """Whether this session is the fast lane (read when the session starts)."""
    return os.environ.get(LANE_VAR) == "fast"


def pytest_configure(config):
    config.stash[_FAST] = in_fast_lane()
    if config.stash[_FAST] and not GUARD.installed:
        # the standard library's processor query runs `uname -p` once a process and caches it;
        # some libraries ask at import (mlflow's telemetry): asked here, before any test, as
        # xdist's workers do, so a test's outcome does not hang on which test imports first
        platform.processor()
        sys.addaudithook(GUARD)
        GUARD.installed = True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Arm the guard only while a test runs (xdist starts its workers as processes, before any
    test), and give back the state found (an outer session's test when this one is nested)."""
    before = GUARD.armed
    GUARD.armed = item.config.stash.get(_FAST, False)
    try:
        yield
    finally:
        GUARD.armed = before
