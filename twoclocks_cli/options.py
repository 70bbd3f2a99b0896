"""Options shared by several commands, declared once (Typer `Annotated` style), and the one
validation layer every option goes through before a command does any work: numbers finite and
within what the store holds (`check_numbers`, attached to every parameter by the app), ranges
(`within`), comma lists (`parse_numbers`) and output paths (`out_path`)."""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:  # typer vendors click; the click package itself is not a dependency
    import click

from twoclocks_cli.core.errors import ConfigError, StoreError
from twoclocks_cli.core.limits import INT32_MAX, INT64_MAX, name_max, path_problem

MAX_LIST = 1_000  # values one option may list (batch grids, repeated --run)


def option_name(param: click.Parameter) -> str:
    """How the user spelled the parameter: its long option ('--budget'), or its metavar."""
    opts = [o for o in getattr(param, "opts", []) if o.startswith("--")]
    return opts[0] if opts else getattr(param, "metavar", None) or (param.name or "").upper()


def _number_problem(value) -> str | None:
    """Why a converted option value cannot be used anywhere (non-finite, beyond INT64), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    if isinstance(value, int) and not -INT64_MAX <= value <= INT64_MAX:
        return f"must be between {-INT64_MAX:,} and {INT64_MAX:,}"
    return None


def check_numbers(param: click.Parameter, value):
    """The check every parameter of every command gets: each number finite and within INT64,
    at most MAX_LIST values for a repeated option (arguments take a shell glob's many files)."""
    values = value if isinstance(value, (list, tuple)) else [value]
    if len(values) > MAX_LIST and getattr(param, "param_type_name", "") == "option":
        raise ConfigError(f"{option_name(param)}: {len(values):,} values; at most {MAX_LIST:,}")
    for v in values:
        if (why := _number_problem(v)) is not None:
            raise ConfigError(f"{option_name(param)} {v!r}: {why}")
    return value


def harden(command: click.Command) -> None:
    """Put `check_numbers` in front of every parameter's own callback, in `command` and every
    subcommand, so no command sees a value it cannot use."""
    for sub in getattr(command, "commands", {}).values():
        harden(sub)
    for param in command.params:
        if getattr(param, "_checked", False):
            continue
        own = param.callback

        def checked(ctx, p, value, own=own):
            value = check_numbers(p, value)
            return own(ctx, p, value) if own is not None else value

        param.callback = checked
        param._checked = True


def _n(x) -> str:
    """A bound as a person reads it: 1,000,000 for a whole number, 0.5 or 1e+30 otherwise."""
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e19 else f"{x:g}"


def _range_text(low, high, low_open: bool, high_open: bool) -> str:
    """'> 0', '>= 1', 'in (0, 1)', 'between 0 and 100,000': what a bounded value may be."""
    if low is not None and high is not None:
        if not low_open and not high_open:
            return f"between {_n(low)} and {_n(high)}"
        return f"in {'(' if low_open else '['}{_n(low)}, {_n(high)}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {_n(low)}"
    return f"{'<' if high_open else '<='} {_n(high)}"


def range_problem(value, low=None, high=None, low_open=False, high_open=False) -> str | None:
    """Why `value` is outside the range (non-finite included), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    below = low is not None and (value <= low if low_open else value < low)
    above = high is not None and (value >= high if high_open else value > high)
    return f"must be {_range_text(low, high, low_open, high_open)}" if below or above else None


def within(low=None, high=None, *, low_open: bool = False, high_open: bool = False):
    """An option callback refusing values outside [low, high] (open ends when asked); None,
    the value of an option not given, passes."""

    def check(ctx, param, value):
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is not None and (why := range_problem(v, low, high, low_open, high_open)):
                raise ConfigError(f"{option_name(param)} {v!r}: {why}")
        return value

    return check


def parse_numbers(text: str, option: str, low=None, high=None, *, low_open: bool = False,
                  whole: bool = False, most: int = MAX_LIST) -> list[float]:
    """A comma-separated list of numbers ('8,16,32'), each finite and within the range, at
    least one and at most `most` of them."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{option} {text!r}: expected a comma-separated list of "
                          "numbers") from None
    if not values:
        raise ConfigError(f"{option} {text!r}: give at least one number")
    if len(values) > most:
        raise ConfigError(f"{option}: {len(values):,} values; at most {most:,}")
    for v in values:
        if why := range_problem(v, low, high, low_open):
            raise ConfigError(f"{option} {text!r}: {v:g} {why}")
        if whole and v != int(v):
            raise ConfigError(f"{option} {text!r}: {v:g} must be a whole number")
    return values


SAMPLES = within(0, INT64_MAX, low_open=True)  # a sample budget or position (BIGINT samples)
SAFETY = within(0, 1, low_open=True)  # a share of the failure clock's lower bound
SEED = within(0, INT32_MAX)  # what numpy's generators and the runs.seed column both take
COUNT = within(1, INT32_MAX)  # seeds, windows, steps: at least one, a column's worth at most


TEMP_ROOM = 32  # bytes a temporary name beside an output adds to it ('.NAME.XXXXXXXX.part')


def out_path_problem(path: Path, folder: bool = False) -> str | None:
    """Why `path` cannot be written (an illegal or too long name, a missing or read-only
    parent, a directory where a file is wanted), or None. Nothing is created here."""
    if why := path_problem(str(path), reserve=TEMP_ROOM):
        return why
    room = name_max(path.absolute()) - TEMP_ROOM
    if len(os.fsencode(path.name)) > room:
        return (f"the file name is {len(os.fsencode(path.name))} bytes; at most {room} (room "
                "for the temporary file written beside it)")
    if not folder and path.is_dir():
        return "is a directory; give a file name"
    if folder and path.exists() and not path.is_dir():
        return "exists and is not a directory"
    parent = path.parent if str(path.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        return f"{str(parent)!r} is not a directory"
    if not parent.is_dir():
        return f"directory {str(parent)!r} does not exist"
    target = path if path.exists() else parent
    if not os.access(target, os.W_OK):
        return "not writable"
    return None


def out_path(ctx, param, value):
    """Option callback for an output file: refused before any work when it cannot be written."""
    if value is not None and (why := out_path_problem(Path(value))):
        raise ConfigError(f"{option_name(param)} {value}: {why}")
    return value


def in_paths(ctx, param, value):
    """Option or argument callback for paths to read: each a path the OS can look up (no NUL,
    no part or whole too long); whether it exists is the command's to say."""
    for v in value if isinstance(value, (list, tuple)) else [value]:
        if v is not None and (why := path_problem(str(v))):
            raise ConfigError(f"{option_name(param)} {str(v)[:80]}: {why}")
    return value


def out_folder(ctx, param, value):
    """Option callback for an output folder (created later, by the command, in an existing
    writable parent)."""
    if value is not None and (why := out_path_problem(Path(value), folder=True)):
        raise ConfigError(f"{option_name(param)} {value}: {why}")
    return value


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


def model_options(model) -> list[inspect.Parameter]:
    """A Typer option for every field of the dataclass `model` whose metadata carries a help text
    (`clocks.options.cli`): the field's type, its default (the metadata's `cli_default` where the
    command's differs) and help; a bool is a --name/--no-name flag. The model stays the one
    source of each option's default and help."""
    hints = typing.get_type_hints(model)
    params = []
    for f in dataclasses.fields(model):
        if "help" not in f.metadata:
            continue
        flag = f.name.replace("_", "-")
        decls = (f"--{flag}/--no-{flag}",) if hints[f.name] is bool else ()
        option = typer.Option(*decls, help=f.metadata["help"])
        params.append(inspect.Parameter(
            f.name, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[hints[f.name], option],
            default=f.metadata.get("cli_default", f.default)))
    return params


def with_model_options(model, after: str):
    """Decorator: the command takes `model`'s options (`model_options`) after its parameter
    `after`, and receives them in its `**options`."""

    def decorate(command):
        own = inspect.signature(command, eval_str=True).parameters.values()
        params = []
        for p in own:
            if p.kind is not inspect.Parameter.VAR_KEYWORD:
                params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY))
            if p.name == after:
                params += model_options(model)
        command.__signature__ = inspect.Signature(params)
        return command

    return decorate
