"""`twoclocks probe` on a grpo run: real branches of the training, as cells of a small sweep.

The state at `at`: the trainer keeps only its newest checkpoint, so the state is rebuilt by
replaying the run's own config to `at` (the *replay* cell: the same config with sample_budget
= `at`, snapped to the run's last step within `at`). Training is deterministic on CPU
(`trainer.loop.deterministic_kernels`) and resume is exact, so the replay is the run itself;
the probe checks it against the run's stored rows (loss, grad_norm, reward_mean at every step)
and says so. Its final checkpoint is where every *branch* cell starts (`trainer.adaptive.branch`):
weights, Adam's moments and step count, data position and random streams. A branch runs at
batch B with lr(B) by the sweep's rule from the run's own (batch, lr), for `branch_samples`
samples, evaluating every `eval_every` samples; replicate 0 continues the run's own random
streams (at the run's batch it *is* the run's continuation), replicate r > 0 reseeds them from
(seed, r), the same for every batch.

Progress is held-out eval accuracy (`eval_accuracy`), not training reward: every branch is
measured on the same held-out problems with the same evaluation sampler, so its noise does not
depend on the batch, while a batch's mean reward is an on-policy estimate whose noise shrinks
as 1/sqrt(B) (a noisier small-batch curve crosses a threshold early by chance), and it is the
metric `analyze` times the sweep's runs on. The branch point's value is the replay's own
evaluation at `at`. Each branch's curve (that point, then its evaluations) is smoothed by a
centred moving average of `window` points; the gain target is `p0 + frac * (best - p0)`, best
the largest median (over replicates) final smoothed value of a batch; a branch's clock is the
samples from `at` to its first crossing (never before an evaluation that itself reaches it),
censored when it never does (a diverged branch too).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import field_serializer

from twoclocks_cli.adaptive.probe.common import check_branches, scaling
from twoclocks_cli.clocks.critical import Estimate
from twoclocks_cli.core.codec import Document
from twoclocks_cli.core.errors import AnalysisError, ConfigError
from twoclocks_cli.store.registry import NewCell

METRIC = "eval_accuracy"
REPLAY_KEYS = ("loss", "grad_norm", "reward_mean")  # compared step by step with the run's
FINAL = frozenset({"completed", "diverged"})  # a branch that ended with a curve


@dataclass
class BranchCell:
    """One planned branch: its batch (samples), replicate and cell."""

    batch: int
    replicate: int
    cell: NewCell


@dataclass
class GrpoProbe:
    """A planned probe of one grpo run: the replay cell (None at 0 samples) and the branches."""

    run_id: int
    sweep: str
    folder: str
    at_samples: int
    at_step: int
    group_size: int
    batches: list[int]
    lrs: list[float]
    seeds: int
    branch_samples: int
    eval_every: int
    window: int
    frac: float
    rule: tuple[float, float, float]  # reference batch, reference lr, exponent
    replay: NewCell | None
    branches: list[BranchCell]
    parent_sweep_config: dict | None  # where the executor's settings come from
    notes: list[str] = field(default_factory=list)

    def cells(self) -> list[NewCell]:
        return ([self.replay] if self.replay else []) + [b.cell for b in self.branches]

    def sweep_config(self) -> dict:
        """What the probe sweep stores as its config: the probe's settings and the rule."""
        b0, lr0, alpha = self.rule
        parent = self.parent_sweep_config or {}
        return {"name": self.sweep, "backend": "grpo", "probe": {
            "run_id": self.run_id, "at_samples": self.at_samples, "at_step": self.at_step,
            "batches": self.batches, "seeds": self.seeds, "branch_samples": self.branch_samples,
            "eval_every": self.eval_every, "metric": METRIC},
            "scaling": {"reference_batch": b0, "reference_lr": lr0, "rule": alpha},
            **{k: parent[k] for k in ("executor", "local", "slurm") if k in parent}}


def cell_workdir(folder: str, cell_id: str) -> Path:
    """Where a cell of a sweep in `folder` checkpoints (`launch.sweeps.submit`'s layout)."""
    return Path(folder) / "cells" / cell_id[:16]


def plan(store, run, at: float, batches: list[float], branch_samples: float, seeds: int,
         eval_every: int | None = None, window: int = 3, frac: float = 0.5,
         workdir: Path | None = None) -> GrpoProbe:
    """Check everything and plan the probe's cells; writes nothing (ConfigError lines)."""
    from trainer.config import TrainConfig
    from twoclocks_cli.backends.grpo import check_needs

    where = f"run {run.id}"
    if not run.batch_samples or not run.lr or not run.group_size:
        raise ConfigError(f"{where}: no batch size, group size or lr recorded: nothing to scale "
                          "from")
    if "branch" in (run.config or {}):
        raise ConfigError(f"{where} is a branch of a probe: probe the run it branched from")
    cfg = TrainConfig.from_dict(dict(run.config or {}), source=f"{where} config")
    if cfg.batch_schedule == "adaptive":
        raise ConfigError(f"{where} is an adaptive run: its batch follows the controller, and "
                          "a replay to --at recalibrates it from the store as it is now; "
                          "probe a run of a fixed batch schedule")
    check_needs(cfg, f"{where} config")
    at_step, at_samples = _snap(store, run, at)
    g = cfg.group_size
    every = _check_args(batches, branch_samples, seeds, eval_every, window, frac, g, where)
    b0, lr0, alpha = scaling(run, run.sweep)
    parent_sweep = run.sweep.config if run.sweep is not None else None
    name = f"probe-{run.id}-at{at_samples}"
    folder = _folder(store, name, run, workdir)
    base = cfg.model_dump(mode="json")
    replay = None
    if at_samples > 0:
        # the run's own config to `at`: only the budget changes (an end-of-budget evaluation
        # is added when the run never evaluated; evaluation has its own random stream)
        rc = {**base, "sample_budget": at_samples,
              "eval_every_samples": base["eval_every_samples"] or at_samples}
        replay = _cell(rc, f"replay-{at_samples}", cfg, cfg.phase_at(0)[1].prompts_per_batch,
                       float(run.lr))
    start = None if replay is None else str(cell_workdir(folder, replay.cell_id))
    sizes = sorted({int(b) for b in batches})
    lrs = [lr0 * (b / b0) ** alpha for b in sizes]
    adam = _adam(parent_sweep, sizes, where)
    branches = []
    for b, lr in zip(sizes, lrs, strict=True):
        bc = {**base, "prompts_per_batch": b // g, "samples_per_batch": b, "lr": lr,
              "phases": [], "batch_schedule": "phases", "adaptive": None,
              "sample_budget": at_samples + int(branch_samples), "eval_every_samples": every,
              **adam.get(b, {})}
        TrainConfig.from_dict(bc, source=f"branch at {b} samples")  # refused here, not later
        for r in range(seeds):
            cell = {**bc, "branch": {"from_workdir": start, "replicate": r}}
            branches.append(BranchCell(b, r, _cell(cell, f"B{b}-r{r}", cfg, b // g, lr)))
    notes = [f"lr(B) = {lr0:.4g} x (B/{b0:g})^{alpha:g} (the sweep's scaling rule, from run "
             f"{run.id}'s own batch and lr)"]
    if adam:
        notes.append("Adam's betas and eps per batch by the sweep's adam_adjust (the moments "
                     "are carried over)")
    return GrpoProbe(run.id, name, folder, at_samples, at_step, g, sizes, lrs, seeds,
                     int(branch_samples), every, window, frac, (b0, lr0, alpha), replay,
                     branches, parent_sweep, notes)


def _check_args(batches, branch_samples, seeds, eval_every, window, frac, g: int,
                where: str) -> int:
    """One line for each argument a grpo probe cannot take; returns the eval spacing."""
    check_branches(batches, branch_samples, seeds)
    for b in batches:
        if b != int(b) or int(b) % g:
            raise ConfigError(f"--batches: {b:g} samples is not a whole number of groups of "
                              f"{g} (the group size of {where})")
    if branch_samples != int(branch_samples):
        raise ConfigError(f"--branch-samples {branch_samples:g}: a whole number of samples")
    every = int(eval_every) if eval_every is not None else max(int(branch_samples) // 8, 1)
    if not 1 <= every <= branch_samples:
        raise ConfigError(f"--eval-every {every}: must be in 1..--branch-samples "
                          f"({branch_samples:g})")
    if not 1 <= window <= 99:
        raise ConfigError(f"--window {window}: must be in 1..99")
    if not 0 < frac <= 1:
        raise ConfigError(f"--target-frac {frac}: must be in (0, 1]")
    return every


def _snap(store, run, at: float) -> tuple[int, int]:
    """(step, samples) of the run's last logged step within `at` samples ((0, 0) before its
    first); `at` beyond its last logged step is refused."""
    if not (math.isfinite(at) and at >= 0):
        raise ConfigError(f"--at {at}: must be a finite number of samples >= 0")
    s = store.load_metric([run.id], "batch_samples").get(run.id)
    if s is None or s.steps.size == 0:
        raise ConfigError(f"run {run.id} has no logged steps: no state to branch from (train "
                          "it first)")
    last = int(s.samples[-1])
    if at > last:
        raise ConfigError(f"--at {at:g}: beyond run {run.id}'s last logged step ({last:,} "
                          f"samples, step {int(s.steps[-1])})")
    within = np.flatnonzero(s.samples <= at)
    if within.size == 0:
        return 0, 0
    i = int(within[-1])
    return int(s.steps[i]), int(s.samples[i])


def _folder(store, name: str, run, workdir: Path | None) -> str:
    """The probe sweep's folder: the stored one when it exists, else a new one beside the
    run's sweep folder (or under `workdir`, default ./twoclocks-probe)."""
    from twoclocks_cli.core.errors import NotFoundError

    try:
        folder = store.get_sweep(name).folder
    except NotFoundError:
        folder = None
    if folder:
        return folder
    if workdir is not None:
        root = Path(workdir)
    elif run.sweep is not None and run.sweep.folder:
        root = Path(run.sweep.folder).parent
    else:
        root = Path("twoclocks-probe")
    return str(root.resolve() / f"{name}-{uuid.uuid4().hex[:8]}")


def _adam(sweep_config: dict | None, sizes: list[int], where: str) -> dict[int, dict]:
    """Per batch, Adam's betas and eps under the sweep's adam_adjust (empty when off)."""
    s = (sweep_config or {}).get("scaling") or {}
    if not s.get("adam_adjust"):
        return {}
    out = {}
    for b in sizes:
        k = b / float(s["reference_batch"])
        b1, b2 = 1 - k * (1 - s["adam_beta1"]), 1 - k * (1 - s["adam_beta2"])
        if b1 <= 0 or b2 <= 0:
            raise ConfigError(f"--batches: at {b} samples the sweep's adam_adjust makes a beta "
                              f"<= 0 ({where}'s sweep scales Adam with the batch)")
        out[b] = {"adam_beta1": b1, "adam_beta2": b2, "adam_epsilon": s["adam_eps"] / math.sqrt(k)}
    return out


def _cell(config: dict, name: str, cfg, prompts: int, lr: float) -> NewCell:
    from twoclocks_cli.config.plan import cell_hash

    g = cfg.group_size
    cols = {"batch_prompts": prompts, "group_size": g, "batch_samples": prompts * g, "lr": lr,
            "clip_low": cfg.clip_eps_low, "clip_high": cfg.clip_eps_high, "seed": cfg.seed}
    return NewCell(cell_hash(config), name, cols, config)


def register(store, probe: GrpoProbe, source: str) -> dict[str, int]:
    """The probe sweep and its cells, in one transaction; cell id -> run id."""
    reg = store.register_cells(probe.sweep, "grpo", probe.sweep_config(), probe.folder,
                               probe.cells(), source)
    if reg.folder != probe.folder:  # a sweep of that name made elsewhere: its cells point here
        raise ConfigError(f"sweep {probe.sweep!r} exists with folder {reg.folder}, not "
                          f"{probe.folder}")
    return reg.runs


# -- the result ------------------------------------------------------------------------------

@dataclass
class GrpoProbeResult(Document):
    """The branches' clocks per batch, the local B_crit, and the run's noise scales at `at`."""

    run_id: int
    sweep: str
    at_samples: int
    at_step: int
    metric: str
    progress_at: float  # the replay's evaluation at `at`
    target: float
    batches: list[int]
    lrs: list[float]
    clocks: dict  # batch -> [samples from `at` to the target per replicate; None = censored]
    branch_runs: dict  # batch -> [run id per replicate]
    b_crit: Estimate
    noise: dict  # the run's in-run noise scales at `at` (None: its reason in noise["why"])
    replay: dict  # the replay's check against the run's own rows
    eval_n: int | None = None
    notes: list[str] = field(default_factory=list)

    @field_serializer("clocks", "branch_runs")
    def _batch_keys(self, by_batch: dict) -> dict:
        return {str(b): v for b, v in by_batch.items()}


def branch_clock(samples: np.ndarray, values: np.ndarray, at: float, target: float,
                 window: int) -> float | None:
    """Samples from `at` to the first crossing of `target` by the smoothed curve, never before
    an observed point reaches it; None when it never does."""
    from twoclocks_cli.clocks.curves import first_crossing, smooth

    sm = smooth(values, "ma", window)
    hit = first_crossing(samples, sm, target)
    raw = np.flatnonzero(values >= target)
    if hit is None or raw.size == 0:
        return None
    return max(hit, float(samples[raw[0]])) - at


def curve(series, at: int, p0: float) -> tuple[np.ndarray, np.ndarray]:
    """A branch's progress curve: the branch point (`at`, p0), then its evaluations after it."""
    ok = (series.samples > at) & np.isfinite(series.values)
    return (np.concatenate([[float(at)], series.samples[ok].astype(float)]),
            np.concatenate([[p0], series.values[ok]]))


def result(store, probe: GrpoProbe, runs: dict[str, int], bootstrap: int = 400,
           seed: int = 0) -> GrpoProbeResult:
    """The probe's numbers from its finished cells (AnalysisError when they cannot say)."""
    from twoclocks_cli.clocks import critical
    from twoclocks_cli.clocks.curves import smooth

    ids = {(b.batch, b.replicate): runs[b.cell.cell_id] for b in probe.branches}
    series = store.load_metric(list(ids.values()), METRIC)
    p0 = _progress_at(store, probe, runs, series, ids)
    curves = {k: curve(series[rid], probe.at_samples, p0) for k, rid in ids.items()
              if rid in series}
    finals = {}
    for b in probe.batches:
        ends = [float(smooth(curves[(b, r)][1], "ma", probe.window)[-1])
                for r in range(probe.seeds) if (b, r) in curves]
        if ends:
            finals[b] = float(np.median(ends))
    best = max(finals.values(), default=-math.inf)
    if not best > p0:
        raise AnalysisError(f"run {probe.run_id} at {probe.at_samples:,} samples: no batch's "
                            f"{METRIC} rose within {probe.branch_samples:,} samples (from "
                            f"{p0:.4g}; best median final {best:.4g}); probe earlier or with a "
                            "longer --branch-samples")
    target = p0 + probe.frac * (best - p0)
    clocks = {b: [None if (b, r) not in curves else
                  branch_clock(*curves[(b, r)], probe.at_samples, target, probe.window)
                  for r in range(probe.seeds)] for b in probe.batches}
    # a batch none of whose branches reached the target stays in, censored, as `analyze`
    # keeps it: below the batches that reached it E(B) falls (a lower bound), above them it
    # is the wall
    per_batch = {float(b): v for b, v in clocks.items()}
    est = critical.empirical(per_batch, np.random.default_rng(seed), bootstrap)
    eval_n = store.load_metric([next(iter(ids.values()))], "eval_n")
    n = next((int(s.values[-1]) for s in eval_n.values()), None)
    notes = list(probe.notes)
    notes.append(f"progress: {METRIC} (held-out; the same problems for every batch), "
                 f"{p0:.4g} at the branch point -> target {target:.4g} ({probe.frac:g} of the "
                 f"best batch's median gain to {best:.4g} in {probe.branch_samples:,} samples), "
                 f"centred moving average of {probe.window} evaluation(s)")
    missed = [b for b, v in clocks.items() if all(x is None for x in v)]
    if missed:
        notes.append(f"B={', '.join(map(str, missed))}: no branch reached the target within "
                     f"{probe.branch_samples:,} samples, in the estimate as slower than that "
                     "(a longer --branch-samples says whether they are slower or only behind "
                     "by noise)")
    if n:
        se = math.sqrt(max(p0 * (1 - p0), 1e-12) / n)
        notes.append(f"each evaluation: {n} problems (binomial SE {se:.3g} at {p0:.3g})")
        if best - p0 < 2 * se:
            notes.append(f"the best batch's median gain ({best - p0:.3g}) is under 2 SE of one "
                         "evaluation: the clocks time noise as much as progress; branch longer "
                         "or evaluate more problems (eval_size)")
    if probe.at_samples:
        notes.append("Adam's moments and step count carried over from the run: a branch steps "
                     "with the run's second-moment estimate (it relaxes over ~1/(1-beta2) "
                     "steps)")
    return GrpoProbeResult(
        probe.run_id, probe.sweep, probe.at_samples, probe.at_step, METRIC, p0, target,
        probe.batches, probe.lrs, clocks,
        {b: [ids[(b, r)] for r in range(probe.seeds)] for b in probe.batches}, est,
        noise_at(store, probe.run_id, probe.at_step), replay_check(store, probe, runs), n, notes)


def _progress_at(store, probe, runs, series, ids) -> float:
    """The metric at the branch point: the replay's evaluation at `at` (at 0 samples, the
    branches' own evaluation before their first step, the same for all)."""
    if probe.replay is not None:
        s = store.load_metric([runs[probe.replay.cell_id]], METRIC).get(
            runs[probe.replay.cell_id])
        ok = None if s is None else np.flatnonzero((s.steps == probe.at_step)
                                                   & np.isfinite(s.values))
        if ok is None or ok.size == 0:
            raise AnalysisError(f"the replay of run {probe.run_id} logged no {METRIC} at step "
                                f"{probe.at_step}: no branch point to measure from")
        return float(s.values[ok[-1]])
    firsts = [float(s.values[0]) for s in series.values() if s.steps.size and s.steps[0] == 0]
    if not firsts:
        raise AnalysisError(f"no branch of run {probe.run_id} logged {METRIC} at 0 samples")
    return float(np.median(firsts))


def noise_at(store, run_id: int, step: int, ema_alpha: float = 0.05) -> dict:
    """The run's in-run noise scales at `step` (the last measuring step within it), computed
    as `analyze` does (the two-batch terms EMA-smoothed with `ema_alpha`): B_simple from the
    Euclidean terms, B_sign from the l1 terms (which the grpo trainer does not log). A value
    is None with its reason in `why`: not logged, or not positive (the smoothed signal term
    |G|^2 or P is <= 0: the batches' gradients are noise-dominated there)."""
    from twoclocks_cli.clocks.noise import sign_noise_scale
    from twoclocks_cli.clocks.runclock import GRAD_KEYS, SIGN_KEYS
    from twoclocks_cli.clocks.stats import noise_scale

    out = {"ema": ema_alpha, "step": None, "b_simple": None, "b_sign": None, "why": {}}
    for name, keys, fn in (("b_simple", GRAD_KEYS, noise_scale),
                           ("b_sign", SIGN_KEYS, sign_noise_scale)):
        got = [store.load_metric([run_id], k).get(run_id) for k in keys]
        if any(s is None for s in got) or len({s.values.size for s in got}) != 1:
            out["why"][name] = "not logged by this run"
            continue
        within = np.flatnonzero(got[0].steps <= step)
        if not within.size:
            out["why"][name] = f"not measured within {step} steps"
            continue
        values = fn(*(s.values for s in got), ema_alpha=ema_alpha)
        out["step"] = int(got[0].steps[within[-1]])
        value = float(values[within[-1]])
        if math.isfinite(value) and value > 0:
            out[name] = value
        else:
            out["why"][name] = "not positive (the smoothed signal term is <= 0: noise dominates)"
    return out


def replay_check(store, probe: GrpoProbe, runs: dict[str, int]) -> dict:
    """Whether the replay logged exactly the run's own values (REPLAY_KEYS, steps 1..at_step)."""
    out = {"steps": probe.at_step, "keys": list(REPLAY_KEYS), "identical": True,
           "first_difference": None}
    if probe.replay is None:
        return out
    rid = runs[probe.replay.cell_id]
    for key in REPLAY_KEYS:
        got = store.load_metric([probe.run_id, rid], key)
        a, b = got.get(probe.run_id), got.get(rid)
        if a is None or b is None:
            continue
        pa = dict(zip(a.steps.tolist(), a.values.tolist(), strict=True))
        for step, value in zip(b.steps.tolist(), b.values.tolist(), strict=True):
            if step <= probe.at_step and step in pa and not _same(pa[step], value):
                diff = out["first_difference"]
                if diff is None or step < diff["step"]:
                    out["first_difference"] = {"step": step, "key": key, "run": pa[step],
                                               "replay": value}
                out["identical"] = False
                break
    return out


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))
