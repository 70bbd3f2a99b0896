"""The real CLI: version, help, start-up imports, and one-line errors for bad databases (a
wrong PostgreSQL password: tests/integration/test_cli_postgres_auth.py)."""

import json
import os
import subprocess
import sys

import pytest

from tests.support.cli import assert_one_line_error, twoclocks_inproc
from twoclocks_cli import __version__


def test_version():
    proc = twoclocks_inproc("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"twoclocks {__version__}"


def test_help_lists_working_groups():
    proc = twoclocks_inproc("--help")
    assert proc.returncode == 0
    for group in ("db", "runs"):
        assert group in proc.stdout


def _modules_after(argv: list[str], tmp_path) -> set[str]:
    code = (
        "import sys\n"
        f"sys.argv = ['twoclocks', *{argv!r}]\n"
        "from twoclocks_cli.app import app\n"
        "try:\n    app()\nexcept SystemExit:\n    pass\n"
        "print('LOADED:' + ' '.join(m for m in ('torch', 'transformers', 'numpy', 'sqlalchemy')"
        " if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path)
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("LOADED:"), proc.stdout + proc.stderr
    return set(line.removeprefix("LOADED:").split())


@pytest.mark.subprocess  # a fresh interpreter's sys.modules after one command
def test_cli_start_does_not_import_torch(tmp_path):
    assert _modules_after(["--help"], tmp_path) == set()
    loaded = _modules_after(["runs", "list", "--db", f"sqlite:///{tmp_path}/a.db"], tmp_path)
    assert "torch" not in loaded and "transformers" not in loaded


def test_runs_list_json_and_default_db_in_cwd(tmp_path):
    proc = twoclocks_inproc("runs", "list", "--json", cwd=tmp_path, env={"TWOCLOCKS_DB": None})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
    assert (tmp_path / "twoclocks.db").exists()


def test_env_var_selects_database(tmp_path):
    proc = twoclocks_inproc("runs", "list", env={"TWOCLOCKS_DB": f"sqlite:///{tmp_path}/env.db"},
                            cwd=tmp_path)
    assert proc.returncode == 0 and (tmp_path / "env.db").exists()
    assert not (tmp_path / "twoclocks.db").exists()


def test_malformed_url():
    assert_one_line_error(twoclocks_inproc("runs", "list", "--db", "not a url"),
                          "malformed database URL")


def test_unsupported_scheme_masks_password():
    line = assert_one_line_error(twoclocks_inproc("runs", "list", "--db", "mysql://u:hunter2@h/d"),
                                 "unsupported database")
    assert "hunter2" not in line


def test_unreachable_postgres_masks_password():
    line = assert_one_line_error(
        twoclocks_inproc("runs", "list", "--db", "postgresql://u:hunter2@127.0.0.1:1/x"),
        "cannot reach database", "127.0.0.1:1")
    assert "hunter2" not in line and "***" in line


@pytest.mark.subprocess  # chattr, as root
def test_read_only_sqlite_file(tmp_path):
    path = tmp_path / "ro.db"
    assert twoclocks_inproc("runs", "list", "--db", f"sqlite:///{path}").returncode == 0
    if os.geteuid() == 0:  # root ignores mode bits; the immutable attribute binds root too
        subprocess.run(["chattr", "+i", str(path)], check=True)
    else:
        path.chmod(0o444)
    try:
        assert_one_line_error(twoclocks_inproc("runs", "list", "--db", f"sqlite:///{path}"),
                              "read-only")
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(path)], check=True)


def test_missing_sqlite_directory(tmp_path):
    assert_one_line_error(
        twoclocks_inproc("runs", "list", "--db", f"sqlite:///{tmp_path}/nope/x.db"),
        "does not exist")


def test_unknown_sweep_is_one_line(tmp_path):
    assert_one_line_error(
        twoclocks_inproc("runs", "list", "--sweep", "ghost", "--db", f"sqlite:///{tmp_path}/a.db"),
        "no sweep named 'ghost'")


def test_a_commands_own_typer_exit_keeps_its_code_and_is_not_a_crash():
    """typer.Exit is not a click Exit (typer >= 0.16): the CLI's group must pass it through
    (e.g. `sweep --wait` exits 1 when cells failed), not report an internal error."""
    import typer
    from typer.testing import CliRunner

    from twoclocks_cli.app import _Group

    app = typer.Typer(cls=_Group)

    @app.command()
    def fails() -> None:
        typer.echo("2 cell(s) failed", err=True)
        raise typer.Exit(1)

    @app.command()
    def other() -> None:
        pass

    r = CliRunner().invoke(app, ["fails"])
    assert r.exit_code == 1
    assert "internal error" not in r.output and "crash" not in r.output
