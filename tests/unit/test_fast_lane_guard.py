"""The fast lane's guard (tests/support/lane.py): in the fast lane a test that starts a process
fails, naming the event and the mark it lacks; outside it the same test passes.

Each case runs a one-test file in an in-process pytest session (pytester) with the project's
guard plugin, the lane chosen by TWOCLOCKS_TEST_LANE as `make test-fast` chooses it."""

from __future__ import annotations

import pytest

from tests.support.lane import GUARD, LANE_VAR

pytest_plugins = ["pytester"]

STARTS_A_PROCESS = """
import subprocess

def test_starts_true():
    assert subprocess.run(["true"]).returncode == 0
"""

STARTS_NOTHING = """
def test_adds():
    assert 1 + 1 == 2
"""


def _session(pytester, monkeypatch, lane: str | None, source: str):
    """`source` as a test file, run in this process with the guard plugin in `lane`."""
    if lane is None:
        monkeypatch.delenv(LANE_VAR, raising=False)
    else:
        monkeypatch.setenv(LANE_VAR, lane)
    pytester.makepyfile(test_inner=source)
    armed = GUARD.armed
    result = pytester.runpytest_inprocess("-p", "tests.support.lane", "-p", "no:cacheprovider",
                                          "-p", "no:xdist")
    assert GUARD.armed == armed  # the outer session's state, given back
    return result


def test_a_test_starting_a_process_fails_in_the_fast_lane(pytester, monkeypatch):
    # the hook refuses at the audit event, before the fork: nothing is started here
    result = _session(pytester, monkeypatch, "fast", STARTS_A_PROCESS)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*RuntimeError: subprocess.Popen in the fast lane: mark the "
                                 "test or its module pytest.mark.subprocess (it starts a "
                                 "process)*"])


def test_a_test_starting_nothing_passes_in_the_fast_lane(pytester, monkeypatch):
    _session(pytester, monkeypatch, "fast", STARTS_NOTHING).assert_outcomes(passed=1)


@pytest.mark.subprocess  # outside the fast lane the inner test does start `true`
@pytest.mark.parametrize("lane", [None, "full"])
def test_the_same_test_passes_outside_the_fast_lane(pytester, monkeypatch, lane):
    _session(pytester, monkeypatch, lane, STARTS_A_PROCESS).assert_outcomes(passed=1)
