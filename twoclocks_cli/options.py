"""Options shared by several commands, declared once (Typer `Annotated` style)."""

from typing import Annotated

import typer

from twoclocks_cli.core.errors import StoreError


def _db_value(value: str | None) -> str | None:
    """`--db ''` is an error (it used to fall back silently to ./twoclocks.db)."""
    if value is not None and not value.strip():
        raise StoreError(f"--db {value!r}: empty database URL; give e.g. sqlite:///path/to.db "
                         "or postgresql://user:pass@host:5432/dbname")
    return value


DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        envvar="TWOCLOCKS_DB",
        help="Database URL (sqlite:///FILE or postgresql://USER:PASS@HOST/DB). "
        "Default: $TWOCLOCKS_DB, else sqlite:///twoclocks.db in the working directory.",
        show_envvar=False,
        callback=_db_value,
    ),
]

JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
