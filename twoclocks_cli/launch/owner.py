"""Which run a workdir and its checkpoints belong to: store (URL without password), run id,
cell id and config hash, so a checkpoint is never resumed by another run.

A workdir names its run in `run.json`; a trainer checkpoint carries the same record plus the
config it was trained with (trainer/checkpoint.py). Resuming compares the records and refuses a
mismatch in one line. No torch and no sqlalchemy imports at module level (the CLI starts fast).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from twoclocks_cli.core.errors import ConfigError

RUN_FILE = "run.json"
EXTENDABLE = ("sample_budget",)  # what `twoclocks train --extend` may change on a resume


def store_identity(url) -> str:
    """The store's URL without its password; a relative SQLite path made absolute."""
    from sqlalchemy.engine import make_url

    from twoclocks_cli.store.engine import mask_url

    parsed = make_url(url) if isinstance(url, str) else url
    db = parsed.database
    if parsed.get_backend_name() == "sqlite" and db and db != ":memory:" and \
            not db.startswith("file:"):
        parsed = parsed.set(database=str(Path(db).resolve()))
    return mask_url(parsed)


def config_hash(config: dict) -> str:
    """sha256 of a config's canonical JSON (first 16 hex digits)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _flat(config: dict, prefix: str = "") -> dict:
    """Nested tables flattened to dotted keys (lists compare whole)."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_diff(old: dict, new: dict) -> dict[str, tuple]:
    """Dotted key → (old, new) for every value that differs (missing keys show as None)."""
    a, b = _flat(old or {}), _flat(new or {})
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def describe_diff(diff: dict[str, tuple], limit: int = 6) -> str:
    """'lr: 0.0001 -> 0.0005, seed: 1 -> 2' (at most `limit` keys, then a count)."""
    parts = [f"{k}: {a!r} -> {b!r}" for k, (a, b) in list(diff.items())[:limit]]
    if len(diff) > limit:
        parts.append(f"and {len(diff) - limit} more")
    return ", ".join(parts)


def config_refusal(old: dict, new: dict, extend: bool) -> str | None:
    """Why a run trained with `old` cannot continue with `new` (None: it can).

    With `extend`, only a larger sample_budget may differ."""
    diff = config_diff(old, new)
    if not diff:
        return None
    if extend and set(diff) <= set(EXTENDABLE):
        a, b = diff["sample_budget"]
        if isinstance(a, int | float) and isinstance(b, int | float) and b >= a:
            return None
        return f"--extend may only raise sample_budget (was {a!r}, now {b!r})"
    hint = ("; --extend allows only a larger sample_budget" if extend else
            "; to change only sample_budget pass --extend, else use a new --workdir")
    return f"the config differs from the one it was trained with ({describe_diff(diff)}){hint}"


def describe(record: dict) -> str:
    """'run 3 of sqlite:////x.db' for messages."""
    if record.get("run_id") is None and record.get("store") is None:
        return "an unknown run (no owner recorded)"
    return f"run {record.get('run_id')} of {record.get('store') or 'no store'}"


def read(workdir: Path) -> dict | None:
    """The record in `workdir/run.json`, or None when there is none."""
    path = Path(workdir) / RUN_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: unreadable ({exc}); move the workdir away") from None
    return data if isinstance(data, dict) else {}


def write(workdir: Path, record: dict) -> None:
    """Write `record` to `workdir/run.json` atomically."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    tmp = workdir / f"{RUN_FILE}.tmp{os.getpid()}"
    tmp.write_text(json.dumps(record, sort_keys=True))
    os.replace(tmp, workdir / RUN_FILE)


def mismatch(recorded: dict, expected: dict, keys=("store", "run_id", "cell_id")) -> list[str]:
    """The identity keys on which two records disagree (keys absent from `expected` skip)."""
    return [k for k in keys if expected.get(k) is not None and recorded.get(k) != expected.get(k)]


def claim(workdir: Path, expected: dict) -> None:
    """Make `workdir` belong to `expected`: write its run.json, or check the one there.

    Raises ConfigError naming both runs when the workdir belongs to another run."""
    have = read(workdir)
    if have is None:
        write(workdir, expected)
        return
    bad = mismatch(have, expected, ("store", "run_id", "cell_id", "config_hash"))
    if bad:
        raise ConfigError(f"workdir {workdir} belongs to {describe(have)}, not "
                          f"{describe(expected)} (differs in {', '.join(bad)}): resume refused; "
                          "use another workdir")
