"""Run the real `twoclocks` CLI, in a subprocess or in this process, and capture its output."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path


def twoclocks(*args: str, cwd: Path | None = None, env: dict | None = None,
              timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m twoclocks_cli ARGS...` with the test's environment; never raises on exit code."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "twoclocks_cli", *args],
        cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout,
    )


@dataclass
class InProcess:
    """What `twoclocks_inproc` captured, named as subprocess.CompletedProcess names it."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def twoclocks_inproc(*args: str, cwd: Path | None = None, env: dict | None = None) -> InProcess:
    """`twoclocks ARGS...` run in this process (click's test runner on the real app): exit code,
    stdout and stderr kept apart, as `twoclocks` returns them without a process start. `env`
    entries are set (None: removed) for the call only; `cwd` is the working directory meanwhile.
    An exception escaping the CLI is its traceback on stderr with exit 1, as in a process that
    let it through, so `assert_one_line_error` fails on it."""
    from typer.testing import CliRunner

    from twoclocks_cli.app import app

    argv = [str(a) for a in args]
    with contextlib.chdir(cwd) if cwd is not None else contextlib.nullcontext():
        r = CliRunner().invoke(app, argv, env=env)  # click >= 8.2: stderr always apart
    stderr, code = r.stderr, r.exit_code
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        stderr += "".join(traceback.format_exception(r.exception))
        code = 1
    return InProcess(argv, code, r.stdout, stderr)


def free_port() -> int:
    """A loopback port free now (for `accelerate launch --main_process_port`: its default, 29500,
    is taken when two tests launch at once on two pytest-xdist workers)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_one_line_error(proc: subprocess.CompletedProcess | InProcess, *needles: str,
                          code: int = 2) -> str:
    """The CLI failed with exit `code`, printed exactly one line on stderr, no traceback (run
    in a process by `twoclocks` or in this one by `twoclocks_inproc`)."""
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
