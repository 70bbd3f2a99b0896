"""Which format a log is in, from what it holds (its name alone can mislead: a `.log` may be
JSON Lines, a `.txt` a verl console log).

- trl: a folder holding `trainer_state.json`, or one JSON document with a `log_history` list
  (or a file named trainer_state.json that starts like JSON, so its parser names the flaw);
- jsonl: one of the first non-empty lines is a whole JSON object;
- verl: a `step:N - key:value` line, an `Initial/Final validation metrics:` line, or verl's own
  marks (`verl.trainer`, a `(TaskRunner pid=N)` / `(main_task pid=N)` Ray prefix, Ray's
  `INFO worker.py:N -- Started a local Ray instance` banner), so that a run
  that crashed before its first step is still told apart (and said to have no step);
- csv: a header row of two or more names, and rows with as many fields;
- wandb-csv: such a header that is a W&B panel export's (`Step, <run> - <metric>, ...`);
- wandb: a `.wandb` file (its `:W&B` header), a W&B run directory holding one, or a `wandb/`
  folder of run directories;
- tensorboard: an `events.out.tfevents.*` file, or a folder with such files in it or below it;
- mlflow: an SQLite file with MLflow's tables, or an `mlruns` folder (experiment folders with
  their meta.yaml).

Only the first MiB is looked at, unless that says nothing (then the whole file, for verl's
marks: a long model-loading preamble can come before the first of them).
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.ingest import mlflow_store, tensorboard, wandb_csv, wandb_offline
from twoclocks_cli.ingest.base import FORMATS

HEAD_BYTES = 1 << 20
_VERL = re.compile(
    r"(?m)(?:^|[\s)\]m])step:\d+ - [^\s:]+:"  # a step line (after a prefix, bar or colour)
    r"|(?:Initial|Final) validation metrics:"
    r"|\bverl\.trainer\b|\brecipe\.\w+\.main_\w+"
    r"|^\((?:TaskRunner|main_task) pid=\d+"
    # Ray's own banner, a verl run's first line (a run that crashed may print nothing more)
    r"|\bINFO worker\.py:\d+ -- (?:Started a local Ray instance|Connecting to existing Ray)"
)


class FormatUnknownError(ConfigError):
    """A file whose content is none of the formats read (and no --format was given)."""


def detect(path: Path, max_bytes: int, finished: bool = True) -> tuple[str, str]:
    """(format, why) of `path`; FormatUnknownError names the file and the formats allowed.
    A file that may still grow (`finished` False) is judged on its complete lines only: a
    first line half written could pass for another format."""
    path = Path(path)
    if path.is_dir():
        return _folder(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such file")
    if not path.is_file():
        raise ConfigError(f"{path}: not a regular file")
    with path.open("rb") as fh:
        head = fh.read(HEAD_BYTES)
    if (binary := _binary(path, head)) is not None:
        return binary
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff")
    if not finished and len(head) < HEAD_BYTES:
        text = text[: text.rfind("\n") + 1]
    found = _from_text(path, text, whole=len(head) < HEAD_BYTES)
    if found is None and len(head) == HEAD_BYTES:
        size = path.stat().st_size
        if size <= max_bytes:  # a larger file is refused by its parser, naming the limit
            if _VERL.search(path.read_bytes().decode("utf-8", errors="replace")):
                found = ("verl", "verl console lines")
    if found is None:
        raise _unknown(path, "")
    return found


def _folder(path: Path) -> tuple[str, str]:
    """The format of a folder: a TRL checkpoint, W&B runs, an mlruns store, TensorBoard runs."""
    if (path / "trainer_state.json").is_file():
        return "trl", "a checkpoint folder holding trainer_state.json"
    if wandb_offline.run_files(path):
        return "wandb", "a folder of W&B runs (.wandb files)"
    if mlflow_store.is_file_store(path):
        return "mlflow", "an MLflow mlruns folder"
    if tensorboard.run_folders(path):
        return "tensorboard", "a folder of TensorBoard event files"
    raise _unknown(path, "a folder without a trainer_state.json, a .wandb file, an MLflow "
                   "experiment or a TensorBoard event file")


def _binary(path: Path, head: bytes) -> tuple[str, str] | None:
    """A W&B log, a TensorBoard event file or an MLflow SQLite store, from its first bytes."""
    if head.startswith(wandb_offline.MAGIC):
        return "wandb", "a W&B transaction log (:W&B header)"
    if path.name.startswith("events.out.tfevents."):
        return "tensorboard", "a TensorBoard event file"
    if head.startswith(mlflow_store.SQLITE_MAGIC):
        if mlflow_store.is_sqlite_store(path):
            return "mlflow", "an SQLite file with MLflow's tables"
        raise _unknown(path, "an SQLite database without MLflow's tables")
    return None


def _unknown(path: Path, what: str) -> FormatUnknownError:
    return FormatUnknownError(
        f"{path}: {what or 'the format cannot be told from the content'}: it is none of a verl "
        "console log, a TRL trainer_state.json or checkpoint folder, JSON Lines, a CSV with a "
        "header row, a W&B run folder or panel CSV, an MLflow store, TensorBoard event files "
        f"(pass --format {'|'.join(FORMATS)})")


def _from_text(path: Path, text: str, whole: bool) -> tuple[str, str] | None:
    stripped = text.lstrip()
    if not stripped:
        return None
    lines = [ln for ln in stripped.split("\n")[:20] if ln.strip()]
    if stripped.startswith(("{", "[")):
        first = next((obj for ln in lines[:5] if (obj := _object(ln)) is not None), None)
        if first is not None:
            if isinstance(first.get("log_history"), list):  # trainer_state.json on one line
                return "trl", "a JSON document with a log_history list"
            return "jsonl", "JSON objects, one a line"
        if '"log_history"' in text or path.name == "trainer_state.json":
            return "trl", "a JSON document with a log_history list"
        if whole and _is_json(stripped):
            return None  # one JSON document, but not a trainer_state.json
    if _VERL.search(text):
        return "verl", "verl console lines"
    if not stripped.startswith(("{", "[")) and _is_csv(lines):
        if wandb_csv.is_panel_header(_header(lines)):
            return "wandb-csv", "a W&B panel export (Step, <run> - <metric>, ...)"
        return "csv", "a CSV header row and rows"
    return None


def _object(line: str) -> dict | None:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except (ValueError, RecursionError):
        return False


def _header(lines: list[str]) -> list[str]:
    try:
        return [h.strip() for h in next(csv.reader(io.StringIO(lines[0])))]
    except (csv.Error, StopIteration):
        return []


def _is_csv(lines: list[str]) -> bool:
    """A header of 2+ names, each non-empty but the first (pandas' `to_csv` writes its index
    column with an empty name), and the next few rows with as many fields."""
    if not lines:
        return False
    try:
        rows = list(csv.reader(io.StringIO("\n".join(lines[:6]))))
    except csv.Error:
        return False
    header = [h.strip() for h in rows[0]]
    if len(header) < 2 or not all(header[1:]) or len(set(header)) != len(header):
        return False
    body = rows[1:-1] if len(rows) > 2 else rows[1:]  # the 6th line may be cut by the head
    return all(len(r) == len(header) for r in body if r)
