"""TensorBoard event files (`events.out.tfevents.*`): every folder holding some is one run.

verl's `tensorboard` logger and HF/TRL's `report_to="tensorboard"` write scalars with the step
they train at; a folder of folders (verl's `tensorboard_log/<project>/`, HF's `runs/`) is a sweep.
OpenRLHF's `TensorboardLogger` writes `train/<k>` and `eval/<k>` at its global step and no config
(its names are read in scalars.py).
Records are read with tensorboard's own reader (CRC-checked) and `Event` protobuf: a record that
fails its checksum is a corrupt file, refused; a last record cut off mid-write (a run still
going) is left out, with a note. Scalars are old-style `simple_value`s or new-style scalar
tensors; TensorBoard keeps them as 32-bit floats (about 7 significant digits: said in a note).
The run's config is its `add_hparams` record (also from an hparams-only subfolder, as
`SummaryWriter.add_hparams` writes one; the scalars of its `metric_dict` there are the run's
summary, not steps: left out, with a note) and a JSON text summary named `args` or `config` (HF
writes its TrainingArguments so). Several event files in one folder are one run restarted: in
file order, a later file's steps replace the earlier ones' from its first step on (TensorBoard's
own rule for a run resumed from a checkpoint).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.ingest import scalars
from twoclocks_cli.ingest.base import IngestOptions, ParsedLog, read_bytes

MARK = "tfevents"


def is_event_file(path: Path) -> bool:
    return path.name.startswith("events.out.tfevents.") and path.is_file()


def run_folders(path: Path) -> dict[Path, list[Path]]:
    """folder -> its event files, in the order they were made, for `path` (a file or a tree)."""
    if path.is_file():
        return {path.parent: [path]}
    out: dict[Path, list[Path]] = {}
    for root, dirs, files in os.walk(path):  # symlinked folders are not followed
        dirs.sort(key=_natural)  # bs32 before bs128, as a sweep reads
        found = sorted(Path(root) / f for f in files if f.startswith("events.out.tfevents."))
        if found:
            out[Path(root)] = found
    return out


def _natural(name: str) -> list:
    """A sort key that orders the numbers in a name by value."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


class _File:
    """What one event file holds: steps of scalars, hparams, and whether they were float32."""

    def __init__(self):
        self.steps: dict[int, dict[str, float]] = {}
        self.config: dict = {}
        self.hparams = False
        self.metric_tags: set[str] = set()  # the metrics an hparams experiment names
        self.float32 = False
        self.duplicates = 0


def _events(path: Path, finished: bool, notes: list[str]):
    """Each Event in the file; a bad checksum is refused, a record cut short ends it."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow

    reader = pywrap_tensorflow.PyRecordReader_New(str(path))
    n = 0
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return
        except errors.DataLossError as exc:
            if "truncated record" in str(exc):
                why = "cut off" if finished else "still being written"
                notes.append(f"{path.name} ends mid-record (after record {n}, {why}): that "
                             "record was not imported")
                return
            raise ConfigError(f"{path}: record {n + 1} fails its checksum (a corrupt event "
                              "file); nothing imported") from None
        event = event_pb2.Event()
        try:
            event.ParseFromString(reader.record())
        except Exception:  # protobuf's DecodeError
            raise ConfigError(f"{path}: record {n + 1} is not a TensorBoard event (a corrupt "
                              "event file); nothing imported") from None
        n += 1
        yield event


def _read(path: Path, opts: IngestOptions, notes: list[str]) -> _File:
    from tensorboard.util import tensor_util

    out, plugins = _File(), {}
    for event in _events(path, opts.finished, notes):
        if event.step < 0:
            raise ConfigError(f"{path}: step {event.step} is negative")
        for v in event.summary.value:
            if v.metadata.plugin_data.plugin_name:
                plugins[v.tag] = v.metadata.plugin_data.plugin_name
            plugin = plugins.get(v.tag, "")
            if plugin == "hparams":
                _hparams(out, v.metadata.plugin_data.content)
                continue
            if plugin == "text" and v.tag.split("/")[0] in ("args", "config"):
                _text_config(out, v, tensor_util)
                continue
            value = _scalar(v, plugin, tensor_util, out)
            if value is not None:
                row = out.steps.setdefault(event.step, {})
                out.duplicates += v.tag in row
                row[v.tag] = value
    return out


def _scalar(v, plugin: str, tensor_util, out: _File) -> float | None:
    if v.HasField("simple_value"):
        out.float32 = True
        return float(v.simple_value)
    if plugin == "scalars" and v.HasField("tensor"):
        array = tensor_util.make_ndarray(v.tensor)
        if array.size == 1 and array.dtype.kind == "f":
            out.float32 = out.float32 or array.dtype.itemsize < 8
            return float(array.reshape(()))
    return None


def _hparams(out: _File, content: bytes) -> None:
    from tensorboard.plugins.hparams import plugin_data_pb2

    data = plugin_data_pb2.HParamsPluginData()
    try:
        data.ParseFromString(content)
    except Exception:  # protobuf's DecodeError: an hparams record of another version
        return
    out.metric_tags.update(m.name.tag for m in data.experiment.metric_infos)
    for name, value in data.session_start_info.hparams.items():
        kind = value.WhichOneof("kind")
        if kind in ("number_value", "string_value"):
            out.config[name] = getattr(value, kind)
            out.hparams = True


def _text_config(out: _File, v, tensor_util) -> None:
    array = tensor_util.make_ndarray(v.tensor)
    if array.size != 1:
        return
    raw = array.reshape(()).item()
    try:
        tree = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
    except (ValueError, UnicodeDecodeError):
        return
    if isinstance(tree, dict):
        out.config.update(tree)


def _run(folder: Path, files: list[Path], name: str, opts: IngestOptions) -> scalars.TrackedRun:
    digest, size, notes = hashlib.sha256(), 0, []
    run = scalars.TrackedRun(key=name, name=name, sha256="", size=0,
                             config_from="TensorBoard hparams", notes=notes)
    float32 = False
    for i, f in enumerate(files):
        data = read_bytes(f, opts.max_bytes)
        digest.update(hashlib.sha256(data).digest())
        size += len(data)
        part = _read(f, opts, notes)
        run.config.update(part.config)
        run.duplicates += part.duplicates
        float32 = float32 or part.float32
        if part.hparams and not part.steps:
            continue
        if _hparams_metrics(part):  # add_hparams' metric_dict: the run's summary, not steps
            tags = sorted({k for row in part.steps.values() for k in row})
            notes.append(f"add_hparams' metric_dict ({', '.join(tags[:5])}) in {f.name} is a "
                         "summary of the run, not a logged step: not imported")
            continue
        if i and part.steps and run.steps:
            start = min(part.steps)
            notes.append(f"{f.name} starts again at step {start} (a resumed run)"
                         + scalars.splice_resumed(run.steps, part.steps))
            continue
        for step, values in part.steps.items():
            run.steps.setdefault(step, {}).update(values)
    if float32:
        notes.append("TensorBoard keeps scalars as 32-bit floats: values are rounded to about "
                     "7 significant digits")
    run.sha256, run.size = digest.hexdigest(), size
    return run


def _hparams_metrics(part: _File) -> bool:
    """Whether a file holds an hparams record and, as scalars, only the metrics it names at
    one step: what `SummaryWriter.add_hparams(hparams, metric_dict)` writes."""
    tags = {k for row in part.steps.values() for k in row}
    return part.hparams and len(part.steps) == 1 and bool(tags) and tags <= part.metric_tags


def parse_runs(path: Path, opts: IngestOptions) -> list[ParsedLog]:
    """Every TensorBoard run under `path` (an event file, a run folder, a folder of runs)."""
    if not path.exists():
        raise ConfigError(f"{path}: no such file or folder")
    folders = run_folders(path)
    if not folders:
        raise ConfigError(f"{path}: no events.out.tfevents.* file in it or below it")
    runs = {}
    for folder, files in folders.items():
        rel = folder.relative_to(path) if path.is_dir() else Path(folder.name)
        name = path.name if str(rel) == "." else str(rel)
        runs[folder] = _run(folder, files, name, opts)
    for folder, run in list(runs.items()):  # an hparams-only subfolder belongs to its parent
        parent = runs.get(folder.parent)
        if not run.steps and parent is not None and run.config:
            parent.config.update(run.config)
            parent.notes.extend(n for n in run.notes if n not in parent.notes)
            parent.sha256 = hashlib.sha256((parent.sha256 + run.sha256).encode()).hexdigest()
            del runs[folder]
    chosen = scalars.select_runs(path, list(runs.values()), opts)
    return [scalars.to_log(r, path, "tensorboard", opts) for r in chosen]
