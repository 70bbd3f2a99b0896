"""Options shared by several commands, declared once (Typer `Annotated` style)."""

from pathlib import Path
from typing import Annotated

import typer

from twoclocks_cli.core.errors import ConfigError, StoreError


def _db_value(value: str | None) -> str | None:
    """`--db ''` is an error: falling back to ./twoclocks.db would write where nobody looks; an
    in-memory SQLite database is one too: what a command writes there is gone when it exits."""
    if value is not None and not value.strip():
        raise StoreError(f"--db {value!r}: empty database URL; give e.g. sqlite:///path/to.db "
                         "or postgresql://user:pass@host:5432/dbname")
    if value is not None:
        from twoclocks_cli.store.engine import is_in_memory

        if is_in_memory(value):
            raise StoreError(f"--db {value!r}: an in-memory database keeps nothing once the "
                             "command exits; give a file, e.g. sqlite:///twoclocks.db")
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

KeysOption = Annotated[str | None, typer.Option(
    "--keys", help="Comma-separated metric keys (default: every key the run logged).")]
YesOption = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
ForceOption = Annotated[bool, typer.Option(
    "--force", help="Cancel submitted/running runs first, then delete (runs delete: local "
    "cells only; sweeps delete: the whole sweep, as `twoclocks cancel`).")]
ConfigArg = Annotated[Path, typer.Argument(help="Sweep config (TOML); see docs/sweeps.md.",
                                           show_default=False)]


def parse_keys(text: str | None) -> list[str] | None:
    """`--keys a,b` as a list (None: all keys); an empty list is refused."""
    if text is None:
        return None
    keys = [k.strip() for k in text.split(",") if k.strip()]
    if not keys:
        raise ConfigError(f"--keys {text!r}: name at least one metric key")
    return list(dict.fromkeys(keys))
