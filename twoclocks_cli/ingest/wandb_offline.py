"""W&B run directories (`wandb/offline-run-*`, `wandb/run-*`): the `.wandb` transaction log,
read offline — no account, no network.

The `.wandb` file is what `wandb sync` uploads: a `:W&B` header, then records in 32 KiB blocks,
each chunk with a CRC-32 and a type (whole, first, middle, last), each record a protobuf
`Record` decoded with the wandb package's own message classes (`pip install -e '.[sources]'`).
The run record gives the run's id, name and config (later `config` records update it); each
`history` record is one logged row (`_step` is the step, or HF/TRL's `train/global_step` when
the row has it; a row without it at its `eval/global_step`, as OpenRLHF logs its evaluations in
rows of their own). Step axes (those keys, and every `define_metric(step_metric=...)`) are not
metrics; nor are media (a table's `nrows`, an image's `width`: the items under a key with a
`_type`). A chunk that fails its checksum is a corrupt file: refused. A last record cut
off mid-write (a run still going) is left out, with a note. Run directories of one run id (a run
resumed into a new directory) are joined in the order they were made; a later directory's steps
replace the earlier one's from its first step on (the run went back to a checkpoint).
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from pathlib import Path

from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.ingest import scalars
from twoclocks_cli.ingest.base import (
    IngestOptions,
    NoStepsError,
    ParsedLog,
    read_bytes,
    to_step,
)

MAGIC = b":W&B"
_HEADER = 7  # magic, 2-byte ident, version
_BLOCK = 32 * 1024
_CHUNK = 7  # crc32 (4), length (2), type (1)
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
# the trainer's own step (HF/TRL, verl): W&B's `_step` counts log calls and, in a run resumed
# offline without `step=`, starts again at 0
_STEP_KEYS = ("train/global_step", "trainer/global_step", "training/global_step", "global_step")
# the training step of a row that logs an evaluation alone (OpenRLHF: `eval/*` rows carry it and
# no `train/global_step`)
_EVAL_STEP_KEYS = ("eval/global_step",)


def run_files(path: Path) -> list[Path]:
    """The `.wandb` files a path names: the file itself, a run directory's, or those of the run
    directories in a `wandb/` folder (its `latest-run` link is not followed twice)."""
    if path.is_file():
        return [path]
    own = sorted(path.glob("*.wandb"))
    if own:
        return own
    for folder in (path, path / "wandb"):
        found = sorted(f for d in folder.glob("*") if d.is_dir() and not d.is_symlink()
                       for f in d.glob("*.wandb"))
        if found:
            return found
    return []


def records(path: Path, data: bytes, finished: bool, notes: list[str]):
    """Each record of a `.wandb` file, as the wandb package's protobuf `Record`."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb

    if len(data) < _HEADER or data[:4] != MAGIC:
        raise ConfigError(f"{path}: not a W&B transaction log (no ':W&B' header)")
    if data[6] != 0:
        raise ConfigError(f"{path}: W&B log version {data[6]}, this reader knows version 0")
    for at, body in _chunks(path, data, finished, notes):
        record = pb.Record()
        try:
            record.ParseFromString(body)
        except DecodeError:
            raise ConfigError(f"{path}: the record at byte {at} does not decode (a corrupt "
                              ".wandb file); nothing imported") from None
        yield record


def _chunks(path: Path, data: bytes, finished: bool, notes: list[str]):
    """(offset, bytes) of each whole record, its chunks joined and checked."""
    pos, parts, start = _HEADER, [], None
    while pos < len(data):
        room = _BLOCK - pos % _BLOCK
        if room < _CHUNK:  # the block's tail is padding
            pos += room
            continue
        if pos + _CHUNK > len(data):
            _cut(path, pos, notes, finished)
            return
        crc, size, kind = struct.unpack_from("<IHB", data, pos)
        if crc == 0 and size == 0 and kind == 0:  # zero padding to the block's end
            pos += room
            continue
        body = data[pos + _CHUNK: pos + _CHUNK + size]
        if len(body) < size:
            _cut(path, pos, notes, finished)
            return
        if zlib.crc32(body, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc or \
                kind not in (_FULL, _FIRST, _MIDDLE, _LAST):
            raise ConfigError(f"{path}: the record at byte {pos} fails its checksum (a corrupt "
                              ".wandb file); nothing imported")
        if kind in (_FULL, _FIRST):
            parts, start = [body], pos
        else:
            parts.append(body)
        if kind in (_FULL, _LAST):
            yield start, b"".join(parts)
            parts = []
        pos += _CHUNK + size
    if parts:
        _cut(path, start, notes, finished)


def _cut(path: Path, at: int, notes: list[str], finished: bool) -> None:
    why = "cut off" if finished else "still being written"
    notes.append(f"{path.name} ends mid-record (byte {at}, {why}): that record was not imported")


def _value(item):
    """A history item's number, or None (text, media, histograms, booleans)."""
    kind = item.WhichOneof("value")
    if kind == "number":
        return item.number
    if kind == "integer":
        return float(item.integer)
    if kind in ("none", "boolean", "text"):
        return None
    try:
        v = json.loads(item.json if kind == "json" else item.value_json)
    except ValueError:
        return None
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _key(item) -> str:
    return item.key or ".".join(item.nested_key)


def _history_row(history) -> dict[str, float]:
    """A history record's numbers, without a media object's fields (W&B logs a table, image or
    histogram as the items under its key, one of them `_type`)."""
    media = {tuple(i.nested_key[:-1]) for i in history.item
             if len(i.nested_key) > 1 and i.nested_key[-1] == "_type"}
    row = {_key(i): v for i in history.item
           if not (media and tuple(i.nested_key[:-1]) in media) and (v := _value(i)) is not None}
    if "_step" not in row and history.HasField("step"):
        row["_step"] = float(history.step.num)
    return row


def _set(tree: dict, keys: list[str], value) -> None:
    for k in keys[:-1]:
        tree = tree.setdefault(k, {}) if isinstance(tree.get(k, {}), dict) else {}
    tree[keys[-1]] = value


class _Part:
    """What one `.wandb` file holds of its run."""

    def __init__(self, path: Path):
        self.path, self.run_id, self.name, self.config = path, "", "", {}
        self.rows: list[dict[str, float]] = []
        self.axes: set[str] = set()  # keys `define_metric` names as step metrics
        self.exited, self.resumed = False, False


def _config_items(part: _Part, items) -> None:
    for item in items:
        try:
            value = json.loads(item.value_json)
        except ValueError:
            continue
        _set(part.config, list(item.nested_key) or [item.key], value)


def read_part(path: Path, opts: IngestOptions, notes: list[str]) -> tuple[_Part, bytes]:
    data = read_bytes(path, opts.max_bytes)
    part = _Part(path)
    for record in records(path, data, opts.finished, notes):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            part.run_id = run.run_id or part.run_id
            part.name = run.display_name or part.name
            part.resumed = part.resumed or run.resumed
            _config_items(part, run.config.update)
        elif kind == "config":
            _config_items(part, record.config.update)
            for item in record.config.remove:
                part.config.pop(item.key, None)
        elif kind == "history":
            part.rows.append(_history_row(record.history))
        elif kind == "metric" and record.metric.step_metric:
            part.axes.add(record.metric.step_metric)
        elif kind == "exit":
            part.exited = True
    part.config.pop("_wandb", None)
    if not part.run_id:
        raise NoStepsError(f"{path}: no run record yet: a W&B run that has not started (or "
                           "not the log of a run); nothing imported")
    return part, data


def _run(parts: list[tuple[_Part, bytes]], opts: IngestOptions,
         notes: list[str]) -> scalars.TrackedRun:
    """One W&B run from its directories' parts, in the order they were made."""
    first = parts[0][0]
    digest = hashlib.sha256()
    for _, data in parts:
        digest.update(hashlib.sha256(data).digest())
    run = scalars.TrackedRun(key=first.run_id, name=first.name or first.run_id,
                             sha256=digest.hexdigest(),
                             size=sum(len(d) for _, d in parts), config_from="W&B config",
                             notes=notes)
    rows = [r for p, _ in parts for r in p.rows]
    run.step_key = opts.column_map.get("step") or next(
        (k for k in _STEP_KEYS if any(k in r for r in rows)), "_step")
    for i, (part, _) in enumerate(parts):
        steps = _steps(part, run, opts)
        if i and steps:
            again = (" (W&B's _step counts again from 0 in a run resumed offline without "
                     "step=: --map step=KEY names the trainer's step if it logs one)"
                     if run.step_key == "_step" and min(steps) == 0 and run.steps else "")
            notes.append(f"resumed in {part.path.parent.name} from step {min(steps)}"
                         + scalars.splice_resumed(run.steps, steps) + again)
            continue
        for step, values in steps.items():
            run.steps.setdefault(step, {}).update(values)
        run.config.update(part.config)
    if not parts[-1][0].exited:
        run.unfinished = ("no exit record: the run was still going, or was killed, when its "
                          "log was last written")
        notes.append(run.unfinished + " (stored as incomplete)")
    return run


def _steps(part: _Part, run: scalars.TrackedRun, opts: IngestOptions) -> dict:
    """step -> {key: value} of one part's history rows (internal `_` keys and step axes left
    out; a row with nothing else, such as a media row, is no step)."""
    steps: dict[int, dict[str, float]] = {}
    without = 0
    same = _step_is_trainers(part.rows, run.step_key)
    axes = part.axes | {run.step_key, *_STEP_KEYS, *_EVAL_STEP_KEYS}
    for row in part.rows:
        values = {k: v for k, v in row.items() if not k.startswith("_") and k not in axes}
        if not values:
            continue
        key = _row_step(row, run.step_key, same)
        if key is None:
            without += 1
            continue
        try:
            step = to_step(row[key])
        except ValueError as exc:
            raise ConfigError(f"{part.path}: {key} {exc}") from None
        have = steps.setdefault(step, {})
        run.duplicates += sum(1 for k in values if k in have)
        have.update(values)
    if without:
        run.notes.append(f"{without} history row(s) of {part.path.name} without "
                         f"{run.step_key!r} are not steps: not imported")
    return steps


def _row_step(row: dict, key: str, same: bool) -> str | None:
    """The key holding a row's training step: the run's step key; else an evaluation row's
    own global step (when the run steps on the trainer's); else `_step` when it is the
    trainer's (`same`)."""
    if key in row:
        return key
    if key != "_step":
        own = next((k for k in _EVAL_STEP_KEYS if k in row), None)
        if own is not None:
            return own
    return "_step" if same and "_step" in row else None


def _step_is_trainers(rows: list[dict], key: str) -> bool:
    """Whether W&B's `_step` is the trainer's step `key` wherever both are logged (verl logs
    with `step=`): then a row without `key` (an evaluation logged alone) is at its `_step`."""
    both = [r for r in rows if key in r and "_step" in r]
    return key != "_step" and bool(both) and all(r[key] == r["_step"] for r in both)


def parse_runs(path: Path, opts: IngestOptions) -> list[ParsedLog]:
    """Every W&B run under `path` (a `.wandb` file, a run directory, a `wandb/` folder)."""
    files = run_files(path)
    if not files:
        raise ConfigError(f"{path}: no .wandb file (a W&B run directory holds "
                          "run-ID.wandb; a wandb/ folder holds run directories)")
    by_id: dict[str, list] = {}
    notes: dict[str, list[str]] = {}
    for f in files:  # directory names begin with their start time: this is their order
        part_notes: list[str] = []
        part, data = read_part(f, opts, part_notes)
        by_id.setdefault(part.run_id, []).append((part, data))
        notes.setdefault(part.run_id, []).extend(part_notes)
    runs = [_run(parts, opts, notes[rid]) for rid, parts in by_id.items()]
    runs = scalars.select_runs(path, runs, opts)
    return [scalars.to_log(r, path, "wandb", opts) for r in runs]
