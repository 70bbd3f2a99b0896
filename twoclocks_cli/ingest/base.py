"""What every foreign-format parser shares: the options, the parsed log, safe reading, numbers.

Parsers only read text (json / csv / plain lines); nothing is executed or unpickled. A file over
`max_bytes` is refused before it is read.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.core.limits import INT32_MAX, INT64_MAX
from twoclocks_cli.core.numbers import short

FORMATS = ("trl", "verl", "csv", "jsonl", "wandb", "wandb-csv", "mlflow", "tensorboard")
# formats whose one source (a folder, a store, a panel export) holds several runs
MULTI_RUN = ("wandb", "wandb-csv", "mlflow", "tensorboard")
DEFAULT_MAX_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class IngestOptions:
    """How to import: one value per CLI option of `twoclocks ingest`."""

    fmt: str | None = None  # one of FORMATS; None: each file's format is told from its content
    sweep: str = "imported"  # sweep the runs join (created when missing)
    batch_prompts: int | None = None  # prompts per step, when the log does not state it
    group_size: int | None = None  # completions per prompt, when the log does not state it
    lr: float | None = None  # the run's lr column, when the log does not state it
    seed: int | None = None  # the run's seed column (logs rarely state it)
    column_map: dict[str, str] = field(default_factory=dict)  # store key -> source column
    skip_bad: bool = False  # skip malformed lines instead of refusing the file
    max_bytes: int = DEFAULT_MAX_BYTES  # refuse larger files before reading them
    identity: str = "content"  # a run is identified by file "content" hash or by "path"
    runs: tuple[str, ...] = ()  # multi-run sources: only runs whose name or id matches a glob
    experiments: tuple[str, ...] = ()  # MLflow: only these experiments (names or ids)
    mlflow_filter: str | None = None  # MLflow: a search_runs filter string
    # whether the file is finished (nothing writes it any more): then a last line without its
    # newline is taken when it parses whole; while it may still grow, such a line may be cut
    # off mid-write and waits for its newline (`--follow` and the live followers)
    finished: bool = False


@dataclass
class ParsedLog:
    """One file translated into store names: per-step values plus what the log says about itself."""

    path: Path
    fmt: str
    sha256: str
    size: int
    steps: dict[int, dict[str, float]] = field(default_factory=dict)  # step -> store key -> value
    samples: dict[int, int] = field(default_factory=dict)  # step -> samples, when logged
    # (step, key) -> samples of a value logged at another point than its step's others: the
    # evaluation before training, when old verl logs its first update as step 0 too
    samples_at: dict[tuple[int, str], int] = field(default_factory=dict)
    params: dict[str, float | int] = field(default_factory=dict)  # batch_prompts/group_size/lr
    params_from: dict[str, str] = field(default_factory=dict)  # param -> where it came from
    sources: dict[str, str] = field(default_factory=dict)  # store key -> source key used
    unmapped: set[str] = field(default_factory=set)  # numeric source keys with no store name
    bad_lines: list[tuple[int, str]] = field(default_factory=list)  # (line number, why)
    duplicates: int = 0  # (step, key) values logged more than once; the last one wins
    notes: list[str] = field(default_factory=list)  # what the parser left out or doubted, in words
    # notes `analyze` repeats beside the run's clocks (a resumed run's first point is not its
    # start), kept in the run's import record
    caveats: list[str] = field(default_factory=list)
    unfinished: str = ""  # why the log is not a finished run's (no exit record): "" when it is
    step_offset: int = 0  # samples = (step + offset) x batch (1: the first update is step 0)
    batch_hint: str = ""  # where this format keeps the batch size, for the "pass --batch-..." error
    fmt_from: str = "option"  # "option" (--format) or "detected: <what the content showed>"
    # one run of a multi-run source (a W&B panel's column group, an MLflow run, a TensorBoard
    # folder): its id within the source (part of the run's identity) and its name
    run_key: str = ""
    run_name: str = ""

    @property
    def where(self) -> str:
        """The file, and the run within it when it holds several: what messages name."""
        return f"{self.path} (run {self.run_name})" if self.run_name else str(self.path)

    def put(self, step: int, values: dict[str, float]) -> None:
        """Merge `values` into `step`, counting keys that were already there."""
        row = self.steps.setdefault(step, {})
        self.duplicates += sum(1 for k in values if k in row)
        row.update(values)

    def bad(self, line: int, why: str) -> None:
        self.bad_lines.append((line, why))


def read_bytes(path: Path, max_bytes: int) -> bytes:
    """The file's bytes, refusing missing files, directories and files over `max_bytes`."""
    if not path.exists():
        raise ConfigError(f"{path}: no such file")
    if not path.is_file():
        raise ConfigError(f"{path}: not a regular file")
    size = path.stat().st_size
    if size > max_bytes:
        raise ConfigError(
            f"{path}: {size:,} bytes is over the size limit of {max_bytes:,} bytes "
            f"(raise it with --max-bytes)"
        )
    data = path.read_bytes()
    if len(data) > max_bytes:  # grew while we looked
        raise ConfigError(f"{path}: over the size limit of {max_bytes:,} bytes")
    return data


def new_log(path: Path, fmt: str, data: bytes) -> ParsedLog:
    return ParsedLog(path=path, fmt=fmt, sha256=hashlib.sha256(data).hexdigest(), size=len(data))


def decode_text(path: Path, data: bytes) -> str:
    """UTF-8 text (a BOM is dropped); undecodable bytes are an error naming the offset."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte {exc.start})") from None


def to_number(value) -> float:
    """A logged value as a float: numbers, numeric strings ('nan', 'inf' included).

    Raises ValueError for anything else (lists, dicts, words).
    """
    try:
        if isinstance(value, bool):
            return float(value)
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            return float(value.strip())
    except OverflowError:  # an int beyond a float's range, e.g. 10**400
        raise ValueError(f"number {short(value, 40)} is out of a float's range") from None
    raise ValueError(f"not a number: {value!r}")


def to_step(value, limit: int = INT32_MAX) -> int:
    """A step index (or, with limit=INT64_MAX, a sample count): a non-negative integer
    (12, 12.0 or '12') the store's column holds; ValueError otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        v: float | int = value  # exact: no float rounding of a huge int
    else:
        v = to_number(value)
        if not math.isfinite(v) or v != int(v):
            raise ValueError(f"step must be a non-negative integer, got {short(value, 40)}")
    if v < 0:
        raise ValueError(f"step must be a non-negative integer, got {short(value, 40)}")
    if v > limit:
        raise ValueError(f"{short(value, 40)} is above {limit}, the most the store holds")
    return int(v)


class NoStepsError(ConfigError):
    """A file with no training step in it (a run that crashed before its first step, or a file
    that is not a training log): `--skip-bad` skips such a file in a multi-file import."""


def require_clean(log: ParsedLog, skip_bad: bool) -> None:
    """Refuse a file with malformed lines (naming the first) unless --skip-bad was given."""
    if log.bad_lines and not skip_bad:
        line, why = log.bad_lines[0]
        more = len(log.bad_lines) - 1
        extra = f" (and {more} more bad line{'s' if more != 1 else ''})" if more else ""
        raise ConfigError(
            f"{log.path}:{line}: {why}{extra}; nothing was written (--skip-bad imports the rest)"
        )


def flat_config(tree: Mapping, prefix: str = "") -> dict:
    """A nested config as {dotted key: value}; '/' separators (MLflow params) become '.'."""
    out = {}
    for k, v in tree.items():
        key = f"{prefix}{str(k).replace('/', '.')}"
        if isinstance(v, Mapping):
            out.update(flat_config(v, key + "."))
        else:
            out[key] = v
    return out


# a run's columns, whether given as options (--batch-prompts ...) or read from a source's config
RUN_BOUNDS = {"batch_prompts": (1, INT32_MAX), "group_size": (1, INT32_MAX), "seed": (0, INT32_MAX)}


def check_params(params: Mapping, where: str | None = None) -> None:
    """The run's batch, group size, seed and lr within what the store and the matching CLI
    option take, whether the options (`where` None) or the source's own config set them."""

    def label(name: str, v) -> str:
        option = f"--{name.replace('_', '-')}"
        return f"{option} {short(v, 40)}" if where is None else \
            f"{where}: {name} = {short(v, 40)}"

    for name, (low, high) in RUN_BOUNDS.items():
        v = params.get(name)
        if v is None:
            continue
        whole = isinstance(v, int) or (isinstance(v, float) and math.isfinite(v) and v == int(v))
        if isinstance(v, bool) or not whole or not low <= v <= high:
            raise ConfigError(f"{label(name, v)}: must be a whole number from {low} to "
                              f"{high:,} (as --{name.replace('_', '-')} takes)")
    lr = params.get("lr")
    if lr is not None and not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ConfigError(f"{label('lr', lr)}: must be a finite number > 0")
    p, g = params.get("batch_prompts"), params.get("group_size")
    if p is not None and g is not None and int(p) * int(g) > INT32_MAX:
        what = (f"--batch-prompts {int(p)} x --group-size {int(g)}" if where is None else
                f"{where}: batch_prompts {int(p)} x group_size {int(g)}")
        raise ConfigError(f"{what} = {int(p) * int(g):,} samples per step; the store holds at "
                          f"most {INT32_MAX:,}")


def check_axis(log: ParsedLog, samples: Mapping[int, int]) -> None:
    """Every step and sample count of a parsed run within the store's columns (a reader that
    took a step of 2^40 or a sample count beyond BIGINT is caught here, before any write)."""
    for step in log.steps:
        if not (isinstance(step, int) and 0 <= step <= INT32_MAX):
            raise ConfigError(f"{log.where}: step {short(step, 40)}: must be a whole number "
                              f"from 0 to {INT32_MAX:,}; nothing was written")
    for value in (*samples.values(), *log.samples_at.values()):
        if not (isinstance(value, int) and 0 <= value <= INT64_MAX):
            raise ConfigError(f"{log.where}: {short(value, 40)} samples: must be a whole number "
                              f"from 0 to {INT64_MAX:,}; nothing was written")
