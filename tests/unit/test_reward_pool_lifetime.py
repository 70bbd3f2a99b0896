"""Reward-pool workers never outlive the trainer, even while stuck on a hostile answer."""

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.subprocess

CHILD = r'''
import os, sys, threading, time
from trainer.rewards import MathVerifyReward
from trainer.data import Problem
pool = MathVerifyReward(answer_pattern=r"(?s).*", workers=2, timeout_s=60)  # let it through
print("READY", os.getpid(), flush=True)
# a hostile answer keeps one worker busy inside math-verify (not reading its pipe)
pool([r"\boxed{9^{9^{9^{9}}}}", r"\boxed{3}"], [Problem("q", "3"), Problem("q", "3")])
'''


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_workers_die_with_the_parent(sig):
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("READY")
        deadline = time.time() + 30
        workers = []
        while time.time() < deadline and len(workers) < 2:
            workers = _children(proc.pid)
            time.sleep(0.1)
        assert len(workers) == 2
        time.sleep(1.0)  # the hostile item is now being verified
        os.kill(proc.pid, sig)
        proc.wait(timeout=30)
        deadline = time.time() + 10
        while time.time() < deadline and any(_alive(w) for w in workers):
            time.sleep(0.1)
        assert not any(_alive(w) for w in workers)
    finally:
        if proc.poll() is None:
            proc.kill()
