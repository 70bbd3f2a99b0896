"""A traceback is a bug and keeps its evidence: one line naming a log that holds it, exit 1;
a project error stays one line (exit 2), even when its message has several lines."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from twoclocks_cli.app import _Group
from twoclocks_cli.core.errors import ConfigError


def _app() -> typer.Typer:
    """A two-command app under the real `twoclocks` group class."""
    app = typer.Typer(cls=_Group, pretty_exceptions_enable=False)

    @app.command()
    def bug() -> None:
        print(1 / 0)

    @app.command()
    def gone() -> None:
        raise BrokenPipeError(32, "Broken pipe")

    @app.command()
    def bad() -> None:
        raise ConfigError("first part\nsecond part")

    @app.command()
    def leave(code: int = 3) -> None:
        raise typer.Exit(code)

    @app.command()
    def ranged(x: Annotated[float, typer.Option(min=0.2)] = 1.0) -> None:
        typer.echo(x)

    return app


def test_an_unexpected_exception_is_one_line_and_a_log(tmp_path):
    result = CliRunner().invoke(_app(), ["bug"], env={"TWOCLOCKS_CRASH_DIR": str(tmp_path)})
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert "internal error (ZeroDivisionError: division by zero)" in lines[0]
    path = re.search(r"the full traceback is in (\S+)$", lines[0]).group(1)
    assert path.startswith(str(tmp_path))
    log = open(path).read()
    assert "Traceback (most recent call last)" in log and "1 / 0" in log and "argv:" in log


def test_a_project_error_stays_one_line_with_exit_2(tmp_path):
    result = CliRunner().invoke(_app(), ["bad"], env={"TWOCLOCKS_CRASH_DIR": str(tmp_path)})
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: first part second part"
    assert list(tmp_path.iterdir()) == []  # no crash log for a user's error


@pytest.mark.subprocess
def test_the_log_falls_back_to_the_temp_folder(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the crash folder should be: mkdir fails
    code = ("import sys; sys.argv = ['twoclocks']; from twoclocks_cli.crash import one_line; "
            "print(one_line(RuntimeError('x')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"TWOCLOCKS_CRASH_DIR": str(blocked / "sub"), "TMPDIR": str(tmp_path),
                              "PATH": "/usr/bin:/bin"}).stdout
    assert f"the full traceback is in {tmp_path}/twoclocks-crash-" in out


def test_exits_and_usage_errors_are_not_crashes(tmp_path):
    """typer's own Exit keeps its code; a bad option value (typer >= 0.16 vendors click's
    classes) is a one-line error with exit 2, not an internal error."""
    env = {"TWOCLOCKS_CRASH_DIR": str(tmp_path)}
    assert CliRunner().invoke(_app(), ["leave", "--code", "3"], env=env).exit_code == 3
    result = CliRunner().invoke(_app(), ["ranged", "--x", "0.01"], env=env)
    assert result.exit_code == 2 and "internal error" not in result.output
    lines = result.stderr.strip().splitlines()  # one line, not click's usage box
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: root ranged: Invalid value for '--x'")
    assert "0.2" in lines[0] and lines[0].endswith("(see 'root ranged --help')")
    assert list(tmp_path.iterdir()) == []



def test_a_closed_pipe_is_not_a_crash(tmp_path):
    """`twoclocks ... | head`: the reader left mid-output (a write raised BrokenPipeError), which
    is no bug: click's own quiet exit 1, no internal error and no crash log."""
    result = CliRunner().invoke(_app(), ["gone"], env={"TWOCLOCKS_CRASH_DIR": str(tmp_path)})
    assert result.exit_code == 1
    assert "internal error" not in result.output, result.output
    assert list(tmp_path.iterdir()) == []
