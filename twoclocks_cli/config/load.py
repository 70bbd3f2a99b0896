"""Read a sweep config file; every TOML or validation problem becomes one ConfigError line."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from twoclocks_cli.config.models import SweepConfig
from twoclocks_cli.core import toml
from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.core.limits import NAME_CHARS, refuse_nul
from twoclocks_cli.core.numbers import short


def load_config(path: str | Path) -> SweepConfig:
    """Parse and validate the TOML file at `path` (raises ConfigError naming file and key)."""
    data = toml.read(path)
    return parse_config(data, str(path))


def parse_config(data: dict[str, Any], source: str = "config") -> SweepConfig:
    """Validate a parsed TOML document; the first problem becomes the error's one line."""
    refuse_nul(data, source)
    try:
        return SweepConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(summarize(exc.errors(include_url=False), data, source)) from None


def summarize(errors: list[dict], data: dict, source: str) -> str:
    """The first problem key as one line; union branches at one key are merged."""
    groups: dict[str, list[dict]] = {}
    for err in _matched_branches(errors):
        groups.setdefault(_location(err["loc"])[1], []).append(err)
    # an unknown key first: it is usually a typo that also explains a "required" error
    first = next((g for g in groups.values() if any(e["type"] == "extra_forbidden" for e in g)),
                 next(iter(groups.values())))
    pointed = [e for e in first if e["type"] in ("extra_forbidden", "missing")]
    if pointed:
        line = describe(pointed[0], data, source)
    elif len(first) == 1:
        line = describe(first[0], data, source)
    else:  # one value tried against several types: say every alternative
        head = describe(first[0], data, source).rsplit(": ", 1)[0]
        alts = dict.fromkeys(_message(e) for e in first)
        line = f"{head}: {' or '.join(alts)}"
    extra = len(groups) - 1
    if extra:
        line += f" (and {extra} more problem{'s' if extra > 1 else ''})"
    return line


def _is_branch(part) -> bool:
    """A union-branch label in an error location (not a key or list index)."""
    return isinstance(part, str) and (any(c in part for c in "[]'(") or part in _TYPE_NAMES)


def _matched_branches(errors: list[dict]) -> list[dict]:
    """Drop union branches whose type did not match when another branch got further in."""
    deep: set[tuple] = set()
    info = []
    for err in errors:
        loc = err["loc"]
        i = next((k for k, p in enumerate(loc) if _is_branch(p)), None)
        parent = tuple(loc[:i]) if i is not None else None
        depth = len(loc) - i - 1 if i is not None else 0
        info.append((parent, depth))
        if parent is not None and depth > 0:
            deep.add(parent)
    return [e for e, (parent, depth) in zip(errors, info, strict=True)
            if not (parent in deep and depth == 0)]


def _message(error: dict) -> str:
    text = error["msg"].replace("Input should be", "must be").replace("Value error, ", "")
    text = re.sub(r"a valid dictionary or instance of \w+", "a table", text)
    text = text.replace("a valid list", "a list")
    text = re.sub(r"String should have at least 1 characters?", "must not be empty", text)
    return text.split(",")[0] if error["type"].endswith("_parsing") else text


def _location(loc: tuple) -> tuple[list[str], str]:
    """The dotted key of a pydantic error location, without union-branch labels."""
    # union branches ("list[int]", "BatchRange", "literal['sqrt',...]", "float") are not keys
    keys = [str(p) for p in loc if not _is_branch(p)]
    return keys, ".".join(keys)


_TYPE_NAMES = {"float", "int", "str", "bool", "BatchRange", "function-after", "none", "list",
               "dict", "constrained-float", "constrained-int"}


def _allowed_keys(keys: list[str]) -> list[str]:
    """The field names of the model that owns the table at `keys` (for 'did you mean')."""
    model: type[BaseModel] | None = SweepConfig
    for key in keys:
        field = model.model_fields.get(key) if model else None
        if field is None:
            return []
        ann = field.annotation
        model = next((a for a in getattr(ann, "__args__", (ann,))
                      if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return sorted(model.model_fields) if model else []


def describe(error: dict, data: dict, source: str) -> str:
    """One line: `FILE: key 'a.b' = value: what is allowed` (+ did-you-mean for unknown keys)."""
    keys, dotted = _location(error["loc"])
    value = error.get("input")
    kind = error["type"]
    if kind == "extra_forbidden":
        parent, name = keys[:-1], keys[-1]
        allowed = _allowed_keys(parent)
        hint = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
        where = ".".join(parent) or "top level"
        msg = f"{source}: unknown key {short(dotted)} = {short(value)}"
        if hint:
            msg += f": did you mean {'.'.join(parent + [hint[0]])!r}?"
        return msg + f" (allowed in {where}: {', '.join(allowed)})"
    if kind == "missing":
        return f"{source}: key {dotted!r} is required ({_doc(keys)})"
    text = _message(error)
    if kind == "string_pattern_mismatch":
        text = f"must be letters, digits, '.', '_' or '-' (at most {NAME_CHARS})"
    return f"{source}: key {dotted!r} = {short(value)}: {text}"


def _doc(keys: list[str]) -> str:
    """The field's description, which says what is allowed."""
    model: Any = SweepConfig
    field = None
    for key in keys:
        field = getattr(model, "model_fields", {}).get(key)
        if field is None:
            return "see docs/sweeps.md"
        ann = field.annotation
        model = next((a for a in getattr(ann, "__args__", (ann,))
                      if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return field.description if field and field.description else "see docs/sweeps.md"


