"""The `twoclocks` command: a Typer app that registers one module per command group.

Only typer is imported at start-up; every command imports what it needs (sqlalchemy, numpy,
torch) inside its body, so `twoclocks --help` stays instant.
"""

from __future__ import annotations

import typer
from typer.core import TyperGroup

from twoclocks_cli import __version__
from twoclocks_cli.core.errors import TwoclocksError


class _Group(TyperGroup):
    """Turns a TwoclocksError anywhere below into one line on stderr and its exit code; any
    other exception into one line naming the log that holds its traceback (exit 1). Every
    parameter of every command below goes through the shared number checks first."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from twoclocks_cli.options import harden

        harden(self)

    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except TwoclocksError as err:
            typer.echo(f"error: {_line(err)}", err=True)
            raise typer.Exit(err.exit_code) from None
        except Exception as err:
            if _is_usage_error(err):  # a bad option value: one line too, not a usage box
                where = err.ctx.command_path if getattr(err, "ctx", None) else "twoclocks"
                typer.echo(f"error: {where}: {_line(err.format_message())} (see '{where} "
                           "--help')", err=True)
                raise typer.Exit(2) from None
            if _from_cli_framework(err):  # Exit, Abort, help: typer/click handle them
                raise
            if isinstance(err, BrokenPipeError):  # `twoclocks ... | head`: click exits quietly
                raise
            # a bug: one line here, the traceback in a log file
            from twoclocks_cli.crash import EXIT_CODE, one_line

            typer.echo(one_line(err), err=True)
            raise typer.Exit(EXIT_CODE) from None


def _from_cli_framework(err: BaseException) -> bool:
    """An exit or usage error of typer or click (typer >= 0.16 has its own vendored classes,
    so `click.ClickException` alone misses `typer.Exit` and typer's BadParameter)."""
    return type(err).__module__.split(".")[0] in ("typer", "click")


def _is_usage_error(err: BaseException) -> bool:
    """A click/typer UsageError (bad option value, unknown option), not the no-args help."""
    names = {c.__name__ for c in type(err).__mro__}
    return (_from_cli_framework(err) and "UsageError" in names
            and "NoArgsIsHelpError" not in names)


# the longest error line shown: a value echoed whole (a 2 MB string, a 4 KB path) is cut in the
# middle, so the file and key at the start and what is allowed at the end both stay
LINE_MAX = 600
_LINE_TAIL = 200


def _line(err: TwoclocksError | str) -> str:
    """A project error's message as the one line it must be, at most LINE_MAX characters."""
    text = " ".join(part.strip() for part in str(err).splitlines() if part.strip())
    text = text or type(err).__name__
    if len(text) <= LINE_MAX:
        return text
    head = LINE_MAX - _LINE_TAIL - 40  # room for the marker below
    cut = len(text) - head - _LINE_TAIL
    return f"{text[:head]} … ({cut:,} characters cut) … {text[-_LINE_TAIL:]}"


app = typer.Typer(
    cls=_Group,
    name="twoclocks",
    help="Measure the progress and failure clocks of GRPO training across batch sizes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"twoclocks {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """twoclocks: sweep batch sizes under sqrt lr scaling, find both clocks, schedule the switch."""


# (command name, module in twoclocks_cli.commands, function) in the order `--help` lists them.
_COMMANDS = [
    ("ingest", "ingest", "ingest"),
    ("report", "report", "report"),
    ("train", "train", "train"),
    ("analyze", "analyze", "analyze"),
    ("schedule", "schedule", "schedule"),
    ("suggest", "suggest", "suggest"),
    ("probe", "probe", "probe"),
    ("theory", "theory", "theory"),
    ("schedule-config", "compare", "schedule_config"),
    ("compare", "compare", "compare"),
    ("plan", "plan", "plan_cmd"),
    ("sweep", "sweep", "sweep"),
    ("status", "status", "status"),
    ("cancel", "sweep", "cancel"),
    ("export", "export", "export"),
]
# (group name, module, Typer attribute)
_GROUPS = [("db", "db", "app"), ("runs", "runs", "app"), ("sweeps", "sweeps", "app")]


def _register() -> None:
    """Attach every command and group; command modules import nothing heavy at top level."""
    from importlib import import_module

    def module(name: str):
        return import_module(f"twoclocks_cli.commands.{name}")

    for name, mod, attr in _GROUPS:
        app.add_typer(getattr(module(mod), attr), name=name)
    for name, mod, attr in _COMMANDS:
        app.command(name)(getattr(module(mod), attr))


_register()


def main() -> None:
    """Console-script entry point; an exception outside any command is still one line + a log."""
    try:
        app()
    except Exception as err:
        from twoclocks_cli.crash import EXIT_CODE, one_line

        typer.echo(one_line(err), err=True)
        raise SystemExit(EXIT_CODE) from None
