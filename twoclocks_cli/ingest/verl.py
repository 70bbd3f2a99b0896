"""verl console logs: `step:N - key:value - ...` lines after a command-line and config header.

Lines may carry a Ray prefix (`(TaskRunner pid=1) `), ANSI colours or a tqdm bar before `step:`.
Values may be printed as `np.float64(0.5)`. Key names drift between versions (`timing/gen` →
`timing_s/gen`, `val/test_score/<src>` → `val-core/<src>/reward/mean@N`); see `mapping.VERL_KEYS`.
Before the first step line, prompts per step (`data.train_batch_size`), group size
(`actor_rollout_ref.rollout.n`) and lr (`actor_rollout_ref.actor.optim.lr`) are read from the
printed config dict (parsed with `ast.literal_eval`, which evaluates literals only) or, failing
that, from `key=value` overrides on the command line; with no lr there (a dict broken by
another process's output glued into its lines, or a NUL byte), the run's lr is the peak
`actor/lr` logged, with a note. Other Ray processes print into the middle of the driver's
multi-line config dict: a dict is gathered from the lines of the process that began it.
`Initial validation metrics: {...}` is the step-0 evaluation, `Final validation metrics: {...}`
the last step's (verl pprints them as a string: in quotes, or cut into quoted fragments over
several lines; their unrounded values replace the same keys' 3-decimal ones).
`key(1e-4):0.010` is a value printed in units of 1e-4. What the log cannot say exactly is left
out with a note: an lr printed as `0.000` (rounded away), a last line cut off mid-write (a file
still being written, or truncated: in a finished file, a last line without its newline is taken
when it parses and has every training key the other step lines have).
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from twoclocks_cli.core.limits import INT64_MAX
from twoclocks_cli.ingest import mapping
from twoclocks_cli.ingest.base import (
    IngestOptions,
    NoStepsError,
    ParsedLog,
    new_log,
    read_bytes,
    to_step,
)

_PREFIX = re.compile(r"^\((?:[\w.]+) pid=\d+(?:, ip=[\d.:a-fA-F]+)?\)\s?")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_STEP = re.compile(r"(?<![\w/.-])step:(\S*)(.*)$")
_NUMPY = re.compile(r"^(?:np\.|numpy\.)?(?:float|int|uint)\d*\((.*)\)$|^tensor\((.*)\)$")
_VAL_CORE = re.compile(r"^val-core/(.+)/(?:reward|acc)/mean@(\d+)$")
_VAL_OLD = re.compile(r"^(?:val/)?test_score/(.+)$")
_VAL_DICT = re.compile(r"(Initial|Final) validation metrics:\s*(\{.*\})\s*$", re.S)
# verl pprints an f-string: the dict arrives inside a string literal, `"Initial validation
# metrics: {...}"` on one line, or, when longer than pprint's width, cut into quoted fragments
# over several lines: `("Initial validation metrics: {'k': "` ... ` '0.5}')`
_VAL_QUOTED = re.compile(r"""^\s*(\(?)\s*(["'])(?:Initial|Final) validation metrics:""")
_MAX_VAL_LINES = 2_000
_SCALED = re.compile(r"^(.+)\(([0-9.]+(?:[eE][+-]?\d+)?)\)$")  # key(1e-4): units of 1e-4
_ROUNDED_ZERO = re.compile(r"^-?0\.0+$")  # 0.000: a value rounded away by the printer
_NUMPY_IN_DICT = re.compile(r"(?:np|numpy)\.\w+\(([^()]*)\)")
_LR_KEYS = ("actor/lr",)
# the log's own count of samples consumed (recipes with dynamic sampling / filtered groups use
# more than prompts x n per step); cumulative, or per step when it is not non-decreasing
_SAMPLES_KEYS = ("rollout/total_num_samples",)
_PARAMS = {  # run column -> (dotted config path, type)
    "batch_prompts": ("data.train_batch_size", int),
    "group_size": ("actor_rollout_ref.rollout.n", int),
    "lr": ("actor_rollout_ref.actor.optim.lr", float),
}
_MAX_CONFIG_CHARS = 4_000_000
_CRITIC = ("critic/vf_", "critic/values/", "critic/vpred")  # a value model's: PPO, not GRPO


def _clean(line: str) -> str:
    return _PREFIX.sub("", _ANSI.sub("", line))


def _split_prefix(line: str) -> tuple[str, str]:
    """(the Ray process prefix or '', the line without it and without ANSI codes)."""
    line = _ANSI.sub("", line)
    m = _PREFIX.match(line)
    return (m.group(0).strip(), line[m.end():]) if m else ("", line)


def _value(text: str) -> float:
    m = _NUMPY.match(text)
    if m:
        text = m.group(1) if m.group(1) is not None else m.group(2)
    return float(text)


def _parse_step_line(rest: str, rounded: set[str] | None = None) -> dict[str, float]:
    """`key:value - key:value` → {key: value}; ValueError names the first bad token.

    `key(1e-4):0.010` is read as key = 0.010 × 1e-4; keys printed as `0.000` are added to
    `rounded` (the caller decides whether zero is a value or a rounding)."""
    out: dict[str, float] = {}
    if not rest.strip():
        return out
    if not rest.startswith(" - "):
        raise ValueError(f"expected ' - ' after the step, got {rest[:40]!r}")
    for token in rest[3:].split(" - "):
        key, sep, val = token.strip().rpartition(":")
        if not sep or not key:
            raise ValueError(f"token {token.strip()[:60]!r} is not key:value")
        scale = 1.0
        m = _SCALED.match(key)
        if m:
            key, scale = m.group(1), float(m.group(2))
        try:
            out[key] = _value(val) * scale
        except ValueError:
            raise ValueError(f"{key!r} has value {val[:40]!r}, not a number") from None
        if rounded is not None and _ROUNDED_ZERO.match(val.strip()):
            rounded.add(key)
    return out


def _dig(tree, dotted: str):
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def _config_dicts(header: list[tuple[str, str, int]], broken: list[int]):
    """Each top-level `{...}` literal printed in the header (pprint spreads them over lines),
    gathered from the lines of the process that printed its first line: other processes' lines
    in between are skipped. The line number of each one that does not parse goes to `broken`
    (another process's output glued into one of its lines, a NUL byte)."""
    i = 0
    while i < len(header):
        prefix, first, number = header[i]
        if not first.lstrip().startswith("{'"):
            i += 1
            continue
        chunk, depth, size, j = [], 0, 0, i
        while j < len(header):
            who, text, _ = header[j]
            j += 1
            if who != prefix:
                continue
            chunk.append(text)
            size += len(text)
            depth += text.count("{") - text.count("}")
            if depth <= 0 or size > _MAX_CONFIG_CHARS:
                break
        try:
            tree = ast.literal_eval("\n".join(chunk).strip())
        except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
            tree = None
        if isinstance(tree, dict):
            yield tree
            i = j
        else:
            broken.append(number)
            i += 1


def _header_params(header: list[tuple[str, str, int]]) -> tuple[dict, dict, list[int]]:
    """Batch prompts, group size and lr stated before the first step line, with their source;
    and the lines of printed dicts that could not be read."""
    params, origin, broken = {}, {}, []
    for tree in _config_dicts(header, broken):
        for name, (dotted, kind) in _PARAMS.items():
            v = _dig(tree, dotted)
            if name not in params and isinstance(v, (int, float)) and not isinstance(v, bool):
                params[name], origin[name] = kind(v), f"log config ({dotted})"
    text = "\n".join(line for _, line, _ in header)
    for name, (dotted, kind) in _PARAMS.items():
        if name in params:
            continue
        pattern = r"(?<![\w.])\+?" + re.escape(dotted) + r"=['\"]?([0-9.eE+-]+)"
        m = re.search(pattern, text)
        if m:
            try:
                params[name], origin[name] = kind(float(m.group(1))), f"log command line ({dotted})"
            except ValueError:
                pass
    return params, origin, broken


def _eval_accuracy(record: dict[str, float]) -> float | None:
    """Held-out score: mean over sources of val-core mean@N (largest N), else val/test_score."""
    best: dict[str, tuple[int, float]] = {}
    for k, v in record.items():
        m = _VAL_CORE.match(k)
        if m and (m.group(1) not in best or int(m.group(2)) > best[m.group(1)][0]):
            best[m.group(1)] = (int(m.group(2)), v)
    vals = [v for _, v in best.values()]
    if not vals:
        vals = [v for k, v in record.items() if _VAL_OLD.match(k)]
    return sum(vals) / len(vals) if vals else None


def _validation_dict(text: str) -> dict[str, float]:
    """The numbers of an `Initial/Final validation metrics: {...}` dict (np.float64(x) -> x)."""
    try:
        tree = ast.literal_eval(_NUMPY_IN_DICT.sub(r"\1", text))
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return {}
    if not isinstance(tree, dict):
        return {}
    return {str(k): float(v) for k, v in tree.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}


class _QuotedValidation:
    """A validation dict printed as a string literal, gathered from the lines of the process
    that began it (other processes print in between)."""

    def __init__(self, prefix: str, number: int, first: str):
        self.prefix, self.number, self.parts = prefix, number, [first]

    def done(self) -> bool:
        return self.parts[-1].rstrip().endswith(")")

    def text(self) -> str | None:
        """The printed string, or None when the fragments do not form one literal."""
        try:
            value = ast.literal_eval("\n".join(self.parts).strip())
        except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
            return None
        return value if isinstance(value, str) else None


def _continues(text: str) -> bool:
    """A pprint continuation fragment: indented, a string literal, maybe the closing paren."""
    return bool(re.match(r"""^\s+(["']).*\1\)?\s*$""", text))


def _lines(text: str, log: ParsedLog, finished: bool):
    """(line number, segment, whether it is an unterminated last line) of every line. A last
    line without its newline may be cut off mid-write: while the file may still grow it is left
    out, with a note (it waits for its newline); in a finished file it is yielded, and the
    caller takes it only if it is whole."""
    lines = text.split("\n")
    last = lines.pop()  # "" when the file ends with a newline
    cut = bool(last.strip())
    if cut and not finished:
        _note_cut(log, len(lines) + 1, last, "")
    elif cut:
        lines.append(last)
    for number, raw in enumerate(lines, start=1):
        segments = raw.split("\r")  # tqdm redraws its bar with \r inside one line
        final = cut and finished and number == len(lines)
        for i, segment in enumerate(segments):
            yield number, segment, final and i == len(segments) - 1


def _note_cut(log: ParsedLog, number: int, text: str, why: str) -> None:
    log.notes.append(f"the file ends mid-line (line {number}, {_clean(text)[:40]!r}...)"
                     f"{why}: that line was not imported")


def parse(path: Path, opts: IngestOptions) -> ParsedLog:
    """Read a verl console log into a ParsedLog (a malformed step line is a bad line)."""
    data = read_bytes(path, opts.max_bytes)
    log = new_log(path, "verl", data)
    text = data.decode("utf-8", errors="replace")
    del data
    scan = _scan(text, log, opts)
    records, present = scan.records, scan.present
    if not records and not scan.initial and not scan.final:
        raise NoStepsError(
            f"{path}: no `step:N - key:value` line: the run logged no training step (did it "
            "crash before its first step?); nothing to import (--skip-bad skips such a file "
            "and imports the others)"
        )
    mapping.refuse_not_rl(path, present)
    before = _before_training(records, scan.initial)
    present.update(before)
    _add_validation(records, scan.final, present)
    _note_gaps(log, records, scan.rounded_lr)
    picks = _settings(log, scan.header, records, present, opts)
    if before and not log.step_offset:  # step 0 is before any update: the evaluation's step
        row = next((r for s, r in records if s == 0), None)
        if row is None:
            records.insert(0, (0, before))
        else:
            row.update(before)
        before = {}
    _logged_samples(log, records, present, opts)
    _store(log, records, before, picks, present)
    return log


@dataclass
class _Scan:
    """What one pass over a log's lines found: the lines before the first step, each step
    line's values, every key logged, the validation dicts."""

    header: list[tuple[str, str, int]] = field(default_factory=list)
    records: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    present: set[str] = field(default_factory=set)
    initial: dict[str, float] = field(default_factory=dict)
    final: dict[str, float] = field(default_factory=dict)
    rounded_lr: int = 0  # lr values printed as 0.000 (left out)
    common: set[str] | None = None  # the training keys every step line so far logged

    def validation(self, log: ParsedLog, printed: str, number: int) -> None:
        """Keep the `Initial`/`Final validation metrics` dict printed at line `number`."""
        v = _VAL_DICT.search(printed)
        got = _validation_dict(v.group(2)) if v else {}
        if not got and not (v and v.group(2).strip() == "{}"):
            log.notes.append(f"line {number}: validation metrics that could not be read (cut "
                             "off, or broken by other output): not imported")
        elif v:
            (self.initial if v.group(1) == "Initial" else self.final).update(got)


def _scan(text: str, log: ParsedLog, opts: IngestOptions) -> _Scan:
    """One pass over the log's lines (a quoted validation dict may span several of them)."""
    known = {c for cands in mapping.VERL_KEYS.values() for c in cands} | set(
        opts.column_map.values()) | set(_SAMPLES_KEYS)
    scan = _Scan()
    pending: _QuotedValidation | None = None
    for number, segment, unterminated in _lines(text, log, opts.finished):
        prefix, line = _split_prefix(segment)
        if pending is not None and prefix == pending.prefix:
            if _continues(line) and len(pending.parts) < _MAX_VAL_LINES:
                pending.parts.append(line)
                if pending.done():
                    scan.validation(log, pending.text() or "", pending.number)
                    pending = None
                continue
            scan.validation(log, pending.text() or "", pending.number)  # cut short: a note
            pending = None
        q = _VAL_QUOTED.match(line)
        if q:
            pending = _QuotedValidation(prefix, number, line)
            if not q.group(1) or pending.done():  # one line: `"Initial ...: {...}"`
                scan.validation(log, pending.text() or "", number)
                pending = None
            continue
        if _VAL_DICT.search(line):
            scan.validation(log, line, number)
            continue
        m = _STEP.search(line)
        if m is None or not (m.group(2).startswith(" - ")
                             or (m.group(1).isdigit() and not m.group(2).strip())):
            if not scan.records and line:
                scan.header.append((prefix, line, number))
            continue
        _step_line(scan, log, m, (number, segment, unterminated), known)
    if pending is not None:
        scan.validation(log, pending.text() or "", pending.number)
    return scan


def _step_line(scan: _Scan, log: ParsedLog, m: re.Match, where: tuple[int, str, bool],
               known: set[str]) -> None:
    """Add step line `m` (at `where`: its number, text, whether its newline is missing) to the
    scan: a malformed one is a bad line, one cut off mid-write a note."""
    number, segment, unterminated = where
    rounded: set[str] = set()
    try:
        step = to_step(m.group(1))
        values = _parse_step_line(m.group(2), rounded)
    except ValueError as exc:
        if unterminated:  # a step line cut off mid-write, not a malformed one
            _note_cut(log, number, segment, "")
        else:
            log.bad(number, f"malformed step line: {exc}")
        return
    train = {k for k in values if not _is_eval(k)}
    if unterminated and scan.common and not scan.common <= train:
        lacks = sorted(scan.common - train)
        _note_cut(log, number, segment, f", without {', '.join(lacks[:3])}"
                  + (f" and {len(lacks) - 3} more" if len(lacks) > 3 else "")
                  + " that every other step line has")
        return
    if train:
        scan.common = train if scan.common is None else scan.common & train
    for key in rounded & set(_LR_KEYS):  # an lr of 0.000 is a rounding, not a value
        values.pop(key)
        scan.rounded_lr += 1
    scan.present.update(values)
    scan.records.append((step, {k: v for k, v in values.items()  # keep only what can map
                                if k in known or k.startswith(("val", "test_score"))}))


def _settings(log: ParsedLog, header: list, records: list, present: set[str],
              opts: IngestOptions) -> dict[str, str]:
    """The run's settings from the printed config and the logged lr, and which logged key
    each store name is read from (returned)."""
    params, origin, broken = _header_params(header)
    _default_group_size(header, params, origin, log, present)
    log.params.update(params)
    log.params_from.update(origin)
    picks = mapping.choose_sources(present, mapping.VERL_KEYS, opts.column_map)
    _logged_lr(log, records, picks.get("lr"), broken)
    if broken and not {"batch_prompts", "group_size"} <= set(params):
        log.batch_hint = (f"the printed config dict (line {broken[0]}) could not be read "
                          "(another process's output inside it, or a NUL byte)")
    _first_update_at_zero(log, records, picks)
    return picks


def _store(log: ParsedLog, records: list, before: dict[str, float], picks: dict[str, str],
           present: set[str]) -> None:
    """Put every step's values into `log` under store names; `before` (an evaluation before
    training that has no step of its own) at step 0."""
    evals = set()

    def store_names(values: dict[str, float]) -> dict[str, float]:
        mapped = mapping.apply(values, picks)
        if "eval_accuracy" not in picks and (acc := _eval_accuracy(values)) is not None:
            mapped["eval_accuracy"] = acc
            evals.update(k for k in values if _VAL_CORE.match(k) or _VAL_OLD.match(k))
        return mapped

    at_start = store_names(before)
    if at_start:  # old verl: step 0 is also the first update, one batch in
        log.put(0, at_start)
        log.samples_at.update({(0, k): 0 for k in at_start})
        log.notes.append(f"the evaluation before training ({', '.join(sorted(at_start))}) is "
                         "stored at step 0 with samples 0; step 0's update at one batch")
    for step, values in records:
        mapped = store_names(values)
        if step == 0 and at_start:
            lost = sorted(k for k in mapped if k in at_start)
            for k in lost:
                del mapped[k]
            if lost:
                log.notes.append(f"step 0's {', '.join(lost)} after its update was not stored: "
                                 "the store keeps one value per step and key, and step 0's is "
                                 "the evaluation before training")
        log.put(step, mapped)
    if evals:
        picks = {**picks, "eval_accuracy": "val-core/<source>/reward/mean@N or val/test_score"}
    log.sources = {**picks, **log.sources}
    log.unmapped = mapping.unmapped(present, picks, ignore=evals)


def _is_eval(key: str) -> bool:
    return key.startswith(("val", "test_score"))


def _before_training(records, initial: dict) -> dict[str, float]:
    """The evaluation before any update: the `Initial validation metrics` dict and the step-0
    lines of evaluation keys only that come before the first training line (taken out of
    `records`). The dict's unrounded values replace the same keys' 3-decimal ones."""
    first_train = next((i for i, (_, r) in enumerate(records)
                        if any(not _is_eval(k) for k in r)), len(records))
    before: dict[str, float] = {}
    for i in reversed(range(first_train)):
        step, row = records[i]
        if step == 0 and row and all(_is_eval(k) for k in row):
            before = {**row, **before}
            del records[i]
    return {**before, **initial}


def _add_validation(records, final: dict, present: set) -> None:
    """The final evaluation at the last step. When that step's own line logged the same keys,
    it is the same evaluation printed to 3 decimals: the dict's unrounded value replaces it (a
    value is never counted twice)."""
    if final:
        step = max((s for s, _ in records), default=0)
        row = next((r for s, r in records if s == step), None)
        if row is None:
            records.append((step, dict(final)))
        else:
            row.update(final)
        present.update(final)
    records.sort(key=lambda sr: sr[0])


def _note_gaps(log: ParsedLog, records, rounded_lr: int) -> None:
    """Notes on what this log cannot tell: a late first step (a resumed run), rounded lrs."""
    train = sorted(s for s, r in records if s > 0 and any(not k.startswith(("val", "test_score"))
                                                            for k in r))
    if train and train[0] > 1:
        log.notes.append(
            f"the log's first training step is {train[0]}: a resumed run? the steps before it "
            "are not in this file, so this run's first point is not its start"
        )
        log.caveats.append(log.notes[-1])
    if rounded_lr:
        log.notes.append(
            f"actor/lr printed as 0.000 at {rounded_lr} step(s) (rounded away by the printer): "
            "those lr values were not imported; the run's lr comes from the config or --lr"
        )


def _default_group_size(header, params: dict, origin: dict, log: ParsedLog,
                        present: set[str]) -> None:
    """A log that never states rollout.n ran with verl's default n = 1 (old PPO logs) — unless
    it is GRPO, which needs n > 1, or it has no config at all (W&B's output.log never holds
    it) and its step lines log no critic (so it is not PPO): then the group size stays unknown
    and the import asks for --group-size."""
    if "group_size" in params:
        return
    text = "\n".join(line for _, line, _ in header)
    if re.search(r"adv_estimator[\"':= ]+['\"]?grpo", text):
        return
    if not params and not any(k.startswith(_CRITIC) for k in present):
        log.batch_hint = ("the log holds no verl config (a W&B output.log never does) and its "
                          "step lines log no critic, so it is not PPO and verl's default n = 1 "
                          "cannot be assumed")
        return
    params["group_size"], origin["group_size"] = 1, "verl default (rollout.n not in the log)"
    log.notes.append("actor_rollout_ref.rollout.n is not in the log: verl's default n = 1 "
                     "(one completion per prompt, PPO) is used; --group-size sets it")


def _logged_lr(log: ParsedLog, records, key: str | None, broken: list[int]) -> None:
    """Without an lr in the config or on the command line, the run's lr is the peak lr it
    logged (after warm-up; before any decay), with a note saying why."""
    if "lr" in log.params or key is None:
        return
    lrs = [r[key] for _, r in records if key in r and math.isfinite(r[key]) and r[key] > 0]
    if not lrs:
        return
    log.params["lr"] = max(lrs)
    log.params_from["lr"] = f"log (peak {key} logged)"
    dotted = _PARAMS["lr"][0]
    why = (f"the printed config dict (line {broken[0]}) could not be read (another process's "
           f"output inside it, or a NUL byte), so {dotted} is not known" if broken else
           f"{dotted} is in neither the printed config nor the command line")
    log.notes.append(f"lr = {max(lrs):.3g}, the peak {key} logged: {why}; --lr sets the "
                     "configured lr")


def _logged_samples(log: ParsedLog, records, present: set, opts: IngestOptions) -> None:
    """The samples axis from the log's own count (`rollout/total_num_samples`): it wins over
    step x prompts x n. Non-decreasing values are a running total; otherwise they are per-step
    counts, summed (from the file's first step: a resumed log's earlier steps are missing). A
    count below one batch per step (a recipe counting prompts) is not used, with a note."""
    key = next((k for k in _SAMPLES_KEYS if k in present), None)
    if key is None:
        return
    counted = [(step, values.pop(key)) for step, values in records if key in values]
    counted = [(step, v) for step, v in counted if v == v and v >= 0]
    if not counted:
        return
    params = {**log.params, **{k: v for k in ("batch_prompts", "group_size")
                               if (v := getattr(opts, k)) is not None}}
    running = _is_running_total(counted, params)
    totals, total = {}, 0.0
    for step, v in counted:
        total = v if running else total + v
        totals[step] = to_step(round(total), limit=INT64_MAX)
    present.discard(key)
    how = "a running total" if running else "per-step counts, summed"
    short = _below_batch(totals, running, _batch(params), log.step_offset)
    if short is not None:
        step, v, least = short
        log.notes.append(f"the log's {key} ({how}) is {v:,} at step {step}, below the "
                         f"{least:,} samples step x prompts x n gives: it counts prompts, not "
                         "completions; samples = step x prompts x n")
        return
    log.samples.update(totals)
    log.sources = {**log.sources, "samples": key}
    log.notes.append(f"samples from the log's {key} ({how}), not step x prompts x n")


def _below_batch(totals: dict[int, int], running: bool, batch: float | None,
                 offset: int) -> tuple[int, int, int] | None:
    """The first (step, count, least) where a logged sample count is below one batch per step
    counted (from step 0 for a running total, from the file's first step for summed per-step
    counts): every update consumes a whole batch, so such a count is not of completions."""
    if batch is None or not totals:
        return None
    first = min(totals)
    for step, v in sorted(totals.items()):
        least = int((step + offset if running else step - first + 1) * batch)
        if v < least:
            return step, v, least
    return None


def _is_running_total(counted: list[tuple[int, float]], params: dict) -> bool:
    """Whether logged sample counts are a running total rather than per-step counts: a total
    increases at every step and, with the batch P x n known, by at least half a batch per step
    (per-step counts hover around one batch)."""
    pairs = list(zip(counted, counted[1:], strict=False))
    if not pairs or not all(b > a for (_, a), (_, b) in pairs):
        return len(counted) == 1 and counted[0][0] > 1 and _batch(params) is not None and \
            counted[0][1] >= 1.5 * _batch(params)
    batch = _batch(params)
    (s0, v0), (s1, v1) = counted[0], counted[-1]
    return batch is None or v1 - v0 >= 0.5 * batch * (s1 - s0)


def _batch(params: dict) -> float | None:
    p, n = params.get("batch_prompts"), params.get("group_size")
    return float(p) * float(n) if p and n else None


def _first_update_at_zero(log: ParsedLog, records, picks: dict) -> None:
    """Old verl logged its first update as step 0: samples then lag one batch unless shifted."""
    reward = picks.get("reward_mean")
    if reward and any(s == 0 and reward in r for s, r in records):
        log.step_offset = 1
        log.notes.append("the first update is logged as step 0 (old verl): samples = (step + 1) "
                         "x prompts x n")
