"""Planning: expand a SweepConfig into resolved cells (lr by the scaling rule, steps, hashes).

A cell is the backend's config dict with the common keys (prompts_per_batch, group_size, lr,
clip_eps_low, clip_eps_high, seed, sample_budget) plus the trainer options (grpo: top level)
or a `sim` table (sim), or the `trl` / `command` table (trl, command; the trl table's
`python_path` made absolute). Its identity is the sha256 of its canonical JSON, so the same config
plans the same ids in every process.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twoclocks_cli.config.models import BatchRange, SweepConfig
from twoclocks_cli.core.errors import ConfigError, StoreError
from twoclocks_cli.core.limits import (
    INT32_MAX,
    MAX_CELLS,
    MAX_RANGE_STEPS,
    PATH_RESERVE,
    path_problem,
)
from twoclocks_cli.core.numbers import short

COMMON_KEYS = ("prompts_per_batch", "group_size", "lr", "clip_eps_low", "clip_eps_high", "seed",
               "sample_budget")


@dataclass(frozen=True)
class Cell:
    """One resolved cell of a sweep."""

    cell_id: str  # sha256 hex of the canonical JSON of `config`
    name: str
    prompts: int
    group_size: int
    batch_samples: int
    lr: float
    clip_low: float
    clip_high: float
    seed: int
    steps: int  # optimizer steps = sample_budget // batch_samples (rollout batches)
    samples: int  # samples actually consumed = steps * batch_samples
    config: dict[str, Any] = field(repr=False)

    def record(self) -> dict:
        """JSON-ready row (the `plan --json` schema)."""
        return {
            "cell_id": self.cell_id, "name": self.name, "prompts": self.prompts,
            "group_size": self.group_size, "batch_samples": self.batch_samples, "lr": self.lr,
            "clip_low": self.clip_low, "clip_high": self.clip_high, "seed": self.seed,
            "steps": self.steps, "samples": self.samples, "config": self.config,
        }


@dataclass(frozen=True)
class Plan:
    """The cells of a sweep and the warnings about them."""

    config: SweepConfig
    cells: list[Cell]
    warnings: list[str]


def cell_hash(cell: dict) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces) of a resolved cell."""
    text = json.dumps(cell, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def scaled_lr(cfg: SweepConfig, batch_samples: int) -> float:
    """lr(B) = reference_lr * (B / reference_batch) ** alpha (inf where it overflows)."""
    s = cfg.scaling
    try:
        return float(s.reference_lr * (batch_samples / s.reference_batch) ** s.alpha)
    except OverflowError:
        return math.inf


def adam_for(cfg: SweepConfig, batch_samples: int, source: str) -> dict[str, float]:
    """Adam's beta1/beta2/eps under the SDE rule at batch B (k = B/B0); rejects beta <= 0."""
    s = cfg.scaling
    k = batch_samples / s.reference_batch
    out = {"beta1": 1 - k * (1 - s.adam_beta1), "beta2": 1 - k * (1 - s.adam_beta2),
           "eps": s.adam_eps / math.sqrt(k)}
    for name in ("beta1", "beta2"):
        if out[name] <= 0:
            raise ConfigError(
                f"{source}: key 'scaling.adam_adjust' = true: at batch {batch_samples} samples "
                f"adam {name} becomes {out[name]:.3g} <= 0; allowed: batches below "
                f"{s.reference_batch / (1 - getattr(s, 'adam_' + name)):.0f} samples")
    return out


def batch_values(grid_batch, source: str) -> list[int]:
    """The batch axis: a list as given, or the geometric range start*factor**k <= stop."""
    if isinstance(grid_batch, BatchRange):
        r = grid_batch
        if r.stop < r.start:
            raise ConfigError(f"{source}: key 'grid.batch.stop' = {r.stop}: must be >= start "
                              f"({r.start})")
        steps = math.log(r.stop / r.start) / math.log(r.factor)  # factor > 1 and finite
        if steps > MAX_RANGE_STEPS:
            raise ConfigError(
                f"{source}: key 'grid.batch.factor' = {r.factor!r}: from {r.start} to {r.stop} "
                f"the range takes {steps:.3g} steps; at most {MAX_RANGE_STEPS:,} (use a larger "
                "factor or a list)")
        out = []
        for k in range(int(steps) + 2):
            x = r.start * r.factor**k
            if x > r.stop + 0.5:  # also inf: never rounded
                break
            if (v := round(x)) <= r.stop and (not out or v != out[-1]):
                out.append(v)
        return out
    return list(grid_batch)


def _axis(value) -> list:
    return list(value) if isinstance(value, list) else [value]


def _axes(cfg: SweepConfig, source: str) -> dict[str, list]:
    """Every grid axis by name (sim.X / trainer.X for option axes), validated."""
    g = cfg.grid
    axes: dict[str, list] = {
        "batch": batch_values(g.batch, source),
        "group_size": _axis(g.group_size),
        "clip_low": _axis(g.clip_low),
        "clip_high": _axis(g.clip_high) if g.clip_high is not None else [None],
        "seeds": _axis(g.seeds),
    }
    for table in ("trainer", "sim", "trl"):
        for key, values in getattr(g, table).items():
            axes[f"{table}.{key}"] = list(values)
    for name, values in axes.items():
        key = "grid." + name
        if not values:
            raise ConfigError(f"{source}: key {key!r} = []: empty grid axis; give at least one "
                              "value")
        if name not in g.zip and \
                len({json.dumps(v, sort_keys=True) for v in values}) != len(values):
            raise ConfigError(f"{source}: key {key!r} = {values!r}: values repeat; each cell "
                              "must be distinct")
    for b in axes["batch"]:
        if b <= 0:
            raise ConfigError(f"{source}: key 'grid.batch' = {b}: batch sizes must be > 0")
        if b > INT32_MAX:
            raise ConfigError(f"{source}: key 'grid.batch' = {b}: at most {INT32_MAX}")
    for gs in axes["group_size"]:
        if not 0 < gs <= INT32_MAX:
            raise ConfigError(f"{source}: key 'grid.group_size' = {gs}: must be > 0 and <= "
                              f"{INT32_MAX}")
    for seed in axes["seeds"]:
        if not 0 <= seed <= INT32_MAX:
            raise ConfigError(f"{source}: key 'grid.seeds' = {seed}: seeds must be in 0.."
                              f"{INT32_MAX} (the store's seed column)")
    for lo in axes["clip_low"]:
        if not 0 <= lo < 1:
            raise ConfigError(f"{source}: key 'grid.clip_low' = {lo}: must be in [0, 1)")
    for hi in axes["clip_high"]:
        if hi is not None and hi < 0:
            raise ConfigError(f"{source}: key 'grid.clip_high' = {hi}: must be >= 0")
    return axes


def _combinations(cfg: SweepConfig, axes: dict[str, list], source: str) -> list[dict]:
    """Cross the axes, except those named in grid.zip, which advance together."""
    zipped = list(dict.fromkeys(cfg.grid.zip))
    for name in zipped:
        if name not in axes:
            raise ConfigError(f"{source}: key 'grid.zip' = {name!r}: not an axis; allowed: "
                              f"{', '.join(axes)}")
    if zipped:
        lengths = {name: len(axes[name]) for name in zipped}
        if len(set(lengths.values())) > 1:
            raise ConfigError(f"{source}: key 'grid.zip' = {zipped!r}: zipped axes need equal "
                              f"lengths, got {lengths}")
    size = math.prod(len(v) for n, v in axes.items() if n not in zipped)
    size *= len(axes[zipped[0]]) if zipped else 1
    if size > MAX_CELLS:
        shape = " x ".join(f"{len(v)} {n}" for n, v in axes.items() if len(v) > 1)
        raise ConfigError(f"{source}: key 'grid': {size:,} cells ({shape}); a sweep may plan at "
                          f"most {MAX_CELLS:,}")
    groups: list[list[dict]] = []
    if zipped:
        groups.append([dict(zip(zipped, vals, strict=True))
                       for vals in zip(*(axes[n] for n in zipped), strict=True)])
    for name, values in axes.items():
        if name not in zipped:
            groups.append([{name: v} for v in values])
    return [dict(kv for part in combo for kv in part.items())
            for combo in itertools.product(*groups)]


TABLES = {"grpo": "trainer", "sim": "sim", "trl": "trl", "command": "command"}


def _check_overrides(cfg: SweepConfig, source: str) -> None:
    """Overrides may not set what the grid/scaling own, nor target another backend."""
    own = TABLES[cfg.backend]
    for table in TABLES.values():
        if table == own:
            continue
        grid = getattr(cfg.grid, table, None)
        if getattr(cfg, table) or grid:
            where = table if getattr(cfg, table) else f"grid.{table}"
            raise ConfigError(f"{source}: key {where!r}: the {cfg.backend} backend does not read "
                              f"[{table}] options; use [{own}]")
    if own in ("trl", "command") and getattr(cfg, own) is None:
        raise ConfigError(f"{source}: key {own!r} is required with backend = {cfg.backend!r} "
                          f"(a [{own}] table; see the README's Sweeps section)")
    if own not in ("trainer", "sim"):
        return
    adam = cfg.scaling.adam_adjust
    owned = {
        "trainer": set(COMMON_KEYS) | {"rollout_batch_size", "phases"}
        | ({"adam_beta1", "adam_beta2", "adam_epsilon"} if adam else set()),
        "sim": {"beta1", "beta2", "adam_eps"} if adam else set(),
    }[own]
    for where, opts in ((own, getattr(cfg, own)), (f"grid.{own}", getattr(cfg.grid, own))):
        for key in opts:
            if key in owned:
                raise ConfigError(f"{source}: key '{where}.{key}': set by the sweep itself "
                                  "(grid, scaling, sample_budget); remove it here")


def plan(cfg: SweepConfig, source: str = "config", config_dir: str | None = None) -> Plan:
    """Resolve every cell of `cfg`; raise ConfigError for impossible grids, list warnings.

    Every cell is validated as its backend will read it, so a sweep that plans never fails a
    cell on its config. `config_dir` (default: the folder of `source` when it is a file, else
    the working directory) is where relative `trl.python_path` folders start.
    """
    _check_overrides(cfg, source)
    _check_paths(cfg, source)
    axes = _axes(cfg, source)
    cells: list[Cell] = []
    seen: set[str] = set()
    check = {"sim": _sim_checker, "grpo": _grpo_checker, "trl": _trl_checker,
             "command": _command_checker}[cfg.backend](cfg, source)
    extra = _backend_table(cfg, source, config_dir)
    for combo in _combinations(cfg, axes, source):
        cell = _resolve(cfg, combo, source, extra)
        if cell.cell_id not in seen:
            check(cell)
            seen.add(cell.cell_id)
            cells.append(cell)
    return Plan(config=cfg, cells=cells, warnings=_warnings(cfg, cells))


def _check_paths(cfg: SweepConfig, source: str) -> None:
    """The workdir is a folder the OS accepts; the store key is a database URL."""
    problem = path_problem(cfg.workdir, reserve=PATH_RESERVE + len(cfg.name))
    if problem is None and os.path.exists(cfg.workdir) and not os.path.isdir(cfg.workdir):
        problem = "exists and is not a folder"
    if problem:
        raise ConfigError(f"{source}: key 'workdir' = {short(cfg.workdir)}: {problem}")
    if cfg.store is not None:
        from twoclocks_cli.store.engine import check_url

        try:
            check_url(cfg.store)
        except StoreError as err:
            raise ConfigError(f"{source}: key 'store': {err}") from None


# a cell's common keys are set by the sweep; name the sweep key that set them
_SWEEP_KEYS = {"prompts_per_batch": "grid.batch", "group_size": "grid.group_size",
               "lr": "scaling.reference_lr", "clip_eps_low": "grid.clip_low",
               "clip_eps_high": "grid.clip_high", "seed": "grid.seeds",
               "sample_budget": "sample_budget", "adam_beta1": "scaling.adam_beta1",
               "adam_beta2": "scaling.adam_beta2", "adam_epsilon": "scaling.adam_eps"}


def _grpo_checker(cfg: SweepConfig, source: str):
    """Validate a grpo cell with the trainer's own TrainConfig (no torch is imported)."""
    from trainer.config import TrainConfig

    def rename(key: str) -> str:
        if key in cfg.grid.trainer:
            return f"grid.trainer.{key}"
        if key in cfg.trainer:
            return f"trainer.{key}"
        return _SWEEP_KEYS.get(key, f"trainer.{key}")

    def check(cell: Cell) -> None:
        TrainConfig.from_dict(cell.config, source=_cell_source(cfg, cell, source), rename=rename)

    return check


def _sim_checker(cfg: SweepConfig, source: str):
    """Validate the sim tables with the sim backend's ModelConfig, strictly typed."""
    from twoclocks_cli.backends import sim as sim_backend
    from twoclocks_cli.theory.model import ModelConfig

    axes = set(cfg.grid.sim)
    try:  # an unknown key is named where it was written
        ModelConfig.check_keys(set(cfg.sim) - set(sim_backend.SCHEDULE_KEYS), "sim")
        ModelConfig.check_keys(axes, "grid.sim")
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None

    def build(table: dict):
        try:
            return ModelConfig.from_dict(table, strict=True)
        except ConfigError as err:  # a key the grid set is named as the grid's
            text = str(err)
            for key in axes:
                text = re.sub(rf"(?<![\w.])sim\.{re.escape(key)}\b", f"grid.sim.{key}", text)
            raise ConfigError(f"{source}: {text}") from None

    models: dict[str, object] = {}

    def check(cell: Cell) -> None:
        sim_backend.check_schedule(cell.config, source)
        table = cell.config["sim"]
        text = json.dumps(table, sort_keys=True)
        if text not in models:
            models[text] = build(table)
        model = models[text]
        if model.dim < 1:
            raise ConfigError(f"{source}: key 'sim.dim' = {model.dim}: the sim backend needs at "
                              "least one curved direction (its progress metric is 1 - L/L0)")
        if model.log_every > cell.steps:
            raise ConfigError(
                f"{source}: key 'sim.log_every' = {model.log_every}: cell {cell.name} runs "
                f"{cell.steps} steps and would write no metric row; at most {cell.steps}")

    return check


def _backend_table(cfg: SweepConfig, source: str, config_dir: str | None) -> dict:
    """The `trl` or `command` table every cell of those backends carries (validated)."""
    if cfg.backend == "trl":
        from twoclocks_cli.backends import trl

        table = cfg.trl.model_dump(mode="json")
        base = Path(config_dir) if config_dir else (
            Path(source).parent if Path(source).is_file() else Path.cwd())
        if not table["entry"].startswith("builtin:"):  # the job imports from these folders
            table["python_path"] = list(dict.fromkeys(
                [str(base.resolve())] + [str((base / d).resolve()) for d in table["python_path"]]))
        trl.check_entry(table["entry"], table["python_path"], source)
        trl.check_args(table["args"], cfg.scaling.adam_adjust, source)
        trl.check_args(cfg.grid.trl, cfg.scaling.adam_adjust, source, where="grid.trl")
        for key in set(cfg.grid.trl) & set(table["args"]):
            raise ConfigError(f"{source}: key 'trl.args.{key}': also an axis (grid.trl.{key}); "
                              "set it in one place")
        return {"trl": table}
    if cfg.backend == "command":
        from twoclocks_cli.backends import command

        table = cfg.command.model_dump(mode="json")
        command.check(table, source)
        return {"command": command.resolved(table)}
    return {}


def _trl_checker(cfg: SweepConfig, source: str):
    """Each trl cell's GRPOConfig arguments can be formed (its batch splits)."""
    from twoclocks_cli.backends import trl

    def check(cell: Cell) -> None:
        trl.grpo_args(cell.config, "workdir", _cell_source(cfg, cell, source))

    return check


def _command_checker(cfg: SweepConfig, source: str):
    """Each command cell's command line can be formed."""
    from twoclocks_cli.backends import command

    def check(cell: Cell) -> None:
        command.command_line(cell.config)

    return check


def _cell_source(cfg: SweepConfig, cell: Cell, source: str) -> str:
    return f"{source} (cell batch {cell.prompts}x{cell.group_size}, seed {cell.seed})"


def _resolve(cfg: SweepConfig, combo: dict, source: str, extra: dict | None = None) -> Cell:
    """One combination of axis values → a resolved Cell."""
    g = int(combo["group_size"])
    if cfg.grid.batch_unit == "samples":
        samples = int(combo["batch"])
        if samples % g:
            raise ConfigError(f"{source}: key 'grid.batch' = {samples}: a batch in samples must "
                              f"be divisible by group_size {g}")
        prompts = samples // g
    else:
        prompts = int(combo["batch"])
        samples = prompts * g
    if samples > INT32_MAX:
        raise ConfigError(f"{source}: key 'grid.batch' = {combo['batch']}: {samples} samples per "
                          f"batch; at most {INT32_MAX}")
    if cfg.sample_budget < samples:
        raise ConfigError(f"{source}: key 'sample_budget' = {cfg.sample_budget}: smaller than "
                          f"one batch ({samples} samples); must be >= the largest batch")
    if cfg.sample_budget // samples > INT32_MAX:
        raise ConfigError(f"{source}: key 'sample_budget' = {cfg.sample_budget}: "
                          f"{cfg.sample_budget // samples} steps at batch {samples}; at most "
                          f"{INT32_MAX} (the store's step column)")
    low = float(combo["clip_low"])
    high = low if combo["clip_high"] is None else float(combo["clip_high"])
    lr = scaled_lr(cfg, samples)
    if not (math.isfinite(lr) and lr > 0):
        raise ConfigError(f"{source}: key 'scaling.rule' = {cfg.scaling.rule!r}: gives lr {lr} "
                          f"at batch {samples}; lr must be a finite number > 0")
    seed = int(combo["seeds"])
    cell: dict[str, Any] = {
        "prompts_per_batch": prompts, "group_size": g, "lr": lr, "clip_eps_low": low,
        "clip_eps_high": high, "seed": seed, "sample_budget": cfg.sample_budget,
    }
    options = {k.split(".", 1)[1]: v for k, v in combo.items() if "." in k}
    adam = adam_for(cfg, samples, source) if cfg.scaling.adam_adjust else None
    if cfg.backend == "sim":
        sim = {**cfg.sim, **options}
        if adam:
            sim.update(beta1=adam["beta1"], beta2=adam["beta2"], adam_eps=adam["eps"])
        cell["sim"] = sim
        from twoclocks_cli.backends.sim import lift_schedule

        cell.update(lift_schedule(sim))  # batch_schedule/adaptive: the cell's own keys
    elif cfg.backend in ("trl", "command"):
        cell.update(json.loads(json.dumps(extra or {})))  # a copy per cell
        if cfg.backend == "trl":
            cell["trl"]["args"].update(options)
        if adam and cfg.backend == "trl":
            cell["trl"]["args"].update(adam_beta1=adam["beta1"], adam_beta2=adam["beta2"],
                                       adam_epsilon=adam["eps"])
        elif adam:
            cell.update(adam_beta1=adam["beta1"], adam_beta2=adam["beta2"],
                        adam_epsilon=adam["eps"])
    else:
        cell.update({**cfg.trainer, **options})
        if adam:
            cell.update(adam_beta1=adam["beta1"], adam_beta2=adam["beta2"],
                        adam_epsilon=adam["eps"])
    try:
        cid = cell_hash(cell)
    except (TypeError, ValueError) as exc:
        bad = _nonfinite_key(cell)
        if bad:
            key, value = bad
            raise ConfigError(f"{source}: key {_written_as(cfg, key)!r} = {value!r}: must be a "
                              "finite number (cells are stored as JSON; use a large finite "
                              "value)") from None
        raise ConfigError(f"{source}: a cell option cannot be stored as JSON: {exc}") from None
    steps = cfg.sample_budget // samples
    if cfg.backend in ("trl", "command"):  # these engines run ceil(budget / batch) batches
        steps = -(-cfg.sample_budget // samples)
    name = f"{cfg.name}-p{prompts}-g{g}-s{seed}-{cid[:6]}"
    return Cell(cell_id=cid, name=name, prompts=prompts, group_size=g, batch_samples=samples,
                lr=lr, clip_low=low, clip_high=high, seed=seed, steps=steps,
                samples=steps * samples, config=cell)


def _nonfinite_key(cell: dict, prefix: str = "") -> tuple[str, float] | None:
    """(dotted key, value) of the first nan/inf float in a cell, or None."""
    for key, value in cell.items():
        here = f"{prefix}{key}"
        if isinstance(value, float) and not math.isfinite(value):
            return here, value
        if isinstance(value, dict):
            found = _nonfinite_key(value, here + ".")
            if found:
                return found
        if isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, float) and not math.isfinite(item):
                    return f"{here}[{i}]", item
                if isinstance(item, dict) and (found := _nonfinite_key(item, f"{here}[{i}].")):
                    return found
    return None


def _written_as(cfg: SweepConfig, key: str) -> str:
    """The config key a cell key came from: trainer.X / grid.trainer.X / sim.X / grid.sim.X."""
    table, _, name = key.partition(".")
    if table in ("trl", "command") and name:
        axis = name.removeprefix("args.")
        return f"grid.trl.{axis}" if table == "trl" and axis in cfg.grid.trl else key
    if table == "sim" and name:
        return f"grid.sim.{name}" if name.split("[")[0] in cfg.grid.sim else key
    head = key.split(".")[0].split("[")[0]
    if head in cfg.grid.trainer:
        return f"grid.trainer.{key}"
    return _SWEEP_KEYS.get(head, f"trainer.{key}")


def updates_per_batch(cfg: SweepConfig, cell: Cell) -> int:
    """Optimizer updates made from one rollout batch (grpo: ppo_epochs * num_minibatches)."""
    if cfg.backend != "grpo":
        return 1
    c = cell.config
    return int(c.get("ppo_epochs", 1)) * int(c.get("num_minibatches", 1))


def _warnings(cfg: SweepConfig, cells: list[Cell]) -> list[str]:
    """Short cells, and clipping varied where it cannot bind."""
    out = []
    short = sorted({c.batch_samples for c in cells if c.steps < cfg.min_steps})
    if short:
        out.append(f"{len([c for c in cells if c.steps < cfg.min_steps])} cell(s) run fewer "
                   f"than {cfg.min_steps} steps (batch samples {short}): their clocks will be "
                   "coarse; raise sample_budget or drop those batch sizes")
    if cfg.executor in ("slurm", "auto") and cfg.slurm.timeout_min < 5:
        out.append(f"slurm.timeout_min = {cfg.slurm.timeout_min}: the checkpoint signal comes "
                   "90 s before the limit (SLURM may send it up to 60 s earlier), so a cell this "
                   "short may requeue before it makes progress")
    clips = {(c.clip_low, c.clip_high) for c in cells}
    if len(clips) > 1:
        if cfg.backend == "grpo":
            single = [c for c in cells if updates_per_batch(cfg, c) == 1]
            if single:
                out.append(f"clipping varies ({len(clips)} settings) but {len(single)} cell(s) "
                           "make one on-policy update per batch (ppo_epochs * num_minibatches "
                           "= 1): the ratio is exactly 1 and clipping cannot bind there")
        elif cfg.backend == "sim" and \
                not any("cap_per_clip" in c.config.get("sim", {}) for c in cells):
            out.append(f"clipping varies ({len(clips)} settings) but the sim backend makes one "
                       "update per batch and sim.cap_per_clip is not set: clipping cannot bind")
    return out
