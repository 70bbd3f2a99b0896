"""TRL `trainer_state.json`: the `log_history` list, older and newer GRPO key names.

Older TRL logs `reward`, `rewards/<fn>`, `completion_length`, `kl`; newer TRL logs
`rewards/<fn>/mean`, `completions/mean_length`, `clip_ratio/*`, `entropy`. Eval entries use the
same names with an `eval_` prefix. The file never states prompts per step or group size reliably
(`train_batch_size` is per device), so those come from options; lr defaults to the peak
`learning_rate` logged.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.ingest import mapping
from twoclocks_cli.ingest.base import (
    IngestOptions,
    ParsedLog,
    decode_text,
    new_log,
    read_bytes,
    to_number,
    to_step,
)

_DECODER = json.JSONDecoder()
_REWARD_FN = re.compile(r"^(eval_)?rewards/([^/]+?)(/mean)?$")
_ACCURACY_HINT = re.compile(r"acc|correct", re.I)
_NOT_METRICS = {"step", "epoch"}
# keys only a preference (DPO-style) trainer logs, and keys every RL (GRPO/PPO) trainer logs
_PREFERENCE = {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
               "logps/chosen", "logps/rejected"}
_RL = {"reward", "reward_std", "frac_reward_zero_std", "completion_length",
       "completions/mean_length", "kl", "clip_ratio", "clip_ratio/region_mean"}


def _refuse_other_trainers(path: Path, present: set[str]) -> None:
    """A DPO or SFT trainer_state.json is not an RL run: its 'accuracy' is not a progress clock."""
    if present & _RL or any(_REWARD_FN.match(k) for k in present - _PREFERENCE):
        return
    pref = sorted(present & _PREFERENCE)
    if pref:
        raise ConfigError(
            f"{path}: a preference-training (DPO-style) trainer_state.json ({', '.join(pref[:3])}"
            "): rewards/accuracies is preference accuracy, not a verifiable reward; only RL "
            "runs (GRPO, PPO) have the two clocks; nothing imported"
        )
    if present:
        shown = ", ".join(sorted(present)[:6])
        raise ConfigError(
            f"{path}: no reward was logged (keys: {shown}): an SFT or other non-RL "
            "trainer_state.json? only RL runs (GRPO, PPO) have the two clocks; nothing imported "
            "(--map names a reward column if there is one)"
        )


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _array_item_offsets(text: str, key: str) -> list[int]:
    """Character offsets of the items of top-level array member `key` (for line numbers)."""
    pos = _skip_ws(text, 0)
    if not text.startswith("{", pos):
        return []
    pos = _skip_ws(text, pos + 1)
    while pos < len(text) and text[pos] != "}":
        name, pos = _DECODER.raw_decode(text, pos)
        pos = _skip_ws(text, pos) + 1  # the ':'
        pos = _skip_ws(text, pos)
        if name == key and text.startswith("[", pos):
            offsets, pos = [], _skip_ws(text, pos + 1)
            while pos < len(text) and text[pos] != "]":
                offsets.append(pos)
                _, pos = _DECODER.raw_decode(text, pos)
                pos = _skip_ws(text, pos)
                if text.startswith(",", pos):
                    pos = _skip_ws(text, pos + 1)
            return offsets
        _, pos = _DECODER.raw_decode(text, pos)
        pos = _skip_ws(text, pos)
        if text.startswith(",", pos):
            pos = _skip_ws(text, pos + 1)
    return []


def reward_pick(keys: set[str], eval_: bool) -> str | None:
    """The per-function reward that is the accuracy: named acc*/correct*, or the only one."""
    fns: dict[str, str] = {}
    for k in sorted(keys):
        m = _REWARD_FN.match(k)
        if m and bool(m.group(1)) == eval_:
            if m.group(3) or m.group(2) not in fns:  # prefer the /mean form
                fns[m.group(2)] = k
    named = [fn for fn in fns if _ACCURACY_HINT.search(fn)]
    if len(named) == 1:
        return fns[named[0]]
    if len(fns) == 1:
        return next(iter(fns.values()))
    return None


def parse(path: Path, opts: IngestOptions) -> ParsedLog:
    """Read a trainer_state.json (or a checkpoint folder holding one) into a ParsedLog."""
    if path.is_dir() and (path / "trainer_state.json").is_file():
        path = path / "trainer_state.json"
    data = read_bytes(path, opts.max_bytes)
    log = new_log(path, "trl", data)
    text = decode_text(path, data)
    state = _state(path, text)
    offsets = _array_item_offsets(text, "log_history")
    history = state["log_history"]
    lines = [text.count("\n", 0, off) + 1 for off in offsets]
    if len(lines) != len(history):
        lines, offsets = [0] * len(history), [0] * len(history)
    records, present = _records(history, lines, log)
    if not opts.column_map:
        _refuse_other_trainers(path, present)
    per_device = state.get("train_batch_size")
    log.batch_hint = (
        "trainer_state.json's train_batch_size"
        + (f" ({per_device})" if isinstance(per_device, int) else "")
        + " counts completions per device and step, not prompts: prompts per step = "
        "per-device batch x processes x gradient accumulation / num_generations (GRPOConfig)"
    )
    picks = mapping.choose_sources(present, mapping.TRL_KEYS, opts.column_map)
    for target, eval_ in (("accuracy", False), ("eval_accuracy", True)):
        if target not in picks and (src := reward_pick(present, eval_)):
            picks[target] = src
    wanted = set(picks.values())
    for i, step, numbers, others in records:
        wrong = sorted(k for k in others if k in wanted)
        if wrong:
            k = wrong[0]
            where = _key_line(text, lines[i], offsets[i], k) if lines[i] else f"log_history[{i}]"
            log.bad(where, f"step {step}: {k!r} is {others[k]!r}, not a number")
            continue
        log.put(step, mapping.apply(numbers, picks))
    log.sources = picks
    log.unmapped = mapping.unmapped(present, picks)
    _peak_lr(log, opts)
    return log


def _state(path: Path, text: str) -> dict:
    """The trainer_state.json document, refused in one line unless it holds a log_history."""
    try:
        state = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}:{exc.lineno}: invalid JSON ({exc.msg}, column {exc.colno})"
        ) from None
    except RecursionError:
        raise ConfigError(f"{path}: JSON nested too deeply") from None
    if not isinstance(state, dict) or not isinstance(state.get("log_history"), list):
        raise ConfigError(f"{path}: no 'log_history' list; is this a TRL trainer_state.json?")
    return state


def _key_line(text: str, line: int, offset: int, key: str) -> int:
    """The line of `key` inside the entry at `offset` (where the user must look), else the
    entry's `line`."""
    at = text.find(json.dumps(key) + ":", offset)
    return text.count("\n", 0, at) + 1 if at >= 0 else line


def _records(history: list, lines: list[int], log: ParsedLog
             ) -> tuple[list[tuple[int, int, dict[str, float], dict]], set[str]]:
    """(entry index, step, numbers, other values) of each usable log_history entry, and every
    numeric key logged; an unusable entry is a bad line of `log`."""
    records: list[tuple[int, int, dict[str, float], dict]] = []
    present: set[str] = set()
    for i, (entry, line) in enumerate(zip(history, lines, strict=True)):
        where = line or f"log_history[{i}]"
        if not isinstance(entry, dict):
            log.bad(where, f"log_history[{i}] is not an object")
            continue
        if "step" not in entry:
            log.bad(where, f"log_history[{i}] has no 'step'")
            continue
        try:
            step = to_step(entry["step"])
        except ValueError as exc:
            log.bad(where, f"log_history[{i}]: {exc}")
            continue
        split = _split_entry(entry, i, where, log)
        if split is None:
            continue
        present.update(split[0])
        records.append((i, step, *split))
    return records, present


def _split_entry(entry: dict, i: int, where, log: ParsedLog) -> tuple[dict, dict] | None:
    """(numbers, other non-null values) of log_history entry `i`; None (a bad line) when a
    number is beyond a float."""
    numbers, others = {}, {}
    for k, v in entry.items():
        if k in _NOT_METRICS:
            continue
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            try:
                numbers[k] = to_number(v)
            except ValueError as exc:  # 10**400: beyond a float
                log.bad(where, f"log_history[{i}] {k!r}: {exc}")
                return None
        elif v is not None:
            others[k] = v
    return numbers, others


def _peak_lr(log: ParsedLog, opts: IngestOptions) -> None:
    """Without --lr, the run's lr is the peak learning_rate logged (said in a note)."""
    lrs = [v["lr"] for v in log.steps.values() if "lr" in v]
    if opts.lr is None and lrs:
        log.params["lr"] = max(lrs)
        log.params_from["lr"] = "log (peak learning_rate)"
        log.notes.append(
            f"lr = {max(lrs):.3g}, the peak learning_rate logged: the configured lr (before "
            "warm-up and decay) is not in trainer_state.json; pass --lr to set it"
        )
