"""The `sim` backend: runs the local quadratic model and logs the same metrics a GRPO run logs.

Cell keys read: `prompts_per_batch`, `group_size` (batch B = P*G samples), `lr`, `clip_eps_low`,
`clip_eps_high` (-> the displacement cap when `sim.cap_per_clip` is set: cap = cap_per_clip *
mean(clip_eps_low, clip_eps_high); `sim.cap` sets it directly), `seed`, `sample_budget`, `phases`,
and the `sim` table (twoclocks_cli.theory.ModelConfig fields). Progress metric: reward_mean is the
mean of B Bernoulli draws with success probability p = 1 - L/L0 (decaying after collapse);
eval_accuracy the same with `sim.eval_samples` draws at eval points. The state is checkpointed in
`workdir/sim_state.npz` every `sim.checkpoint_every` steps; a rerun resumes from it.

Gradient-noise metrics, per logged step, from the batch's first micro-batch (b =
`grad_micro_size` samples, gradient g_b) and the whole batch (B = `grad_full_size`, g_B):
`grad_sq_micro`/`grad_sq_full` = |g_b|^2, |g_B|^2 (B_simple, twoclocks_cli.clocks.stats);
`grad_l1_micro`/`grad_l1_full` = ||g_b||_1, ||g_B||_1, `grad_sign_dot` = <g_B, sign(g_b)> and
`grad_l1_diff` = ||g_b - g_B||_1 (the sign-descent and l1 noise scales,
twoclocks_cli.clocks.noise).

`batch_schedule = "adaptive"` with an `adaptive` table (trainer.adaptive.config.AdaptiveConfig):
the in-run controller picks each step's batch and lr from these same signals (its state is in
the checkpoint; every decision is logged at its step and recorded as a run event). It also sees
each written row's reward_mean and eval_accuracy, drawn before it observes the step, so its
failure guard's live drop rule (`collapse_key`) reads every evaluation the analysis will; the
rows of an adopted branch (rule "branch") it does not observe. The branches of a rule-"branch"
decision run in `twoclocks_cli.adaptive.sim_branch`; this backend hands its runner to the
controller and writes the adopted branch's steps as the run's rows.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from twoclocks_cli.adaptive import sim_branch
from twoclocks_cli.adaptive.controller import decision_metrics
from twoclocks_cli.backends import refuse_owned
from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.store.models import RunStatus
from twoclocks_cli.theory.model import ModelConfig
from twoclocks_cli.theory.simulate import SimState

STATE_FILE = "sim_state.npz"
SCHEDULE_KEYS = ("batch_schedule", "adaptive")  # a sweep's [sim] keys that are the cell's own
TABLE = "sim"
ADAM_KEYS = ("beta1", "beta2", "adam_eps")  # ModelConfig's names


def lift_schedule(sim: dict) -> dict:
    """Take a sweep's [sim] `batch_schedule`/`adaptive` keys out of `sim` (in place): they go to
    the cell's top level, where this backend reads them (the rest is the ModelConfig)."""
    return {k: sim.pop(k) for k in SCHEDULE_KEYS if k in sim}


def check_schedule(cell: dict, source: str) -> None:
    """Validate a planned cell's adaptive schedule, naming the sweep's keys (sim.adaptive.X)."""
    from twoclocks_cli.adaptive.controller import schedule_of

    try:
        schedule_of(cell, source, table="sim.adaptive")
    except ConfigError as err:
        text = str(err)
        raise ConfigError(text if text.startswith(source) else f"{source}: {text}") from None


# -- the plan side (twoclocks_cli.backends.SweepBackend) -----------------------------------------

def check_options(cfg, source: str) -> None:
    """[sim] and grid.sim leave Adam to the sweep when it scales Adam."""
    refuse_owned(cfg, TABLE, set(ADAM_KEYS) if cfg.scaling.adam_adjust else set(), source)


def check_table(cfg, source: str, config_dir: str | None) -> dict:
    """Nothing every cell carries: its [sim] table is resolved per cell."""
    return {}


def resolve_cell(cfg, common: dict, options: dict, table: dict) -> dict:
    """The common keys, the `sim` table ([sim] with the cell's options), and the schedule keys
    lifted out of it."""
    sim = {**cfg.sim, **options}
    cell = {**common, "sim": sim}
    cell.update(lift_schedule(sim))
    return cell


def steps(budget: int, batch: int) -> int:
    """Whole batches within the budget (the run stops before a batch would pass it)."""
    return budget // batch


def cell_checker(cfg, source: str):
    """Validate the sim tables with ModelConfig, strictly typed, and each cell's schedule."""
    axes = set(cfg.grid.sim)
    try:  # an unknown key is named where it was written
        ModelConfig.check_keys(set(cfg.sim) - set(SCHEDULE_KEYS), "sim")
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

    models: dict[str, ModelConfig] = {}  # cells differing only in batch share one model

    def check(cell) -> None:
        check_schedule(cell.config, source)
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


def clip_warning(cells: list, settings: int) -> str | None:
    """One update per batch: the clip binds only through sim.cap_per_clip."""
    if any("cap_per_clip" in c.config.get("sim", {}) for c in cells):
        return None
    return (f"clipping varies ({settings} settings) but the sim backend makes one update per "
            "batch and sim.cap_per_clip is not set: clipping cannot bind")


LINE_KEY = None  # a cell's table is all it runs


def cell_line(cell) -> str | None:
    """Nothing beyond the cell's table."""
    return None


def written_as(cfg, key: str) -> str | None:
    """sim.X, or grid.sim.X for an axis; None for a key of the cell's top level."""
    table, _, name = key.partition(".")
    if table != TABLE or not name:
        return None
    return f"grid.sim.{name}" if name.split("[")[0] in cfg.grid.sim else key


# -- the job side ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Phase:
    """One stretch of constant batch/lr/clip, running while samples < until_samples."""

    until_samples: float
    prompts_per_batch: int
    group_size: int
    lr: float
    clip_eps_low: float | None
    clip_eps_high: float | None

    @property
    def batch(self) -> int:
        return self.prompts_per_batch * self.group_size


def _number(cell: dict, key: str, kind=float, required=True, where="cell"):
    value = cell.get(key)
    if value is None:
        if required:
            raise ConfigError(f"{where}: missing key {key!r} (the sim backend needs it)")
        return None
    try:
        out = kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {key} = {value!r} is not a {kind.__name__}") from None
    if kind is int and out < 1 or kind is float and not math.isfinite(out):
        raise ConfigError(f"{where}: {key} = {value!r} is out of range")
    return out


def phases_of(cell: dict) -> list[Phase]:
    """The cell's phases (the last runs to the budget); a cell without phases is one phase."""
    base = {
        "prompts_per_batch": _number(cell, "prompts_per_batch", int),
        "group_size": _number(cell, "group_size", int, required=False) or 1,
        "lr": _number(cell, "lr"),
        "clip_eps_low": _number(cell, "clip_eps_low", required=False),
        "clip_eps_high": _number(cell, "clip_eps_high", required=False),
    }
    raw = cell.get("phases") or []
    if not isinstance(raw, list):
        raise ConfigError(f"cell: phases = {raw!r} must be a list of tables")
    out = []
    for i, ph in enumerate(raw):
        where = f"cell phases[{i}]"
        if not isinstance(ph, dict):
            raise ConfigError(f"{where} = {ph!r} must be a table")
        out.append(
            Phase(
                until_samples=_number(ph, "until_samples", required=i < len(raw) - 1, where=where)
                or math.inf,
                prompts_per_batch=_number(ph, "prompts_per_batch", int, False, where)
                or base["prompts_per_batch"],
                group_size=_number(ph, "group_size", int, False, where) or base["group_size"],
                lr=_number(ph, "lr", float, False, where) or base["lr"],
                clip_eps_low=_number(ph, "clip_eps_low", float, False, where)
                or base["clip_eps_low"],
                clip_eps_high=_number(ph, "clip_eps_high", float, False, where)
                or base["clip_eps_high"],
            )
        )
    if not out:
        out = [Phase(until_samples=math.inf, **base)]
    return out


def phase_at(phases: list[Phase], samples: float) -> int:
    """The index of the phase running at `samples`: the run's and the probe's replay's one rule."""
    for i, ph in enumerate(phases):
        if samples < ph.until_samples:
            return i
    return len(phases) - 1


def _controller(cell: dict, writer, extra: dict | None):
    """The adaptive controller of an adaptive cell (restored from `extra` on resume), else None."""
    from twoclocks_cli.adaptive.controller import Controller, calibrate, record_event, schedule_of
    from twoclocks_cli.store import Store

    sched = schedule_of(cell)
    if sched is None:
        return None, None
    base = phases_of({k: v for k, v in cell.items() if k != "phases"})[0]
    store = Store(writer.engine)
    if extra and extra.get("controller") is not None:
        ctl = Controller(sched, base.group_size, base.prompts_per_batch, base.lr,
                         state=extra["controller"])
    else:
        cal = calibrate(store, sched)
        ctl = Controller(sched, base.group_size, base.prompts_per_batch, base.lr,
                         calibration=cal)
        if cal:
            record_event(store, writer.run_id, f"adaptive calibration from sweep "
                         f"{cal['from_sweep']!r}: kappa {ctl.state.kappa:.4g} ({cal['kappa_why']})"
                         f"; drift_threshold {ctl.state.drift_threshold} ({cal['drift_why']})")
    return ctl, lambda msg: record_event(store, writer.run_id, msg)


def run(cell: dict, writer, workdir: Path) -> RunStatus:
    """Simulate one cell to its sample budget, writing step metrics; resumes from `workdir`."""
    cfg = ModelConfig.from_dict(cell.get("sim"), where="cell sim")
    budget = _number(cell, "sample_budget")
    seed = int(cell.get("seed") or 0)
    path = Path(workdir) / STATE_FILE
    extra = None
    if path.exists():
        state, extra = SimState.load(cfg, path)
        step, logged = int(extra["step"]), int(extra["logged"])
    else:
        state, step, logged = SimState.start(cfg, 1, seed), 0, 0
    ctl, event = _controller(cell, writer, extra)
    phases = phases_of(cell) if ctl is None else phases_of(
        {k: v for k, v in cell.items() if k != "phases"})
    norm0 = float(np.linalg.norm(state.theta0)) or 1.0
    every = cfg.checkpoint_every
    next_ckpt = (step // every + 1) * every
    while True:
        samples = float(state.samples[0])
        ph, k = _phase_now(phases, samples, ctl)
        if samples + ph.batch > budget:
            break
        before = ctl.metrics() if ctl is not None else None
        p_before = sim_branch.scalar_progress(state, sim_branch.scalar_loss(state))
        cap = cfg.cap_for(ph.clip_eps_low, ph.clip_eps_high)
        info = state.step(ph.batch, ph.lr, cap)
        step += 1
        bad = bool(info.nonfinite[0])
        decision = None
        branches: dict = {}
        # every decision falls on a row: a scheduled one is `due`, the guard's on a collapse
        # needs an evaluation, which only a row has
        row = bad or step % cfg.log_every == 0 or (
            ctl is not None and ctl.due(float(state.samples[0])))
        seen = _measured(cfg, state, info, ph, (seed, step), p_before,
                         logged % cfg.eval_every == 0) if row else {}
        if ctl is not None:
            brancher = sim_branch.brancher(state, ctl, branches, seed=seed,
                                           group_size=ph.group_size, cap=cap, norm0=norm0,
                                           budget=budget)
            decision = ctl.observe(step, float(state.samples[0]),
                                   {**_observed(info, ph, norm0), **seen}, brancher)
        if row:
            values = _step_values(info, ph, k, norm0, seen.pop("reward_mean"))
            if before is not None:
                values.update(before)
            if decision is not None:
                values.update(decision_metrics(decision))
            values.update(seen)
            logged += 1
            writer.log(step, int(state.samples[0]), values)
        if decision is not None:
            event(decision.reason)
        if branches:
            state, trace = sim_branch.adopt(branches, decision.prompts, state)
            step, logged = _log_trace(trace, writer, cfg, ctl, (seed, norm0), step, logged)
            bad = bad or not math.isfinite(sim_branch.scalar_loss(state))
        if bad:
            writer.flush()
            return RunStatus.diverged
        if step >= next_ckpt:
            next_ckpt = (step // every + 1) * every
            writer.flush()  # rows first: a resume replays from the checkpoint, never skips
            state.save(path, _extra(step, logged, ctl))
    writer.flush()
    state.save(path, _extra(step, logged, ctl))
    return RunStatus.completed


def _extra(step: int, logged: int, ctl) -> dict:
    """What a checkpoint keeps beside the state: the counters, the controller's state."""
    out = {"step": step, "logged": logged}
    if ctl is not None:
        out["controller"] = ctl.to_dict()
    return out


def _phase_now(phases: list[Phase], samples: float, ctl) -> tuple[Phase, int]:
    """The phase at `samples` and its index; under a controller, its batch and lr (the index
    is then its decisions so far)."""
    k = phase_at(phases, samples)
    ph = phases[k]
    if ctl is not None:
        ph = Phase(math.inf, ctl.prompts, ph.group_size, ctl.lr, ph.clip_eps_low,
                   ph.clip_eps_high)
        k = ctl.state.decisions
    return ph, k


def _observed(info, ph: Phase, norm0: float) -> dict[str, float]:
    """The gradient and drift terms of one step, as the controller observes them."""
    return {
        "grad_sq_micro": float(info.grad_sq_micro[0]),
        "grad_sq_full": float(info.grad_sq_full[0]),
        "grad_micro_size": float(info.micro_size[0]), "grad_full_size": ph.batch,
        "grad_l1_micro": float(info.grad_l1_micro[0]),
        "grad_l1_full": float(info.grad_l1_full[0]),
        "grad_sign_dot": float(info.grad_sign_dot[0]),
        "drift_abs": float(info.drift[0]), "drift_rel": float(info.drift[0]) / norm0}


def _step_values(info, ph: Phase, k: int, norm0: float, reward: float) -> dict[str, float]:
    """The metrics one logged step writes (`reward`: the observed reward mean)."""
    bad = bool(info.nonfinite[0])
    return {
        "reward_mean": reward,
        "loss": float(info.loss[0]),
        "drift_abs": float(info.drift[0]),
        "drift_rel": float(info.drift[0]) / norm0,
        "lr": ph.lr,
        "batch_samples": ph.batch,
        "prompts": ph.prompts_per_batch,
        "phase": k,
        "grad_sq_micro": float(info.grad_sq_micro[0]),
        "grad_sq_full": float(info.grad_sq_full[0]),
        "grad_micro_size": float(info.micro_size[0]),
        "grad_full_size": ph.batch,
        "grad_l1_micro": float(info.grad_l1_micro[0]),
        "grad_l1_full": float(info.grad_l1_full[0]),
        "grad_sign_dot": float(info.grad_sign_dot[0]),
        "grad_l1_diff": float(info.grad_l1_diff[0]),
        "nonfinite": 1.0 if bad else 0.0,
    }


def _measured(cfg: ModelConfig, state: SimState, info, ph: Phase, seed_step: tuple[int, int],
              p_before: float, evaluated: bool) -> dict[str, float]:
    """A row's progress metrics, drawn from its step's own stream (reward, then evaluation):
    the controller sees them before the row is written, its live drop rule their evaluation."""
    obs = np.random.default_rng(list(seed_step))
    out = {"reward_mean": obs.binomial(ph.batch, p_before) / ph.batch}
    if evaluated:
        out.update(_eval(cfg, obs, sim_branch.scalar_progress(state, float(info.loss[0]))))
    return out


def _eval(cfg: ModelConfig, obs: np.random.Generator, p: float) -> dict[str, float]:
    """An evaluation of `cfg.eval_samples` problems at success probability `p`."""
    return {"eval_accuracy": obs.binomial(cfg.eval_samples, p) / cfg.eval_samples,
            "eval_n": cfg.eval_samples}


def _log_trace(trace, writer, cfg: ModelConfig, ctl, seed_norm: tuple[int, float], step: int,
               logged: int) -> tuple[int, int]:
    """Log the adopted branch's steps as the run's rows; returns (step, logged) after them."""
    seed, norm0 = seed_norm
    for row in trace:
        step += 1
        obs = np.random.default_rng([seed, step])
        values = {"reward_mean": obs.binomial(ctl.batch, row.p_before) / ctl.batch,
                  "loss": row.loss, "drift_abs": row.drift,
                  "drift_rel": row.drift / norm0, "nonfinite": 0.0, **ctl.metrics()}
        if logged % cfg.eval_every == 0:
            values.update(_eval(cfg, obs, row.p_after))
        logged += 1
        writer.log(step, int(row.samples), values)
    return step, logged
