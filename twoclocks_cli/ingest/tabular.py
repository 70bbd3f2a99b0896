"""Generic tables: CSV with a header row, or JSON Lines (one object per line).

Columns are matched to store keys by `--map KEY=COLUMN`, else by the store's own names, else by
the TRL and verl names in `mapping`, also under HF's tracker prefixes (a W&B history export's
`train/reward`, `eval/rewards/<fn>/mean`). The step column is `--map step=...` or the first of
`mapping.STEP_COLUMNS` (a W&B export's `train/global_step` before its `_step`); a `samples`
column (or `--map samples=...`) gives the samples axis, otherwise it is derived from the batch
size. Empty cells and nulls are missing values; a row with neither a step nor a metric (a W&B
row of another log call, e.g. a completions table) is no step. verl's
`val-core/<source>/reward/mean@N` columns give the held-out accuracy as verl's log reader takes
it; without a configured lr, the run's lr is the peak lr logged.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.core.limits import INT64_MAX
from twoclocks_cli.ingest import mapping, trl, verl
from twoclocks_cli.ingest.base import (
    IngestOptions,
    ParsedLog,
    decode_text,
    flat_config,
    new_log,
    read_bytes,
    to_number,
    to_step,
)

ALIASES: dict[str, tuple[str, ...]] = {
    key: (key,) + mapping.TRL_KEYS.get(key, ()) + mapping.VERL_KEYS.get(key, ())
    for key in mapping.STORE_KEYS
}

Row = tuple[int, dict]  # (line number, column -> raw value)


def _csv_rows(log: ParsedLog, text: str) -> tuple[list[Row], list[str]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise ConfigError(f"{log.path}: empty file, expected a CSV header row") from None
    except csv.Error as exc:
        raise ConfigError(f"{log.path}:1: unreadable CSV header ({exc})") from None
    header = [h.strip() for h in header]
    rows: list[Row] = []
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            log.bad(reader.line_num, f"unreadable CSV row ({exc})")
            continue
        if not cells or all(not c.strip() for c in cells):
            continue
        if len(cells) != len(header):
            log.bad(reader.line_num, f"expected {len(header)} fields, got {len(cells)}")
            continue
        rows.append((reader.line_num, dict(zip(header, cells, strict=True))))
    return rows, header


# A JSONL object without a step that states the run's setting (a `cfg` line, as many loggers
# write first): the last segment of each (dotted, nested) key -> the run column it gives.
_CONFIG_NAMES = {
    "prompts_per_batch": "batch_prompts", "batch_prompts": "batch_prompts",
    "data.train_batch_size": "batch_prompts",
    "group_size": "group_size", "num_generations": "group_size", "rollout.n": "group_size",
    "lr": "lr", "learning_rate": "lr", "seed": "seed",
}


_INTEGERS = ("batch_prompts", "group_size", "seed")


def _config_number(value) -> float | int | None:
    """A config value as a number: a JSON number, or a numeric string (`"2e-06"`, `"3"`) as
    some config dumps write them; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            pass
        try:
            return float(text)
        except ValueError:
            return None
    return value


def _config_params(record: dict) -> tuple[dict[str, tuple[float, str]], dict[str, tuple]]:
    """{run column: (value, source key)} stated by a config-like object, and {run column:
    (value, source key)} of the settings it gives as something other than a number."""
    out, unread = {}, {}
    for key, raw in flat_config(record).items():
        column = next((c for name, c in _CONFIG_NAMES.items()
                       if key == name or key.endswith("." + name)), None)
        if column is None or column in out:
            continue
        v = _config_number(raw)
        if v is None:
            if raw is not None and column not in unread:
                unread[column] = (raw, key)
            continue
        if column in _INTEGERS and isinstance(v, float) and v.is_integer():
            v = int(v)
        out[column] = (v, key)
    return out, {c: u for c, u in unread.items() if c not in out}


def cut_last_line(log: ParsedLog, text: str, whole=None) -> str:
    """`text` without a last line that has no newline (cut off mid-write: a file still being
    written, or truncated), with a note; a cut line must never be stored as a shorter value.
    `whole(line)` says whether such a line is complete after all (a finished file's last JSON
    object): then it is kept."""
    head, sep, last = text.rpartition("\n")
    if not last.strip() or not sep or (whole is not None and whole(last)):
        return text
    log.notes.append(f"the file ends mid-line (line {head.count(chr(10)) + 2}, {last[:40]!r}...): "
                     "that line was not imported")
    return head + "\n"


def _parses(line: str) -> bool:
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return False
    return True


def _jsonl_rows(log: ParsedLog, text: str, finished: bool) -> tuple[list[Row], list[str]]:
    """JSON objects, one a line. A finished file's last line without its newline is taken
    when it is a whole JSON value (an object cut off mid-write never parses)."""
    rows: list[Row] = []
    columns: dict[str, None] = {}
    text = cut_last_line(log, text, _parses if finished else None)
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            log.bad(number, f"invalid JSON ({exc.msg}, column {exc.colno})")
            continue
        except RecursionError:
            log.bad(number, "JSON nested too deeply")
            continue
        if not isinstance(record, dict):
            log.bad(number, f"expected a JSON object, got {type(record).__name__}")
            continue
        record = _flat_record(record)
        columns.update(dict.fromkeys(record))
        rows.append((number, record))
    return rows, list(columns)


def _flat_record(record: dict) -> dict:
    """A JSON Lines object with its nested objects' keys joined by '.' (so `--map` reaches
    them), but for verl's `file` logger's row, `{"step": N, "data": {...}}`: its `data` keys
    are the metrics under their own names."""
    out: dict = {}
    for key, value in record.items():
        if isinstance(value, dict) and value:
            inner = _flat_record(value)
            wrapped = key == "data" and "step" in record
            out.update({k if wrapped else f"{key}.{k}": v for k, v in inner.items()})
        else:
            out[key] = value
    return out


def _missing(raw) -> bool:
    return raw is None or (isinstance(raw, str) and raw.strip() == "")


def _translate(log: ParsedLog, rows: list[Row], columns: list[str], opts: IngestOptions) -> None:
    """Rows of raw cells → per-step store values, marking bad lines."""
    explicit = opts.column_map
    absent = [f"{k}={v}" for k, v in explicit.items() if v not in columns]
    if absent:
        raise ConfigError(
            f"{log.path}: --map {', '.join(absent)}: no such column "
            f"(columns: {', '.join(columns[:30])})"
        )
    # judged on the names as mapped: the columns, their console names, the store keys --map sets
    mapping.refuse_not_rl(log.path, columns, [k for k in explicit if k not in mapping.AXES])
    step_col = explicit.get("step") or next((c for c in mapping.STEP_COLUMNS if c in columns), None)
    if step_col is None:
        raise ConfigError(
            f"{log.path}: no step column (looked for {', '.join(mapping.STEP_COLUMNS)}; "
            f"columns: {', '.join(columns[:30])}); name it with --map step=COLUMN"
        )
    samples_col = explicit.get("samples") or (
        mapping.SAMPLES_COLUMN if mapping.SAMPLES_COLUMN in columns else None
    )
    picks = _picks([c for c in columns if c not in (step_col, samples_col)], explicit)
    evals = [] if "eval_accuracy" in picks else [
        c for c in columns if c not in picks.values() and c not in (step_col, samples_col)
        and (verl._VAL_CORE.match(c) or verl._VAL_OLD.match(c))]
    other, stepless, unread, settings = 0, 0, {}, set()
    for number, record in rows:
        if opts.fmt == "jsonl" and step_col not in record:  # a config or summary object
            other += 1
            params, not_numbers = _config_params(record)
            for column, (v, key) in params.items():
                if column not in log.params:
                    log.params[column] = v
                    log.params_from[column] = f"log line {number} ({key})"
                    settings.add(key)
            for column, (raw, key) in not_numbers.items():
                unread.setdefault(column, (raw, f"log line {number} ({key})"))
            continue
        if _missing(record.get(step_col)) and all(
                _missing(record.get(c)) for c in [*picks.values(), *evals, samples_col] if c):
            stepless += 1  # another log call's row (a W&B table, a summary): no step, no metric
            continue
        try:
            step = to_step(record.get(step_col))
        except (ValueError, TypeError):
            log.bad(number, f"{step_col!r} is {record.get(step_col)!r}, not a step number")
            continue
        values, bad = {}, None
        for col in [*picks.values(), *evals]:
            raw = record.get(col)
            if _missing(raw):
                continue
            try:
                values[col] = to_number(raw)
            except (ValueError, TypeError):
                bad = f"column {col!r} is {raw!r}, not a number"
                break
        if bad is None and samples_col and not _missing(record.get(samples_col)):
            try:
                log.samples[step] = to_step(record[samples_col], limit=INT64_MAX)
            except (ValueError, TypeError):
                bad = f"column {samples_col!r} is {record[samples_col]!r}, not a sample count"
        if bad:
            log.bad(number, bad)
            continue
        mapped = mapping.apply(values, picks)
        if (acc := verl._eval_accuracy({c: values[c] for c in evals if c in values})) is not None:
            mapped["eval_accuracy"] = acc
        log.put(step, mapped)
    if other:
        log.notes.append(f"{other} line(s) without {step_col!r} (config or summary objects) are "
                         "not steps: not imported as metrics"
                         + (f"; run settings read from them: {', '.join(sorted(log.params))}"
                            if log.params else ""))
    if stepless:
        log.notes.append(f"{stepless} row(s) with no {step_col!r} and no metric this tool reads "
                         "(rows of other log calls, such as a W&B completions table) are not "
                         "steps: not imported")
    unread = {c: u for c, u in unread.items() if c not in log.params}
    _note_unread(log, unread)
    if evals:
        picks = {**picks, "eval_accuracy": "val-core/<source>/reward/mean@N or val/test_score"}
    log.sources = {**picks, "step": step_col, **({"samples": samples_col} if samples_col else {})}
    log.unmapped = mapping.unmapped(columns, picks, ignore=(step_col, samples_col or "", *evals,
                                                            *settings))
    _peak_lr(log, unread.get("lr"))


def _note_unread(log: ParsedLog, unread: dict[str, tuple]) -> None:
    """Notes on the settings a config gives as something other than a number ({column: (value,
    where)}); an unread batch size also goes into the error that asks for it."""
    for column, (raw, where) in sorted(unread.items()):
        if column != "lr":  # said with the lr the run gets instead (_peak_lr)
            log.notes.append(f"{column} is {raw!r} at {where}, not a number: not read")
    batch = [f"{c} is {raw!r} at {where}, not a number" for c, (raw, where)
             in sorted(unread.items()) if c in ("batch_prompts", "group_size")]
    if batch:
        log.batch_hint = "; ".join(batch)


def _picks(columns: list[str], explicit: dict[str, str]) -> dict[str, str]:
    """store key -> column: --map's, else the first alias present under the column's own name
    or its console name (a raw name wins over another column's console name); the accuracy
    and held-out accuracy from TRL's per-function rewards, as trl's reader takes them."""
    names: dict[str, str] = {}  # console name -> column
    for column in columns:
        names.setdefault(mapping.console_name(column), column)
    names.update({c: c for c in columns})
    picks = mapping.choose_sources(names, ALIASES, explicit)
    for target, eval_ in (("accuracy", False), ("eval_accuracy", True)):
        if target not in picks and (src := trl.reward_pick(set(names), eval_)):
            picks[target] = src
    return {k: names.get(v, v) for k, v in picks.items()}


def _peak_lr(log: ParsedLog, unread: tuple | None) -> None:
    """Without a configured lr (a `cfg` line, --lr), the run's lr is the peak lr logged (after
    warm-up, before any decay), with a note; `unread`: the (value, where) of an lr the file
    gives as something other than a number."""
    stated = (f"the file's lr is {unread[0]!r} at {unread[1]}, not a number" if unread
              else "the file states no configured lr")
    lrs = [v["lr"] for v in log.steps.values() if v.get("lr", 0) > 0 and v["lr"] < float("inf")]
    if "lr" in log.params:
        return
    if not lrs:
        if unread:
            log.notes.append(f"{stated}: not read, and no lr is logged; --lr sets it")
        return
    log.params["lr"] = max(lrs)
    log.params_from["lr"] = f"log (peak {log.sources['lr']} logged)"
    log.notes.append(f"lr = {max(lrs):.3g}, the peak {log.sources['lr']} logged: {stated}; "
                     "--lr sets it")


def parse(path: Path, opts: IngestOptions) -> ParsedLog:
    """Read a CSV (fmt 'csv') or JSON Lines (fmt 'jsonl') file into a ParsedLog."""
    data = read_bytes(path, opts.max_bytes)
    log = new_log(path, opts.fmt, data)
    text = decode_text(path, data)
    if opts.fmt == "csv":
        # a row cut inside its last cell has every field and parses (0.957 cut to 0.9): a last
        # row without its newline is left out even from a finished file
        rows, columns = _csv_rows(log, cut_last_line(log, text))
    else:
        rows, columns = _jsonl_rows(log, text, opts.finished)
    _translate(log, rows, columns, opts)
    return log
