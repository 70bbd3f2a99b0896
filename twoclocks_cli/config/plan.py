"""Planning: expand a SweepConfig into resolved cells (lr by the scaling rule, steps, hashes).

A cell is the backend's config dict: the common keys (prompts_per_batch, group_size, lr,
clip_eps_low, clip_eps_high, seed, sample_budget) plus what the backend adds from its table of the
config (`twoclocks_cli.backends.SweepBackend`: grpo its trainer options at the top level, sim a
`sim` table, trl and command their `trl` / `command` table). The planner asks the backend for
that, for the checks of its table and cells, for a cell's steps and for the clipping warning, so
it holds no backend's rules. A cell's identity is the sha256 of its canonical JSON, so the same
config plans the same ids in every process.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from twoclocks_cli.backends import (
    COMMON_KEYS,
    SWEEP_KEYS,
    SweepBackend,
    adam_keys,
    sweep_backend,
)
from twoclocks_cli.config.models import OPTION_TABLES, BatchRange, SweepConfig
from twoclocks_cli.core.errors import ConfigError, StoreError
from twoclocks_cli.core.limits import (
    INT32_MAX,
    MAX_CELLS,
    MAX_RANGE_STEPS,
    NAME_CHARS,
    PATH_RESERVE,
    path_problem,
)
from twoclocks_cli.core.numbers import short

__all__ = ["COMMON_KEYS", "Cell", "Plan", "adam_for", "batch_values", "cell_hash", "plan",
           "scaled_lr"]


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
    steps: int  # rollout batches the backend runs (sample_budget // batch_samples, or ceil)
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


def adam_for(cfg: SweepConfig, batch_samples: int, source: str,
             names: tuple[str, str, str] = ("beta1", "beta2", "eps")) -> dict[str, float]:
    """Adam's beta1/beta2/eps under the SDE rule at batch B (k = B/B0), keyed by `names` (a
    backend's ADAM_KEYS: every backend's cell gets them from here); rejects beta <= 0."""
    s = cfg.scaling
    k = batch_samples / s.reference_batch
    betas = {"beta1": 1 - k * (1 - s.adam_beta1), "beta2": 1 - k * (1 - s.adam_beta2)}
    for name, beta in betas.items():
        if beta <= 0:
            raise ConfigError(
                f"{source}: key 'scaling.adam_adjust' = true: at batch {batch_samples} samples "
                f"adam {name} becomes {beta:.3g} <= 0; allowed: batches below "
                f"{s.reference_batch / (1 - getattr(s, 'adam_' + name)):.0f} samples")
    values = (betas["beta1"], betas["beta2"], s.adam_eps / math.sqrt(k))
    return dict(zip(names, values, strict=True))


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


def _axes(cfg: SweepConfig, backend: SweepBackend, source: str) -> dict[str, list]:
    """Every grid axis by name (TABLE.X for the backend's option axes), validated."""
    g = cfg.grid
    axes: dict[str, list] = {
        "batch": batch_values(g.batch, source),
        "group_size": _axis(g.group_size),
        "clip_low": _axis(g.clip_low),
        "clip_high": _axis(g.clip_high) if g.clip_high is not None else [None],
        "seeds": _axis(g.seeds),
    }
    for key, values in getattr(g, backend.TABLE, {}).items():
        axes[f"{backend.TABLE}.{key}"] = list(values)
    for name, values in axes.items():
        key = "grid." + name
        if not values:
            raise ConfigError(f"{source}: key {key!r} = []: empty grid axis; give at least one "
                              "value")
        if name not in g.zip and \
                len({json.dumps(v, sort_keys=True) for v in values}) != len(values):
            raise ConfigError(f"{source}: key {key!r} = {short(values)}: values repeat; each cell "
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
            raise ConfigError(f"{source}: key 'grid.zip' = {short(name)}: not an axis; allowed: "
                              f"{', '.join(axes)}")
    if zipped:
        lengths = {name: len(axes[name]) for name in zipped}
        if len(set(lengths.values())) > 1:
            raise ConfigError(f"{source}: key 'grid.zip' = {short(zipped)}: zipped axes need equal "
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


def _check_tables(cfg: SweepConfig, backend: SweepBackend, source: str) -> None:
    """No other backend's table is set; the backend's own passes its first checks."""
    own = backend.TABLE
    for table in OPTION_TABLES:
        if table == own:
            continue
        grid = getattr(cfg.grid, table, None)
        if getattr(cfg, table) or grid:
            where = table if getattr(cfg, table) else f"grid.{table}"
            raise ConfigError(f"{source}: key {where!r}: the {cfg.backend} backend does not read "
                              f"[{table}] options; use [{own}]")
    backend.check_options(cfg, source)


def plan(cfg: SweepConfig, source: str = "config", config_dir: str | None = None) -> Plan:
    """Resolve every cell of `cfg`; raise ConfigError for impossible grids, list warnings.

    Every cell is validated as its backend will read it, so a sweep that plans never fails a
    cell on its config. `config_dir` (default: the folder of `source` when it is a file, else
    the working directory) is where relative `trl.python_path` folders start.
    """
    backend = sweep_backend(cfg.backend)
    _check_tables(cfg, backend, source)
    _check_paths(cfg, source)
    axes = _axes(cfg, backend, source)
    cells: list[Cell] = []
    seen: set[str] = set()
    check = backend.cell_checker(cfg, source)
    table = backend.check_table(cfg, source, config_dir)
    for combo in _combinations(cfg, axes, source):
        cell = _resolve(cfg, backend, combo, source, table)
        if cell.cell_id not in seen:
            check(cell)
            seen.add(cell.cell_id)
            cells.append(cell)
    return Plan(config=cfg, cells=cells, warnings=_warnings(cfg, backend, cells))


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


def _resolve(cfg: SweepConfig, backend: SweepBackend, combo: dict, source: str,
             table: dict) -> Cell:
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
    if cfg.scaling.adam_adjust:
        options.update(adam_for(cfg, samples, source, backend.ADAM_KEYS))
    cell = backend.resolve_cell(cfg, cell, options, table)
    try:
        cid = cell_hash(cell)
    except (TypeError, ValueError) as exc:
        bad = _nonfinite_key(cell)
        if bad:
            key, value = bad
            raise ConfigError(f"{source}: key {_written_as(cfg, backend, key)!r} = {short(value)}: "
                              "must be a finite number (cells are stored as JSON; use a large "
                              "finite value)") from None
        raise ConfigError(f"{source}: a cell option cannot be stored as JSON: {exc}") from None
    steps = backend.steps(cfg.sample_budget, samples)
    name = f"{cfg.name}-p{prompts}-g{g}-s{seed}-{cid[:6]}"
    if len(name) > NAME_CHARS:  # the sweep's name leaves its runs' names no room
        raise ConfigError(f"{source}: key 'name' = {short(cfg.name)}: a run's name (the sweep's "
                          f"and '{name[len(cfg.name):]}') would be {len(name)} characters; at "
                          f"most {NAME_CHARS}")
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


def _written_as(cfg: SweepConfig, backend: SweepBackend, key: str) -> str:
    """The config key a cell key came from: the backend's own option, else the sweep key that
    sets a common or Adam key, else the trainer option of that name."""
    head = key.split(".")[0].split("[")[0]
    sweep_keys = {**SWEEP_KEYS, **adam_keys(backend.ADAM_KEYS)}
    return backend.written_as(cfg, key) or sweep_keys.get(head, f"trainer.{key}")


def _warnings(cfg: SweepConfig, backend: SweepBackend, cells: list[Cell]) -> list[str]:
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
    if len(clips) > 1 and (note := backend.clip_warning(cells, len(clips))):
        out.append(note)
    return out
