"""The GRPO training loop, read top to bottom: set up, resume, then per step sample → reward →
advantages → update (gradient accumulation, `trainer.update`) → metrics → eval → the adaptive
controller → checkpoint.

One function, `train(cfg, sink, workdir)`, serves `twoclocks train`, a sweep job (both through
`twoclocks_cli.backends.grpo`) and `accelerate launch` (several processes: each rank keeps its
slice of the global prompt batch, accelerate's DDP sums the gradients across ranks
(`trainer.dist`), rank 0 writes metrics and checkpoints). What it writes to, the adaptive
controller and the checkpoints' owner are handed in (`trainer.ports`): the trainer knows no
store and no CLI. A branch-rule decision of the controller runs short branches of the same step
from an in-memory copy of the state and continues from the kept one (`trainer.adaptive.inrun`).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from trainer import checkpoint, grpo, precision, sampler, sharding
from trainer import metrics as M
from trainer.adaptive import inrun
from trainer.adaptive.branch import Branch, stream_seeds
from trainer.config import TrainConfig
from trainer.data import EVAL_SEED, ArithmeticTask, Problem, read_data, render_prompt
from trainer.dist import Dist, setup_dist
from trainer.ownership import CheckpointOwner
from trainer.ports import Controller, ControllerFactory, MetricSink, Owner
from trainer.rng import private_torch_rng
from trainer.scorer import make_scorer
from trainer.update import (
    Diverged,
    UpdateStats,
    no_grad_logprobs,
    on_policy,
    skips_zero_advantage,
    update,
)
from twoclocks_cli.core.errors import ConfigError


# ---------------------------------------------------------------------------------------------
# Set-up pieces
# ---------------------------------------------------------------------------------------------
class FileSource:
    """Problems from a list, visited in a fresh seeded permutation each epoch."""

    def __init__(self, problems: list[Problem]):
        self.problems, self.order, self.pos = problems, np.arange(0), 0

    def sample(self, rng: np.random.Generator, n: int) -> list[Problem]:
        out = []
        while len(out) < n:
            if self.pos >= len(self.order):
                self.order, self.pos = rng.permutation(len(self.problems)), 0
            take = self.order[self.pos : self.pos + n - len(out)]
            self.pos += len(take)
            out.extend(self.problems[i] for i in take)
        return out

    def state(self) -> dict:
        return {"order": self.order.tolist(), "pos": self.pos}

    def load_state(self, state: dict) -> None:
        self.order, self.pos = np.asarray(state["order"], dtype=np.int64), state["pos"]


class TaskSource:
    """The synthetic task: every draw comes from the data Generator (its state is the position)."""

    def __init__(self, task: ArithmeticTask):
        self.task = task

    def sample(self, rng: np.random.Generator, n: int) -> list[Problem]:
        return self.task.sample(rng, n)

    def state(self) -> dict:
        return {}

    def load_state(self, state: dict) -> None:
        pass


def load_data(cfg: TrainConfig):
    """(training source, held-out problems) for `cfg`; bad files raise ConfigError."""
    train, held = read_data(cfg)
    return (TaskSource(train) if isinstance(train, ArithmeticTask) else FileSource(train)), held


def load_model(cfg: TrainConfig, device: str = "cpu"):
    """(model path, tokenizer, model) — the builtin tiny model is built and cached on first use."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    from trainer.tiny import TINY_MODEL_ID, ensure_tiny_model, resolve_model_path

    if cfg.model == TINY_MODEL_ID:
        path = ensure_tiny_model(cfg.tiny_seed, progress=True)
    else:
        path = resolve_model_path(cfg.model)
    try:
        tok = AutoTokenizer.from_pretrained(str(path), padding_side="left")
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, cfg.dtype))
    except Exception as err:  # noqa: BLE001 - the loaders raise many types for a bad folder
        first = (str(err).strip().splitlines() or [""])[0]
        raise ConfigError(
            f"model {cfg.model!r}: cannot load ({type(err).__name__}: {first})"
        ) from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return path, tok, model.to(device)


def make_optimizer(model, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters: the fused kernel (one pass over every tensor, ~5x
    faster than the per-tensor loop on a CPU) where this torch has it, else the default."""
    kwargs = dict(
        lr=cfg.lr,
        betas=(cfg.adam_beta1, cfg.adam_beta2),
        eps=cfg.adam_epsilon,
        weight_decay=cfg.weight_decay,
    )
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        return torch.optim.AdamW(params, fused=True, **kwargs)
    except (RuntimeError, TypeError, ValueError):  # older torch, or a device without the kernel
        return torch.optim.AdamW(params, **kwargs)


def prompt_text(problem: Problem, cfg: TrainConfig, tokenizer) -> str:
    if cfg.prompt_template is not None:
        return cfg.prompt_template.format(question=problem.question)
    return render_prompt(problem, tokenizer)


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------
def evaluate(engine, reward_fn, held: list[Problem], cfg, tokenizer, step: int) -> float:
    """Held-out accuracy, sampled with a private seeded RNG so training's streams never move."""
    hits = 0.0
    with private_torch_rng(EVAL_SEED + step):  # CPU and this rank's CUDA stream both restored
        for i in range(0, len(held), 256):
            chunk = held[i : i + 256]
            roll = engine.generate(
                [prompt_text(p, cfg, tokenizer) for p in chunk], temperature=cfg.eval_temperature
            )
            hits += sum(r >= 1.0 for r in reward_fn(roll.texts, chunk))
    return hits / max(len(held), 1)


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------
@dataclass
class Progress:
    """What a progress display needs after each step."""

    step: int
    samples: int
    budget: int
    reward: float
    accuracy: float
    eval_accuracy: float | None = None


def deterministic_kernels(device) -> None:
    """Make runs and resumes bit-identical at any thread count: without this, two processes at
    threads = 2 first differ at step 2 (grad_norm in the 8th digit; drift 1.283 vs 1.181 by step
    96), at threads = 1 they match. On CUDA the cuBLAS workspace must be fixed too, and ops
    without a deterministic kernel only warn (vLLM/GPU paths are not run here)."""
    import os

    if str(device).startswith("cuda"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=str(device).startswith("cuda"))


@dataclass
class Run:
    """What one training holds between steps: built by `_set_up`, advanced by `train`."""

    cfg: TrainConfig
    dist: Dist
    workdir: Path
    sink: MetricSink | None  # rank 0's (None elsewhere)
    owner: Owner  # who the checkpoints belong to
    tok: object
    model: torch.nn.Module  # the weights: checkpoints, drift (sharded in place under FSDP)
    rollout_model: torch.nn.Module  # what the engine samples with: `model`, or (under FSDP,
    # or in another rollout_dtype) an unsharded copy refreshed after every update
    scorer: torch.nn.Module  # the forward scoring completions (trainer.scorer), over `model`
    net: torch.nn.Module  # what backward runs through (accelerate's DDP when world > 1)
    ref: torch.nn.Module | None  # the frozen initial policy (KL terms), if any
    opt: torch.optim.Optimizer
    engine: object
    reward_fn: Callable
    source: FileSource | TaskSource
    held: list[Problem]
    data_rng: np.random.Generator
    drift: M.Drift  # parameter drift from the initial weights
    step: int = 0
    samples: int = 0
    ctl: Controller | None = None  # the adaptive controller, if batch_schedule = "adaptive"
    compute: precision.ComputeCopy | None = None  # the update's copy in update_dtype, if any
    flat_steps: int = 0  # of the first NO_SIGNAL_STEPS, those whose every group had equal rewards

    @property
    def scoring(self) -> torch.nn.Module:
        """The forward that scores completions without a graph: the update's own (on its
        compute copy where it has one), so that old and new log-probs share a precision."""
        return self.scorer if self.compute is None else self.compute.net

    @property
    def writes(self) -> bool:
        """Whether this process writes metrics (rank 0 with a sink)."""
        return self.sink is not None and self.dist.rank == 0

    def log(self, step: int, samples: int, values: dict) -> None:
        """Write one step's values (rank 0 only)."""
        if self.writes:
            self.sink.log(step, samples, values)

    def flush(self) -> None:
        """Commit what was logged (rank 0 only)."""
        if self.writes:
            self.sink.flush()


@dataclass
class Batch:
    """One step's rollout and what the step computed from it (pooled over ranks where named)."""

    roll: object  # trainer.rollout.Rollout, this rank's rows
    rewards: torch.Tensor
    adv: torch.Tensor | None = None
    r_mean: float = math.nan  # over all ranks
    r_std: float = math.nan  # over all ranks
    n_all: int = 0  # samples over all ranks
    old_logp: torch.Tensor | None = None  # [N, C] rollout policy's log-probs of the samples
    entropy: torch.Tensor | None = None  # [N, C] its token entropy
    ref_logp: torch.Tensor | None = None  # [N, C] the initial policy's log-probs, when needed
    from_sampler: torch.Tensor | None = None  # rows whose old_logp/entropy are the sampler's
    kl_due: bool = False
    times: dict = field(default_factory=dict)


def _check_world(cfg: TrainConfig, dist: Dist) -> None:
    """Refuse batch sizes the data-parallel processes cannot split evenly."""
    if cfg.batch_schedule == "adaptive" and dist.world > 1:
        raise ConfigError("batch_schedule = \"adaptive\" runs in one process for now (the "
                          f"controller's batch is not kept divisible by {dist.world} ranks)")
    for i, ph in enumerate(cfg.phases or [cfg.phase_at(0)[1]]):
        if ph.prompts_per_batch % dist.world:
            raise ConfigError(
                f"phases[{i}].prompts_per_batch = {ph.prompts_per_batch} is not "
                f"divisible by the {dist.world} data-parallel processes"
            )


def _check_controller(cfg: TrainConfig, controller: ControllerFactory | None) -> None:
    """Refuse an adaptive schedule without a controller to pick its batches."""
    if cfg.batch_schedule == "adaptive" and controller is None:
        raise ConfigError("batch_schedule = \"adaptive\" needs a controller: train() was "
                          "given none (twoclocks train and the grpo backend pass one)")


def _claim_checkpoint(owner: Owner, workdir: Path, dist: Dist, extend: bool) -> Path | None:
    """The newest checkpoint in `workdir`, or None; one the owner refuses (another run's, or
    another config's) is refused on every rank (ConfigError) before any work."""
    ckpt = checkpoint.latest(workdir)
    problem = owner.refusal(ckpt, extend) if ckpt and dist.rank == 0 else None
    if dist.sum([1.0 if problem else 0.0])[0] > 0:  # every rank stops together
        raise ConfigError(problem or f"rank 0 refused the checkpoint in {workdir}")
    return ckpt


def _set_up(cfg, sink, workdir, dist, owner, make_rollout, on_copy: bool) -> Run:
    """Seeds, model (and the frozen reference), optimizer, data, reward and rollout engine;
    `on_copy`: the update computes on a copy in its compute dtype
    (`Precision.computes_on_copy`)."""
    from trainer.rewards import load_reward
    from trainer.rollout import make_engine

    torch.manual_seed(cfg.seed * 7919 + dist.rank)
    # one prompt stream whatever the world size: every rank draws the global batch and keeps
    # its slice, so 1 and N processes train on the same prompts
    data_rng = np.random.default_rng([cfg.seed, 0])
    model_path, tok, model = load_model(cfg, dist.device)
    model.train()
    ref = None
    if cfg.kl_coef > 0 or cfg.kl_init_every > 0:  # in the update's precision, as its forward
        ref_model = _frozen_copy(model, cfg.update_dtype if on_copy else None)
        ref = make_scorer(ref_model, cfg)
        if dist.sharded:  # sharded like the model: its forwards are collective too
            sharding.shard(ref_model, ref, dist.device, dist.world, dist.fsdp)
    rollout_model = precision.sampling_model(model, cfg.rollout_dtype, dist.sharded)
    scorer = make_scorer(model, cfg)
    net, opt = dist.prepare(model, scorer, lambda: make_optimizer(model, cfg))
    compute = (precision.compute_copy(model, rollout_model, cfg.update_dtype,
                                      lambda m: make_scorer(m, cfg)) if on_copy else None)
    drift = M.Drift(model, dist)
    source, held = load_data(cfg)
    reward_fn = load_reward(cfg.reward)
    engine = (make_rollout or make_engine)(cfg, rollout_model, tok, model_path)  # whole weights
    return Run(cfg, dist, workdir, sink, owner, tok, model, rollout_model, scorer, net, ref,
               opt, engine, reward_fn, source, held, data_rng, drift, compute=compute)


def _frozen_copy(model, dtype: str | None = None):
    """An unsharded copy of `model` without gradients (made before any sharding), its
    parameters in `dtype` where named."""
    if dtype is not None:
        return precision.cast_copy(model, getattr(torch, dtype)).eval()
    import copy

    return copy.deepcopy(model).eval().requires_grad_(False)


def _sync_engine(run: Run) -> None:
    """Re-cast the update's compute copy and hand the rollout engine the current weights
    (under FSDP gathered into its copy first: every rank takes part)."""
    shared = run.compute is not None and run.rollout_model is run.compute.model
    if run.compute is not None:
        run.compute.refresh()
    if run.rollout_model is not run.model and not shared:
        sharding.copy_full_weights(run.model, run.rollout_model)
    run.engine.sync(run.rollout_model)


def _resume(run: Run, ckpt: Path | None) -> dict | None:
    """Load model, optimizer, counters, data position and RNGs of `ckpt`; returns the adaptive
    controller's saved state (None for a fresh run)."""
    if ckpt is None:
        return None
    main, rng = checkpoint.load(ckpt, run.dist.rank)
    _load_state(run, main, rng)
    _say_resumed(run, ckpt)
    return main.get("controller")


def _say_resumed(run: Run, ckpt: Path) -> None:
    """Record where a resumed run goes on from as an event of the run: the steps after the
    checkpoint are trained again and their rows rewritten, whatever the store held past it."""
    if run.writes:
        run.sink.event(f"resumed from step {run.step} ({run.samples} samples; checkpoint "
                       f"{ckpt}): the next step is {run.step + 1}")


def _start_branch(run: Run, branch: Branch) -> None:
    """Start a branch (`trainer.adaptive.branch`): the parent checkpoint's state, with the branch
    config's Adam betas and eps over the parent's moments; replicate r > 0 reseeds the
    sampling and data streams."""
    ckpt = branch.checkpoint()
    if ckpt is not None:
        main, rng = checkpoint.load(ckpt, run.dist.rank)
        if len(main["data"]) != run.dist.world:
            raise ConfigError(f"branch: checkpoint {ckpt} was written by {len(main['data'])} "
                              f"process(es); this branch runs {run.dist.world}")
        _load_state(run, main, rng)
        for group in run.opt.param_groups:  # load_state_dict took the parent's
            group["betas"] = (run.cfg.adam_beta1, run.cfg.adam_beta2)
            group["eps"] = run.cfg.adam_epsilon
    if branch.replicate:
        torch_seed, data_seed = stream_seeds(run.cfg.seed, branch.replicate)
        torch.manual_seed(torch_seed + run.dist.rank)
        run.data_rng.bit_generator.state = np.random.default_rng(data_seed).bit_generator.state


def _load_state(run: Run, main: dict, rng: dict) -> None:
    """Put a checkpoint's model, optimizer, counters, data position and RNGs into `run`."""
    if run.dist.sharded:  # full tensors in the checkpoint: each rank keeps its slices
        sharding.load_full_state(run.model, main["model"])
        sharding.load_optimizer_state(run.opt, main["optimizer"])
    else:
        run.model.load_state_dict(main["model"])
        run.opt.load_state_dict(main["optimizer"])
    run.step, run.samples = main["step"], main["samples"]
    run.source.load_state(main["data"][run.dist.rank])
    checkpoint.restore_rng(rng, run.data_rng)
    _sync_engine(run)


def _save(run: Run) -> None:
    """Checkpoint the run (every rank calls this; rank 0 writes the shared state)."""
    dist = run.dist
    states = [None] * dist.world
    if dist.world > 1:
        torch.distributed.all_gather_object(states, run.source.state())
    else:
        states = [run.source.state()]
    main = model = optimizer = None
    if dist.sharded:  # gathered on every rank (collective), in the single-process layout
        model, optimizer = sharding.full_state(run.model), sharding.full_optimizer_state(run.opt)
    elif dist.rank == 0:
        model, optimizer = run.model.state_dict(), run.opt.state_dict()
    if dist.rank == 0:
        main = {
            "model": model,
            "optimizer": optimizer,
            "step": run.step,
            "samples": run.samples,
            "data": states,
            "controller": None if run.ctl is None else run.ctl.to_dict(),
        }
    run.flush()  # metrics never lag the checkpoint
    checkpoint.save(
        run.workdir, run.step, dist.rank, main, checkpoint.rng_state(run.data_rng),
        dist.barrier, owner=run.owner.record if dist.rank == 0 else None,
    )


def _phase(run: Run):
    """(phase index, phase) of the next step — the adaptive controller's batch and lr with the
    config's clip range, when it runs — with the optimizer's lr set to it."""
    phase_index, phase = run.cfg.phase_at(run.samples)
    if run.ctl is not None:
        phase_index = run.ctl.decisions
        phase = phase.model_copy(update={"prompts_per_batch": run.ctl.prompts,
                                         "lr": run.ctl.lr, "until_samples": None})
    phase = _warmed(run, phase)
    for group in run.opt.param_groups:
        group["lr"] = phase.lr
    return phase_index, phase


def _warmed(run: Run, phase):
    """`phase` with the lr of the config's warm-up at the run's sample count (the lr logged)."""
    lr = run.cfg.warm_lr(phase.lr, run.samples, phase.prompts_per_batch * run.cfg.group_size)
    return phase if lr == phase.lr else phase.model_copy(update={"lr": lr})


def _sample(run: Run, phase) -> tuple[list[Problem], object]:
    """(this rank's problems, each repeated G times; their rollout); a non-finite sampling
    distribution on any rank raises Diverged on every rank."""
    from trainer.rollout.hf import NonFiniteLogits

    cfg, dist = run.cfg, run.dist
    local = phase.prompts_per_batch // dist.world
    problems = run.source.sample(run.data_rng, phase.prompts_per_batch)
    problems = problems[dist.rank * local : (dist.rank + 1) * local]
    expanded = [p for p in problems for _ in range(cfg.group_size)]
    roll, bad = None, 0.0
    try:
        roll = run.engine.generate([prompt_text(p, cfg, run.tok) for p in expanded])
    except NonFiniteLogits:
        bad = 1.0
    if dist.sum([bad])[0] > 0:  # every rank stops together
        raise Diverged("non-finite sampling distribution")
    return expanded, roll


def _advantages(run: Run, batch: Batch) -> None:
    """Group advantages, with the reward mean/std pooled over every rank's samples."""
    rewards, dist = batch.rewards, run.dist
    r_sum, r_sq, n_all = dist.sum(
        [float(rewards.sum()), float((rewards.double() ** 2).sum()), len(rewards)]
    )
    batch.n_all, batch.r_mean = n_all, r_sum / n_all
    batch.r_std = math.sqrt(
        max(r_sq / n_all - batch.r_mean**2, 0.0) * n_all / max(n_all - 1, 1)
    )
    batch.adv = grpo.group_advantages(
        rewards, run.cfg.group_size, run.cfg.advantage_scaling, batch_std=batch.r_std
    )


def _logprobs_before_update(run: Run, batch: Batch):
    """The forwards needed before the update: the rollout policy's log-probs and entropy of
    every row (off-policy) or, on-policy, only of the rows the update skips — returned as
    (index, log-probs, entropy), the update's own forward gives the rest — and the reference's
    log-probs when a KL term is due. Skipped rows take the sampler's numbers instead when the
    engine's are the policy's own (`Rollout.sampler_entropy`): no forward at all for them.
    When the sampler differs (another precision or engine) only the skipped rows are scored
    here, in the update's compute precision: the logged `entropy` and `kl_init` cover every row
    (the failure clock's entropy band reads them, and the skipped groups, all right or all
    wrong, are not a sample of the others), while the trained rows' come off the update."""
    cfg, roll = run.cfg, batch.roll
    rest = None
    if not on_policy(cfg):
        batch.old_logp, batch.entropy = no_grad_logprobs(run.scoring, roll, cfg, True, run.dist)
    else:
        idx = (batch.adv == 0).nonzero().flatten()  # the rows the update leaves out
        if not skips_zero_advantage(cfg):
            idx = idx[:0]
        rest = (idx, None, None)
        if roll.sampler_entropy is not None:  # every rank alike (one engine kind): no forward
            if len(idx):  # NaN off the mask -> 0: every use of them is masked
                rest = (idx, roll.sampler_logp[idx].nan_to_num(0.0),
                        roll.sampler_entropy[idx].nan_to_num(0.0))
                batch.from_sampler = idx
        elif len(idx) or (run.dist.sharded and skips_zero_advantage(cfg)):  # FSDP: every rank
            rest = (idx, *no_grad_logprobs(run.scoring, roll, cfg, True, run.dist, rows=idx))
    if run.ref is not None and (batch.kl_due or cfg.kl_coef > 0):
        batch.ref_logp, _ = no_grad_logprobs(run.ref, roll, cfg, False, run.dist)
    return rest


def _logprobs_after_update(batch: Batch, st: UpdateStats, rest) -> None:
    """On-policy: the rollout policy's log-probs/entropy are the update's, with the skipped
    rows' (`rest`) from their own forward."""
    if rest is None:
        return
    idx, rest_logp, rest_entropy = rest
    batch.entropy, batch.old_logp = st.entropy, st.logp
    if len(idx):
        batch.entropy[idx], batch.old_logp[idx] = rest_entropy, rest_logp


def step_metrics(run: Run, batch: Batch, st: UpdateStats, phase, phase_index: int,
                 t0: float) -> dict:
    """Every metric of one step, pooled over ranks (sums and counts first, divided once)."""
    cfg, dist, roll, rewards = run.cfg, run.dist, batch.roll, batch.rewards
    g, n_all = cfg.group_size, batch.n_all
    cm = roll.completion_mask.float()
    lens = cm.sum(1)
    zero = grpo.zero_std_groups(rewards, g)
    ent_s, tokens = M.masked_mean(batch.entropy, cm)
    kl_s = (M.masked_mean(M.kl_to_init(batch.old_logp, batch.ref_logp), cm)[0]
            if batch.kl_due else 0.0)
    sums = {
        "hits": float((rewards >= 1.0).sum()),
        "zero": float(zero.sum()),
        "groups": float(zero.numel()),
        "ent": ent_s,
        "tokens": tokens,
        "kl_init": kl_s,
        "trunc": float(roll.truncated.sum()),
        "loss": st.loss,
        "c_low": st.clip_low,
        "c_high": st.clip_high,
        "c_tok": max(st.clip_tokens, 1.0),
        "kl_on": st.kl_old_new,
        "tr_tok": st.trained_tokens,
        "tis_w": st.tis_weight,
        "tis_hit": st.tis_capped,
    }
    if roll.sampler_logp is not None:  # over the rows the trainer itself scored
        own = cm if batch.from_sampler is None else cm.index_fill(0, batch.from_sampler, 0.0)
        sums["s_abs"], sums["s_k3"], sums["s_n"] = sampler.mismatch_sums(
            batch.old_logp, roll.sampler_logp, own)
    S = dict(zip(sums, dist.sum(list(sums.values())), strict=True))  # summed over ranks
    elapsed = time.perf_counter() - t0
    d_abs, d_rel = run.drift(run.model)
    values = {
        "reward_mean": batch.r_mean,
        "reward_std": batch.r_std,
        "accuracy": S["hits"] / n_all,
        "zero_std_frac": S["zero"] / S["groups"],
        "entropy": S["ent"] / S["tokens"],
        "drift_abs": d_abs,
        "drift_rel": d_rel,
        "grad_norm": sum(st.grad_norms) / len(st.grad_norms),
        "lr": phase.lr,
        "batch_samples": n_all,
        "prompts": n_all // g,
        "phase": phase_index,
        "loss": S["loss"] / cfg.updates_per_batch,
        "clip_frac": (S["c_low"] + S["c_high"]) / S["c_tok"],
        "clip_frac_low": S["c_low"] / S["c_tok"],
        "clip_frac_high": S["c_high"] / S["c_tok"],
        "approx_kl": S["kl_on"] / max(S["tr_tok"], 1.0),
        "resp_len_mean": S["tokens"] / n_all,
        "resp_len_max": dist.max(float(lens.max())),
        "truncated_frac": S["trunc"] / n_all,
        **batch.times,
        "tokens_per_s": S["tokens"] / elapsed,
        "nonfinite": 0.0,
    }
    if st.micro_size:  # a step that measured the gradient-noise terms (noise_every)
        values.update(grad_sq_micro=st.grad_sq_micro, grad_sq_full=st.grad_sq_full,
                      grad_micro_size=st.micro_size, grad_full_size=st.full_size)
    if batch.kl_due:
        values["kl_init"] = S["kl_init"] / S["tokens"]
    if S.get("s_n"):  # the engine's log-probs against the trainer's, on the sampled tokens
        values["sampler_abs_logratio"] = S["s_abs"] / S["s_n"]
        values["sampler_kl_k3"] = S["s_k3"] / S["s_n"]
    if cfg.tis_cap is not None and S["tr_tok"]:  # a step that trained no token has no weights
        values["tis_weight_mean"] = S["tis_w"] / S["tr_tok"]
        values["tis_capped_frac"] = S["tis_hit"] / S["tr_tok"]
    return values


# Batches at the start of a run looked at before saying that nothing can be learned.
NO_SIGNAL_STEPS = 2


def _warn_without_signal(run: Run, values: dict) -> None:
    """When every group of a new run's first NO_SIGNAL_STEPS batches had equal rewards, every
    advantage is 0 and nothing can be learned (often a reward that never accepts the model's
    answer format): say so once, on stderr and as a note of the run."""
    if run.step > NO_SIGNAL_STEPS or run.dist.rank != 0:
        return
    run.flat_steps += values["zero_std_frac"] == 1.0
    if run.step < NO_SIGNAL_STEPS or run.flat_steps < NO_SIGNAL_STEPS:
        return
    message = (f"no learning signal: every group of the first {NO_SIGNAL_STEPS} batches has zero "
               f"advantage (equal rewards within each group; reward mean "
               f"{values['reward_mean']:.3f}): check that the reward accepts the answers as the "
               "model writes them")
    print(f"warning: {message}", file=sys.stderr, flush=True)
    if run.writes:
        run.sink.event(message)


def _train_step(run: Run, phase, phase_index: int) -> tuple[dict, Batch]:
    """One GRPO step at `phase`'s batch and lr: sample, reward, advantages, update; returns
    the step's metrics (before evaluation) and its batch. Advances the run's counters."""
    cfg, dist = run.cfg, run.dist
    t0 = time.perf_counter()
    run.step += 1

    # --- 1. sample, 2. reward, 3. advantages -------------------------------------------------
    expanded, roll = _sample(run, phase)
    t_gen = time.perf_counter() - t0
    batch = Batch(roll, torch.tensor(run.reward_fn(roll.texts, expanded), dtype=torch.float32))
    t_reward = time.perf_counter() - t0 - t_gen
    _advantages(run, batch)

    # --- 4. update (with the log-probs it and the metrics need) --------------------------------
    batch.kl_due = cfg.kl_init_every > 0 and run.step % cfg.kl_init_every == 0
    t1 = time.perf_counter()
    rest = _logprobs_before_update(run, batch)
    noise = cfg.noise_every > 0 and run.step % cfg.noise_every == 0
    st = update(run.net, run.opt, roll, batch.adv, batch.old_logp, batch.ref_logp, cfg,
                phase, dist, noise, run.compute)
    _logprobs_after_update(batch, st, rest)
    _sync_engine(run)
    batch.times = {"time_gen_s": t_gen, "time_reward_s": t_reward,
                   "time_update_s": time.perf_counter() - t1}
    run.samples += phase.prompts_per_batch // dist.world * cfg.group_size * dist.world

    # --- 5. metrics ----------------------------------------------------------------------------
    return step_metrics(run, batch, st, phase, phase_index, t0), batch


class _Steps:
    """This loop's steps for the in-run branches (`inrun.LoopSteps`); each is looked up at
    its call, so the module's current functions run."""

    def train_step(self, run, phase, phase_index):
        return _train_step(run, phase, phase_index)

    def evaluate(self, engine, reward_fn, held, cfg, tokenizer, seed_step):
        return evaluate(engine, reward_fn, held, cfg, tokenizer, seed_step)

    def sync(self, run):
        _sync_engine(run)

    def warmed(self, run, phase):
        return _warmed(run, phase)


def _steps() -> inrun.LoopSteps:
    """This loop's step pieces for the in-run branches."""
    return _Steps()


def _eval_due(cfg: TrainConfig, samples: int, n_all: int) -> bool:
    """Whether this step crossed an `eval_every_samples` boundary or ended the budget."""
    every = cfg.eval_every_samples
    return every > 0 and (samples // every > (samples - n_all) // every
                          or samples >= cfg.sample_budget)


def _checkpoint_due(cfg: TrainConfig, step: int, samples: int) -> bool:
    """Every `checkpoint_every_steps` steps, and at the end."""
    every = cfg.checkpoint_every_steps
    return bool(every and step % every == 0) or samples >= cfg.sample_budget


def train(
    cfg: TrainConfig,
    sink: MetricSink | None,
    workdir: Path,
    on_step: Callable[[Progress], None] | None = None,
    extend: bool = False,
    make_rollout: Callable | None = None,
    controller: ControllerFactory | None = None,
    owner: Owner | None = None,
    branch: Branch | None = None,
) -> str:
    """Run (or resume from `workdir`) one GRPO training; returns 'completed' or 'diverged'.

    `sink` takes the metrics and events (only rank 0's is used; other ranks may pass None).
    `controller(saved state or None)` gives the adaptive controller (needed when
    batch_schedule = "adaptive"). `owner` owns the checkpoints (default: the config alone): a
    checkpoint in `workdir` it refuses (another store/run or config) is refused (ConfigError)
    before anything is loaded; `extend` lets a resume raise sample_budget only.
    `make_rollout(cfg, model, tok, path)` replaces the configured rollout engine (e.g. one
    that feeds every world size the same batch). `branch` starts a training without a
    checkpoint of its own from another's (`trainer.adaptive.branch`).
    """
    # --- set up, resume ------------------------------------------------------------------
    workdir = Path(workdir)
    dist = setup_dist()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    deterministic_kernels(dist.device)
    _check_world(cfg, dist)
    _check_controller(cfg, controller)
    if owner is None:
        owner = CheckpointOwner(cfg.model_dump(mode="json"))
    ckpt = _claim_checkpoint(owner, workdir, dist, extend)
    # the config as written stays the owner's
    prec = precision.resolve(cfg, dist.device, alone=dist.world == 1)
    run = _set_up(precision.settle(cfg, prec), sink, workdir, dist, owner, make_rollout,
                  prec.computes_on_copy)
    precision.announce(run, prec, cfg)
    saved = _resume(run, ckpt)  # the controller's state, for a resumed adaptive run
    if ckpt is None and branch is not None:
        _start_branch(run, branch)
    run.ctl = controller(saved) if cfg.batch_schedule == "adaptive" else None

    try:
        if run.step == 0 and cfg.eval_every_samples > 0 and dist.rank == 0:
            values = {"eval_accuracy": evaluate(run.engine, run.reward_fn, run.held, cfg,
                                                run.tok, 0), "eval_n": len(run.held)}
            inrun.initial(run, values)
            run.log(0, 0, values)
        while run.samples < cfg.sample_budget:
            phase_index, phase = _phase(run)
            values, batch = _train_step(run, phase, phase_index)
            _warn_without_signal(run, values)
            # --- 6. eval, before the controller: its failure guard reads the evaluation ------
            eval_acc = None
            if _eval_due(cfg, run.samples, batch.n_all) and dist.rank == 0:
                eval_acc = values["eval_accuracy"] = evaluate(
                    run.engine, run.reward_fn, run.held, cfg, run.tok, run.step
                )
                values["eval_n"] = len(run.held)
            branches: dict = {}
            decision = inrun.adapt(run, values, branches, _steps())
            run.log(run.step, run.samples, values)
            if run.writes:
                run.sink.flush()
                if decision is not None:
                    run.sink.event(decision.reason)
            if on_step is not None and dist.rank == 0:
                on_step(Progress(run.step, run.samples, cfg.sample_budget, batch.r_mean,
                                 values["accuracy"], eval_acc))
            if branches:
                inrun.adopt(run, branches, decision.prompts, _steps())

            # --- 7. checkpoint ----------------------------------------------------------------
            if _checkpoint_due(cfg, run.step, run.samples) or branches:
                _save(run)
        return "completed"
    except Diverged:
        run.log(run.step, run.samples, {"nonfinite": 1.0})
        run.flush()
        return "diverged"
    finally:
        close = getattr(run.reward_fn, "close", None)
        if close is not None:
            close()
