"""Run the real `twoclocks` CLI in a subprocess and capture its output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def twoclocks(*args: str, cwd: Path | None = None, env: dict | None = None,
              timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m twoclocks_cli ARGS...` with the test's environment; never raises on exit code."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "twoclocks_cli", *args],
        cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout,
    )


def free_port() -> int:
    """A loopback port free now (for `accelerate launch --main_process_port`: its default, 29500,
    is taken when two tests launch at once on two pytest-xdist workers)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str, code: int = 2) -> str:
    """The CLI failed with exit `code`, printed exactly one line on stderr, no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def running_pids(url: str, sweep: str, key: str = "id") -> dict:
    """{run.<key>: pid} of the running cells of `sweep`, from the pid each one reported in its
    last 'running' event (the process a test may kill)."""
    import re

    from twoclocks_cli.store import Store

    store = Store.open(url)
    try:
        out = {}
        for r in store.list_runs(sweep):
            msgs = [e.message for e in store.events(r.id) if e.to_status == "running"]
            if r.status == "running" and msgs:
                out[getattr(r, key)] = int(re.search(r"pid (\d+)", msgs[-1]).group(1))
        return out
    finally:
        store.close()


def process_tree(root: int) -> list[int]:
    """`root` and every descendant, from /proc (parents first)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def kill_tree(root: int) -> int:
    """Freeze the whole tree (so nothing forks past us), then SIGKILL it; returns its size."""
    stopped: list[int] = []
    while True:
        new = [p for p in process_tree(root) if p not in stopped]
        if not new:
            break
        for pid in new:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        stopped += new
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(stopped)


def sigint_deliverable() -> None:
    """`preexec_fn` for a process a test will Ctrl-C: SIGINT at its default disposition and
    unblocked, as a terminal starts a command. A process inherits an ignored SIGINT (Python
    then installs no KeyboardInterrupt handler) and a blocked one from whoever spawns it; a
    fresh-clone CI run saw three such tests' SIGINT have no effect."""
    import signal as _signal

    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {_signal.SIGINT})
