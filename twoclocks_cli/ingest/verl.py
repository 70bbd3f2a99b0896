"""verl console logs: `step:N - key:value - ...` lines after a command-line and config header.

Lines may carry a Ray prefix (`(TaskRunner pid=1) `), ANSI colours or a tqdm bar before `step:`.
Values may be printed as `np.float64(0.5)`. Key names drift between versions (`timing/gen` →
`timing_s/gen`, `val/test_score/<src>` → `val-core/<src>/reward/mean@N`); see `mapping.VERL_KEYS`.
Before the first step line, prompts per step (`data.train_batch_size`), group size
(`actor_rollout_ref.rollout.n`) and lr (`actor_rollout_ref.actor.optim.lr`) are read from the
printed config dict (parsed with `ast.literal_eval`, which evaluates literals only) or, failing
that, from `key=value` overrides on the command line.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from twoclocks_cli.ingest import mapping
from twoclocks_cli.ingest.base import IngestOptions, ParsedLog, new_log, read_bytes, to_step

_PREFIX = re.compile(r"^\((?:[\w.]+) pid=\d+(?:, ip=[\d.:a-fA-F]+)?\)\s?")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_STEP = re.compile(r"(?<![\w/.-])step:(\S*)(.*)$")
_NUMPY = re.compile(r"^(?:np\.|numpy\.)?(?:float|int|uint)\d*\((.*)\)$|^tensor\((.*)\)$")
_VAL_CORE = re.compile(r"^val-core/(.+)/(?:reward|acc)/mean@(\d+)$")
_VAL_OLD = re.compile(r"^val/test_score/(.+)$")
_PARAMS = {  # run column -> (dotted config path, type)
    "batch_prompts": ("data.train_batch_size", int),
    "group_size": ("actor_rollout_ref.rollout.n", int),
    "lr": ("actor_rollout_ref.actor.optim.lr", float),
}
_MAX_CONFIG_CHARS = 4_000_000


def _clean(line: str) -> str:
    return _PREFIX.sub("", _ANSI.sub("", line))


def _value(text: str) -> float:
    m = _NUMPY.match(text)
    if m:
        text = m.group(1) if m.group(1) is not None else m.group(2)
    return float(text)


def _parse_step_line(rest: str) -> dict[str, float]:
    """`key:value - key:value` → {key: value}; ValueError names the first bad token."""
    out: dict[str, float] = {}
    if not rest.strip():
        return out
    if not rest.startswith(" - "):
        raise ValueError(f"expected ' - ' after the step, got {rest[:40]!r}")
    for token in rest[3:].split(" - "):
        key, sep, val = token.strip().rpartition(":")
        if not sep or not key:
            raise ValueError(f"token {token.strip()[:60]!r} is not key:value")
        try:
            out[key] = _value(val)
        except ValueError:
            raise ValueError(f"{key!r} has value {val[:40]!r}, not a number") from None
    return out


def _dig(tree, dotted: str):
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def _config_dicts(header: list[str]):
    """Each top-level `{...}` literal printed in the header (pprint spreads them over lines)."""
    i = 0
    while i < len(header):
        if header[i].lstrip().startswith("{'"):
            chunk, depth = [], 0
            for j in range(i, len(header)):
                chunk.append(header[j])
                depth += header[j].count("{") - header[j].count("}")
                if depth <= 0 or sum(map(len, chunk)) > _MAX_CONFIG_CHARS:
                    break
            try:
                tree = ast.literal_eval("\n".join(chunk).strip())
            except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
                tree = None
            if isinstance(tree, dict):
                yield tree
            i += len(chunk)
        else:
            i += 1


def _header_params(header: list[str]) -> tuple[dict, dict]:
    """Batch prompts, group size and lr stated before the first step line, with their source."""
    params, origin = {}, {}
    for tree in _config_dicts(header):
        for name, (dotted, kind) in _PARAMS.items():
            v = _dig(tree, dotted)
            if name not in params and isinstance(v, (int, float)) and not isinstance(v, bool):
                params[name], origin[name] = kind(v), f"log config ({dotted})"
    text = "\n".join(header)
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
    return params, origin


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


def parse(path: Path, opts: IngestOptions) -> ParsedLog:
    """Read a verl console log into a ParsedLog (a malformed step line is a bad line)."""
    data = read_bytes(path, opts.max_bytes)
    log = new_log(path, "verl", data)
    text = data.decode("utf-8", errors="replace")
    del data
    known = {c for cands in mapping.VERL_KEYS.values() for c in cands} | set(
        opts.column_map.values())
    header: list[str] = []
    records: list[tuple[int, dict[str, float]]] = []
    present: set[str] = set()
    for number, raw in enumerate(text.split("\n"), start=1):
        for segment in raw.split("\r"):  # tqdm redraws its bar with \r inside one line
            line = _clean(segment)
            m = _STEP.search(line)
            if m is None or not (m.group(2).startswith(" - ")
                                 or (m.group(1).isdigit() and not m.group(2).strip())):
                if not records and line:
                    header.append(line)
                continue
            try:
                step = to_step(m.group(1))
                values = _parse_step_line(m.group(2))
            except ValueError as exc:
                log.bad(number, f"malformed step line: {exc}")
                continue
            present.update(values)
            records.append((step, {k: v for k, v in values.items()  # keep only what can map
                                   if k in known or k.startswith("val")}))
    params, origin = _header_params(header)
    log.params.update(params)
    log.params_from.update(origin)
    picks = mapping.choose_sources(present, mapping.VERL_KEYS, opts.column_map)
    evals = set()
    for step, values in records:
        mapped = mapping.apply(values, picks)
        if "eval_accuracy" not in picks and (acc := _eval_accuracy(values)) is not None:
            mapped["eval_accuracy"] = acc
            evals.update(k for k in values if _VAL_CORE.match(k) or _VAL_OLD.match(k))
        log.put(step, mapped)
    if evals:
        picks = {**picks, "eval_accuracy": "val-core/<source>/reward/mean@N or val/test_score"}
    log.sources = picks
    log.unmapped = mapping.unmapped(present, picks, ignore=evals)
    return log
