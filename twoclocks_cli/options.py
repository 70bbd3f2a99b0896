"""Options shared by several commands, declared once (Typer `Annotated` style)."""

from typing import Annotated

import typer

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        envvar="TWOCLOCKS_DB",
        help="Database URL (sqlite:///FILE or postgresql://USER:PASS@HOST/DB). "
        "Default: $TWOCLOCKS_DB, else sqlite:///twoclocks.db in the working directory.",
        show_envvar=False,
    ),
]

JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
