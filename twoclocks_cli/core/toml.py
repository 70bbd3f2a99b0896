"""The project's one TOML reader and writer.

`read(path, what)` loads a file, every problem (missing, a folder or FIFO, over the size cap,
unreadable, not TOML) one ConfigError line naming the file. The writer:

`value(v)` writes one TOML value (bool, int, finite float, string, list, inline table);
`dumps(doc)` a document: the scalars of each table, then its sub-tables (`[a.b]`) and its lists
of tables (`[[a]]`). None is left out (TOML has no null: a missing key means the default).
`tomllib.loads(dumps(doc))` gives `doc` back, less the None values.
"""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path

from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.core.files import MAX_CONFIG_BYTES, read_regular
from twoclocks_cli.core.numbers import short


def read(path: str | Path, what: str = "config file", hint: str = "",
         max_bytes: int = MAX_CONFIG_BYTES) -> dict:
    """The TOML document at `path`; a missing, unreadable, special (folder, FIFO, device),
    oversized (over `max_bytes`) or invalid file is one ConfigError line (`what` names the kind
    of file, `hint` says how to make a missing one)."""
    path = Path(path)
    data = read_regular(path, max_bytes, what, hint)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: cannot read: not UTF-8 text (byte {err.start})") from None
    text = text.replace("\r\n", "\n").replace("\r", "\n")  # as a text-mode read gives it
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid TOML: arrays or tables nested too deeply") from None
    except ValueError as err:  # an integer past Python's digit limit for int()
        raise ConfigError(f"{path}: not valid TOML here: {str(err).split(':')[0]}") from None


_BARE = re.compile(r"^[A-Za-z0-9_-]+$")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f",
            "\r": "\\r"}


def string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def key(name: str) -> str:
    """A key: bare when it may be, else quoted."""
    if not isinstance(name, str):
        raise ConfigError(f"cannot write the key {short(name)} to TOML: keys are strings")
    return name if _BARE.match(name) else string(name)


def value(v) -> str:
    """One TOML value (ConfigError for what TOML cannot hold: None, NaN, inf, other types)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ConfigError(f"cannot write the non-finite value {v} to TOML")
        return repr(v)
    if isinstance(v, str):
        return string(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(value(x) for x in v) + "]"
    if isinstance(v, dict):
        items = [f"{key(k)} = {value(x)}" for k, x in v.items() if x is not None]
        return "{" + ", ".join(items) + "}" if items else "{}"
    if v is None:
        raise ConfigError("cannot write None to TOML (leave the key out instead)")
    raise ConfigError(f"cannot write a {type(v).__name__} to TOML")


def _is_table_list(v) -> bool:
    return isinstance(v, list | tuple) and len(v) > 0 and all(isinstance(x, dict) for x in v)


def _table(lines: list[str], path: list[str], table: dict) -> None:
    """The scalars of `table`, then its sub-tables and lists of tables, in that order."""
    nested = []
    for k, v in table.items():
        if v is None:
            continue
        if (isinstance(v, dict) and v) or _is_table_list(v):
            nested.append((k, v))
        else:
            lines.append(f"{key(k)} = {value(v)}")
    for k, v in nested:
        sub = [*path, key(k)]
        if isinstance(v, dict):
            lines += ["", f"[{'.'.join(sub)}]"]
            _table(lines, sub, v)
        else:
            for item in v:
                lines += ["", f"[[{'.'.join(sub)}]]"]
                _table(lines, sub, item)


def dumps(doc: dict, header: list[str] | tuple[str, ...] = ()) -> str:
    """A TOML document of `doc` (nested tables included), with `header` lines as comments (a
    header line with line breaks becomes several comment lines)."""
    lines = [f"# {part}".rstrip() for h in header for part in str(h).splitlines() or [""]]
    _table(lines, [], doc)
    while lines and lines[0] == "":
        lines.pop(0)
    return "\n".join(lines) + "\n"
