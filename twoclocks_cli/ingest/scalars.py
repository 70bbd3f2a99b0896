"""Runs as experiment trackers keep them (W&B, MLflow, TensorBoard): per-step scalars under the
trainer's own names and the run's config, translated into a ParsedLog with the TRL and verl name
maps the log importers use.

The trainers log to trackers under their console names, with a tracker's touches: HF/TRL's
callbacks prefix `train/` and `eval/` (`train/reward`, `eval/rewards/acc/mean`), verl's MLflow
logger writes `@` as `_at_` (`val-core/gsm8k/reward/mean_at_4`). Both are undone before the names
are looked up; the store keeps, per store key, the source key as the tracker has it. The run's
prompts per step, group size and lr come from its config where the tracker kept one (verl's
`data.train_batch_size`, `actor_rollout_ref.rollout.n`, `actor_rollout_ref.actor.optim.lr`; a
flat `prompts_per_batch` / `group_size` / `num_generations` / `lr` / `learning_rate` / `seed`),
else from the options, else (lr only) the peak lr logged, with a note. An OpenRLHF run (its
config's rollout keys, or keys only its loggers write) is read with its own names and config
keys (see openrlhf.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.ingest import mapping, openrlhf, tabular, trl, verl
from twoclocks_cli.ingest.base import (
    IngestOptions,
    NoStepsError,
    ParsedLog,
    flat_config,
    to_number,
)

# run column -> (the verl config path, then the flat names a config may use)
_PARAMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "batch_prompts": ((verl._PARAMS["batch_prompts"][0],), ("prompts_per_batch", "batch_prompts")),
    "group_size": ((verl._PARAMS["group_size"][0],), ("group_size", "num_generations")),
    "lr": ((verl._PARAMS["lr"][0],), ("lr", "learning_rate")),
    "seed": ((), ("seed",)),
}
_INTEGERS = ("batch_prompts", "group_size", "seed")
_AT = re.compile(r"_at_(\d+)$")  # verl's MLflow logger writes mean@4 as mean_at_4
REWARDS = ("reward_mean", "accuracy", "eval_accuracy")


@dataclass
class TrackedRun:
    """One run as its tracker keeps it, before any name is translated."""

    key: str  # the run's id within its source: part of its identity in the store
    name: str  # the name the tracker shows
    sha256: str  # of what was read for this run
    size: int  # bytes read for this run
    steps: dict[int, dict[str, float]] = field(default_factory=dict)  # step -> source key -> value
    config: dict = field(default_factory=dict)  # nested, or flat with '.' or '/' in its keys
    config_from: str = "config"  # what the config is, in words ("W&B config", "MLflow params")
    step_key: str = "step"  # the source key (or axis) the steps are
    duplicates: int = 0  # (step, key) values logged more than once; the last one wins
    notes: list[str] = field(default_factory=list)
    bad_lines: list[tuple[int, str]] = field(default_factory=list)  # (line, why): tables only
    unfinished: str = ""  # why the run did not end as a finished one ("" when it did)


def select_runs(source, runs: list[TrackedRun], opts: IngestOptions) -> list[TrackedRun]:
    """The runs `--run GLOB` names (all without it); none is an error. A glob is matched
    against the run's id, its name, and each '/'-separated tail of the name: an MLflow run's
    own name as well as `experiment/run`, a TensorBoard run's folder as well as its path."""
    from fnmatch import fnmatchcase

    if not runs:
        raise ConfigError(f"{source}: holds no run; nothing imported")
    if not opts.runs:
        return runs

    def aliases(r: TrackedRun) -> list[str]:
        parts = r.name.split("/")
        return [r.key, *("/".join(parts[i:]) for i in range(len(parts)))]

    chosen = [r for r in runs if any(fnmatchcase(n, g) for n in aliases(r) for g in opts.runs)]
    if not chosen:
        names = ", ".join(r.name for r in runs[:12])
        raise ConfigError(f"{source}: no run matches --run {' '.join(opts.runs)} "
                          f"(runs: {names})")
    return chosen


def normal_name(key: str) -> str:
    """A tracker's key as the trainer's console names it (see the module docstring)."""
    return _AT.sub(r"@\1", mapping.console_name(key))


def splice_resumed(steps: dict, later: dict) -> str:
    """Merge a resumed run's later part into `steps`: from the later part's first training step
    on, its rows replace the earlier part's (the resumed run redid them); the note's tail on
    what was replaced. Evaluation-only rows before that step (verl's `val_before_train` at the
    checkpoint's step) are added to the earlier rows, whose training values stay."""
    trained = [s for s, row in later.items() if any(not is_eval(k) for k in row)]
    start = min(trained) if trained else max(later) + 1
    dropped = [s for s in steps if s >= start]
    for s in dropped:
        del steps[s]
    for step, values in later.items():
        steps.setdefault(step, {}).update(values)
    return (f": {len(dropped)} earlier step(s) from {start} on replaced" if dropped else "")


def is_eval(key: str) -> bool:
    """Whether a tracker's key is an evaluation's (verl `val-*`/`test_score`, HF `eval/`)."""
    name = normal_name(key)
    return name.startswith(("val", "test_score", "eval_"))


def config_params(config: Mapping) -> tuple[dict, dict[str, str]]:
    """{run column: value} stated by a run's config, and the key each came from: the verl path
    first, then a flat name at the top, then a flat name ending a longer key when only one does
    (`critic.optim.lr` and `actor.optim.lr` together say nothing)."""
    flat = flat_config(config)
    params, origin = {}, {}
    for column, (exact, names) in _PARAMS.items():
        candidates = [k for k in exact if k in flat] + [k for k in names if k in flat]
        if not candidates:
            ends = [k for k in flat if any(k.endswith("." + n) for n in names)]
            candidates = ends if len(ends) == 1 else []
        for key in candidates:
            v = _number(flat[key])
            if v is not None:
                params[column] = int(v) if column in _INTEGERS and v == int(v) else v
                origin[column] = key
                break
    return params, origin


def _number(value) -> float | None:
    """A config value as a number (MLflow keeps params as strings), else None."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        v = to_number(value)
    except (ValueError, TypeError):
        return None
    return v if v == v and abs(v) != float("inf") else None


def _picks(run: TrackedRun, names: dict[str, str], opts: IngestOptions,
           orlhf: bool) -> dict[str, str]:
    """store key -> source key (as the tracker has it) for this run; an OpenRLHF run's own
    names first."""
    present = set(names.values()) | set(names)
    absent = sorted(f"{k}={v}" for k, v in opts.column_map.items()
                    if k not in mapping.AXES and v not in present)
    if absent:
        keys = sorted(set(names.values()))  # a key and its normalised name are one key
        more = f", ... {len(keys)} in all" if len(keys) > 30 else ""
        raise ConfigError(f"--map {', '.join(absent)}: run {run.name} has no such key "
                          f"(keys: {', '.join(keys[:30])}{more})")
    table = tabular.ALIASES
    if orlhf:
        table = {k: openrlhf.KEYS.get(k, ()) + table.get(k, ())
                 for k in dict.fromkeys([*openrlhf.KEYS, *table])}
    picks = mapping.choose_sources(names, table, {
        k: v for k, v in opts.column_map.items() if k != "samples"})
    for target, eval_ in (("accuracy", False), ("eval_accuracy", True)):
        if target not in picks and (src := trl.reward_pick(set(names), eval_)):
            picks[target] = src
    return {k: names.get(v, v) for k, v in picks.items()}


def _openrlhf_eval(log: ParsedLog, present: set[str], picks: dict[str, str]) -> None:
    """An OpenRLHF run's held-out accuracy: its one eval source's pass@1; with several, none
    (which one is the user's to say), with a note naming them."""
    keys = openrlhf.pass1_keys(present)
    if "eval_accuracy" in picks or not keys:
        return
    if len(keys) == 1:
        picks["eval_accuracy"] = keys[0]
        return
    log.notes.append(f"held-out accuracy not imported: {len(keys)} eval sources log a pass@1 "
                     f"({', '.join(keys[:6])}); --map eval_accuracy=KEY picks one")


def to_log(run: TrackedRun, path: Path, fmt: str, opts: IngestOptions) -> ParsedLog:
    """The ParsedLog of one tracked run: store names, its settings, notes on what was inferred."""
    log = ParsedLog(path=path, fmt=fmt, sha256=run.sha256, size=run.size, run_key=run.key,
                    run_name=run.name, duplicates=run.duplicates, notes=list(run.notes),
                    bad_lines=list(run.bad_lines), unfinished=run.unfinished)
    present = {k for row in run.steps.values() for k in row}
    if not present:  # a run that has not logged yet (--follow waits for its first step)
        raise NoStepsError(f"{log.where}: no step was logged: the run has no history yet (or "
                           "crashed before its first step); nothing to import")
    names: dict[str, str] = {}  # console name -> source key
    for key in sorted(present):
        names.setdefault(normal_name(key), key)
    mapping.refuse_not_rl(log.where, names)
    for key in present:  # a raw name wins over another key's normalised one
        names[key] = key
    orlhf = openrlhf.recognise(run.config, present)
    picks = _picks(run, names, opts, bool(orlhf))
    if orlhf:
        _openrlhf_eval(log, present, picks)
    samples_key = opts.column_map.get("samples")
    evals: set[str] = set()
    for step in sorted(run.steps):
        row = run.steps[step]
        values = mapping.apply(row, picks)
        if "eval_accuracy" not in picks:
            console = {normal_name(k): v for k, v in row.items()}
            if (acc := verl._eval_accuracy(console)) is not None:
                values["eval_accuracy"] = acc
                evals.update(k for k in row if verl._VAL_CORE.match(normal_name(k))
                             or verl._VAL_OLD.match(normal_name(k)))
        if samples_key and samples_key in row:
            log.samples[step] = _samples(log, step, row[samples_key])
        if values:
            log.steps[step] = values
    if evals:
        picks["eval_accuracy"] = "val-core/<source>/reward/mean@N or val/test_score"
    if not any(k in picks for k in REWARDS):
        shown = ", ".join(sorted(present)[:8]) or "none"
        raise ConfigError(
            f"{log.where}: no reward was logged (keys: {shown}): no reward_mean, accuracy or "
            "held-out accuracy under a TRL or verl name; only RL runs have the two clocks; "
            "nothing imported (--map reward_mean=KEY names the reward if it is there)")
    log.sources = {**picks, "step": run.step_key,
                   **({"samples": samples_key} if samples_key else {})}
    log.unmapped = mapping.unmapped(present, picks, ignore=evals | {samples_key or ""})
    _settings(log, run, orlhf)
    _note_resumed(log)
    return log


def _samples(log: ParsedLog, step: int, value: float) -> int:
    from twoclocks_cli.core.limits import INT64_MAX
    from twoclocks_cli.ingest.base import to_step

    try:
        return to_step(value, limit=INT64_MAX)
    except ValueError as exc:
        raise ConfigError(f"{log.where}: step {step}: samples {exc}") from None


def _settings(log: ParsedLog, run: TrackedRun, orlhf: str = "") -> None:
    """Prompts per step, group size, lr and seed from the run's config (an OpenRLHF run's own
    keys first); else the peak lr logged; and where the batch would be, for the "pass
    --batch-prompts" error."""
    params, origin = config_params(run.config)
    if orlhf:
        own, own_origin = openrlhf.params(run.config)
        params, origin = {**params, **own}, {**origin, **own_origin}
        log.notes.append(f"an OpenRLHF run ({orlhf}): one step is one rollout of "
                         "rollout_batch_size prompts x n_samples_per_prompt")
        if note := openrlhf.filtering_note(run.config):
            log.notes.append(note)
    flat = flat_config(run.config)
    if "batch_prompts" not in params and (trl_prompts := _trl_prompts(flat)) is not None:
        params["batch_prompts"], origin["batch_prompts"] = trl_prompts, "TRL's GRPOConfig"
        log.notes.append(f"prompts per step = {trl_prompts}: per_device_train_batch_size x "
                         "processes x gradient_accumulation_steps / num_iterations / "
                         "num_generations, processes = generation_batch_size / "
                         "(per_device_train_batch_size x steps_per_generation)")
    log.params.update(params)
    log.params_from.update({k: f"{run.config_from} ({v})" for k, v in origin.items()})
    lrs = [v["lr"] for v in log.steps.values() if "lr" in v and v["lr"] > 0]
    if "lr" not in params and lrs:
        log.params["lr"] = max(lrs)
        log.params_from["lr"] = f"log (peak {log.sources.get('lr')} logged)"
        log.notes.append(f"lr = {max(lrs):.3g}, the peak {log.sources.get('lr')} logged: the "
                         f"{run.config_from} holds no configured lr; --lr sets it")
    if orlhf:
        log.batch_hint = (f"the {run.config_from} holds no rollout_batch_size and "
                          "n_samples_per_prompt, an OpenRLHF run's --batch-prompts and "
                          "--group-size")
    elif "per_device_train_batch_size" in flat or "num_generations" in flat:
        log.batch_hint = ("a TRL run's config counts completions per device "
                          "(per_device_train_batch_size), not prompts: prompts per step = "
                          "per-device batch x processes x gradient accumulation / "
                          "num_generations")
    else:
        log.batch_hint = (f"the {run.config_from} states neither data.train_batch_size and "
                          "actor_rollout_ref.rollout.n (verl) nor prompts_per_batch and "
                          "group_size")


_TRL_BATCH = ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
              "generation_batch_size", "steps_per_generation")


def _trl_prompts(flat: Mapping) -> int | None:
    """Prompts per optimizer step of a TRL GRPOConfig, as its trainer counts them (see
    integrations/trl.py): the config has no world size, but its `generation_batch_size` is
    per-device batch x processes x steps_per_generation. None unless every term is there and
    divides exactly."""
    values = [_number(flat.get(k)) for k in _TRL_BATCH]
    iterations = _number(flat.get("num_iterations", 1))
    if any(v is None or v < 1 or v != int(v) for v in [*values, iterations]):
        return None
    per_device, accum, g, gen_batch, per_gen = (int(v) for v in values)
    processes, left = divmod(gen_batch, per_device * per_gen)
    completions = per_device * processes * accum
    if left or not processes or completions % int(iterations) or \
            (completions // int(iterations)) % g:
        return None
    return completions // int(iterations) // g


def _note_resumed(log: ParsedLog) -> None:
    """A first training step later than the logging interval: the start is not in the source
    (a resumed run, or one whose first steps were not kept)."""
    train = sorted(s for s, v in log.steps.items() if "reward_mean" in v or "accuracy" in v)
    if len(train) < 2:
        return
    every = min(b - a for a, b in zip(train, train[1:], strict=False))
    if train[0] > max(every, 1):
        log.notes.append(f"the first training step is {train[0]} (logged every {every}): a "
                         "resumed run? the steps before it are not in this source, so this "
                         "run's first point is not its start")
        log.caveats.append(log.notes[-1])
