"""Which run a workdir belongs to: store (URL without password), run id, cell id and config
hash, in the workdir's `run.json`, so a workdir is never trained in by another run.

A trainer checkpoint carries the same record plus the config it was trained with; the records
and how two are compared (`config_hash`, `describe`, `mismatch`, `config_refusal`) are
`trainer.ownership`'s, so the trainer checks its checkpoints without the CLI, and the store's
identity is `twoclocks_cli.backends.grpo.store_identity`, which the grpo backend needs below
this floor. Resuming compares the records and refuses a mismatch in one line. No torch and no
sqlalchemy imports at module level (the CLI starts fast).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from trainer.ownership import config_hash, describe, mismatch
from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.store.engine import store_identity

RUN_FILE = "run.json"


def run_record(store_url, run_id: int, cell_id: str, config: dict) -> dict:
    """The record naming run `run_id` (cell `cell_id`, trained with `config`) of the store at
    `store_url` in its workdir's run.json."""
    return {"store": store_identity(store_url), "run_id": run_id, "cell_id": cell_id,
            "config_hash": config_hash(config)}


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
