"""Who a checkpoint belongs to, so that a checkpoint is never resumed by another run.

Every checkpoint records its owner in `owner.json`: the config it was trained with and its hash
and, when the training writes to a store, the store (its URL without password) and the run id.
Resuming compares that record with the resuming training's: another store or run is refused,
and so is a changed config, except a larger sample_budget under `extend`; each refusal is one
line naming both sides or the differing keys. A workdir's own record (`run.json`, written by the
launcher) has the same form and is compared with the same functions. No torch here: the CLI
imports this module and starts fast.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

OWNER = "owner.json"  # the owner record's file in a checkpoint directory
EXTENDABLE = ("sample_budget",)  # what a resume under `extend` may change


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


def mismatch(recorded: dict, expected: dict, keys=("store", "run_id", "cell_id")) -> list[str]:
    """The identity keys on which two records disagree (keys absent from `expected` skip)."""
    return [k for k in keys if expected.get(k) is not None and recorded.get(k) != expected.get(k)]


def read_owner(path: Path) -> dict | None:
    """The owner record of checkpoint directory `path` (None: it has no readable one)."""
    try:
        data = json.loads((Path(path) / OWNER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass
class CheckpointOwner:
    """The owner (`trainer.ports.Owner`) of a training's checkpoints: its config and, when it
    writes to a store, that store's identity (URL without password) and the run id."""

    config: dict
    store: str | None = None
    run_id: int | None = None

    @property
    def record(self) -> dict:
        rec = {"config": self.config, "config_hash": config_hash(self.config)}
        if self.store is not None and self.run_id is not None:
            rec.update(store=self.store, run_id=int(self.run_id))
        return rec

    def refusal(self, path: Path, extend: bool = False) -> str | None:
        """Why checkpoint `path` must not be resumed by this training (None: it may): another
        store or run, no owner record, or a changed config."""
        rec, expected = read_owner(path), self.record
        if rec is None:
            return (f"checkpoint {path} names no run (no readable {OWNER}): resume refused; "
                    "move it away or use another workdir")
        if mismatch(rec, expected, ("store", "run_id")):
            return (f"checkpoint {path} belongs to {describe(rec)}, not "
                    f"{describe(expected)}: resume refused; use another workdir")
        why = config_refusal(rec.get("config") or {}, expected["config"], extend)
        return f"checkpoint {path}: {why}" if why else None
