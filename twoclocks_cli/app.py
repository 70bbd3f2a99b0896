"""The `twoclocks` command: a Typer app that registers one module per command group.

Only typer is imported at start-up; every command imports what it needs (sqlalchemy, numpy,
torch) inside its body, so `twoclocks --help` stays instant.
"""

from __future__ import annotations

import click
import typer
from typer.core import TyperGroup

from twoclocks_cli import __version__
from twoclocks_cli.errors import TwoclocksError


class _Group(TyperGroup):
    """Turns a TwoclocksError anywhere below into one line on stderr and its exit code."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except TwoclocksError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(err.exit_code) from None


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


def _register() -> None:
    from twoclocks_cli.commands import db, runs

    app.add_typer(db.app, name="db")
    app.add_typer(runs.app, name="runs")
    from twoclocks_cli.commands import ingest

    app.command("ingest")(ingest.ingest)
    from twoclocks_cli.commands import report

    app.command("report")(report.report)
    from twoclocks_cli.commands import train

    app.command("train")(train.train)
    from twoclocks_cli.commands import analyze, schedule, theory

    app.command("analyze")(analyze.analyze)
    app.command("schedule")(schedule.schedule)
    app.command("theory")(theory.theory)
    from twoclocks_cli.commands import compare

    app.command("schedule-config")(compare.schedule_config)
    app.command("compare")(compare.compare)
    from twoclocks_cli.commands import plan, status, sweep

    app.command("plan")(plan.plan_cmd)
    app.command("sweep")(sweep.sweep)
    app.command("status")(status.status)
    app.command("cancel")(sweep.cancel)
    app.add_typer(sweep.sweeps_app, name="sweeps")


_register()


def main() -> None:
    """Console-script entry point."""
    app()
