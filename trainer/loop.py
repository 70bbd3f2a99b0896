"""The GRPO training loop, read top to bottom: set up, resume, then per step sample → reward →
advantages → update (gradient accumulation) → metrics → eval → checkpoint.

One function, `train(cfg, writer, workdir)`, serves `twoclocks train`, a sweep job (through
`trainer.backend.run`) and `accelerate launch` (several processes: each rank samples its share
of the prompts, gradients are summed across ranks, rank 0 writes metrics and checkpoints).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from trainer import checkpoint, grpo
from trainer import metrics as M
from trainer.config import TrainConfig
from trainer.data import (
    ArithmeticTask,
    Problem,
    load_hf_problems,
    load_problems,
    render_prompt,
)
from trainer.dist import Dist, setup_dist
from trainer.logprobs import completion_logprobs
from twoclocks_cli.adaptive import MODES, decision_metrics
from twoclocks_cli.errors import ConfigError

EVAL_SEED = 20_240_601  # one held-out set shared by every cell, so cells compare on equal terms


class Diverged(Exception):
    """The loss, a gradient or the sampling distribution became non-finite."""


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


def _read(spec: str, cfg: TrainConfig) -> list[Problem]:
    """Problems of a file or `hf:` dataset spec."""
    if spec.startswith("hf:"):
        return load_hf_problems(spec, cfg.dataset_split, cfg.question_key, cfg.answer_key)
    return load_problems(spec, cfg.question_key, cfg.answer_key)


def load_data(cfg: TrainConfig):
    """(training source, held-out problems) for `cfg`; bad files raise ConfigError."""
    if cfg.dataset == "builtin:arithmetic":
        task = ArithmeticTask(cfg.arith_min_value, cfg.arith_max_value, tuple(cfg.arith_ops))
        train = TaskSource(task)
        held = task.heldout(cfg.eval_size, EVAL_SEED)
    elif cfg.dataset.startswith("builtin:"):
        raise ConfigError(
            f"unknown built-in dataset {cfg.dataset!r}: allowed is 'builtin:arithmetic'"
        )
    else:
        problems = _read(cfg.dataset, cfg)
        if cfg.eval_dataset is None:
            if len(problems) <= cfg.eval_size:
                raise ConfigError(
                    f"{cfg.dataset}: {len(problems)} rows, but eval_size = {cfg.eval_size} rows "
                    "are held out from it: set eval_dataset or a smaller eval_size"
                )
            problems, held = problems[: -cfg.eval_size], problems[-cfg.eval_size :]
        train = FileSource(problems)
    if cfg.eval_dataset is not None:
        held = _read(cfg.eval_dataset, cfg)[: cfg.eval_size]
    return train, held


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
    except OSError as err:
        raise ConfigError(
            f"model {cfg.model!r}: cannot load ({str(err).splitlines()[0]})"
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
# Log-probs and the update
# ---------------------------------------------------------------------------------------------
def no_grad_logprobs(model, rollout, cfg, with_entropy: bool):
    """Log-probs (and entropy) of every sample, in micro-batches, without building a graph."""
    lps, ents = [], []
    with torch.no_grad():
        for idx in torch.arange(len(rollout.texts)).split(cfg.micro_batch_size):
            lp, ent = completion_logprobs(model, rollout.select(idx), cfg.temperature, with_entropy)
            lps.append(lp)
            ents.append(ent)
    return torch.cat(lps), (torch.cat(ents) if with_entropy else None)


def skips_zero_advantage(cfg: TrainConfig) -> bool:
    """Whether the update leaves out samples with advantage 0 (exact only without a KL term)."""
    return cfg.skip_zero_advantage and cfg.kl_coef == 0


@dataclass
class UpdateStats:
    """Sums pooled over micro-batches and updates of one step (divided at the end)."""

    loss: float = 0.0
    clip_low: float = 0.0
    clip_high: float = 0.0
    clip_tokens: float = 0.0
    kl_old_new: float = 0.0
    trained_tokens: float = 0.0
    grad_norms: list[float] = field(default_factory=list)
    grad_sq_micro: float = math.nan
    grad_sq_full: float = math.nan
    micro_size: int = 0
    full_size: int = 0
    entropy: torch.Tensor | None = None  # [N, C] rows trained on-policy (others stay NaN)
    logp: torch.Tensor | None = None  # [N, C] their sampled tokens' log-probs, likewise


def _micro_backward(model, rollout, idx, adv, old_logp, ref_logp, cmask, den, cfg, phase,
                    stats: UpdateStats) -> float:
    """Forward and backward of the rows `idx` (their loss over the minibatch's normaliser
    `den`); adds their clip/KL/token counts to `stats` and returns the loss value."""
    on_policy = stats.logp is not None
    logp, ent = completion_logprobs(model, rollout.select(idx), cfg.temperature, on_policy)
    if on_policy:
        stats.entropy[idx] = ent
        stats.logp[idx] = logp.detach()
    old = logp.detach() if on_policy else old_logp[idx]
    m = cmask[idx]
    tok_loss, low, high = grpo.clipped_surrogate(
        logp, old, adv[idx], phase.clip_eps_low, phase.clip_eps_high
    )
    if cfg.kl_coef > 0:
        tok_loss = tok_loss + cfg.kl_coef * grpo.k3(logp, ref_logp[idx])
    loss = grpo.aggregate(tok_loss, m, cfg.loss_agg, cfg.max_new_tokens, den)
    loss.backward()
    stats.clip_low += float((low.float() * m).sum())
    stats.clip_high += float((high.float() * m).sum())
    stats.kl_old_new += float(((old - logp.detach()) * m).sum())
    stats.trained_tokens += float(m.sum())
    return float(loss.detach())


def _idle_backward(net, rollout) -> None:
    """A zero-gradient forward/backward of one token, so a rank with nothing to train in the
    last micro-batch still joins DDP's all-reduce (every rank must run the synced backward)."""
    device = next(net.parameters()).device
    ids = rollout.input_ids[:1, -1:].to(device)
    out = net(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    (out.float().sum() * 0.0).backward()


def update(model, opt, rollout, adv, old_logp, ref_logp, cfg, phase, dist: Dist) -> UpdateStats:
    """`ppo_epochs * num_minibatches` optimizer steps on one rollout batch.

    Each minibatch is split into micro-batches of `micro_batch_size` samples whose gradients
    accumulate against the minibatch's global normaliser (summed over ranks), so the result
    equals one pass over the whole minibatch. Raises Diverged on a non-finite loss or gradient.
    """
    stats = UpdateStats()
    n = len(rollout.texts)
    cmask = rollout.completion_mask.float()
    skip = skips_zero_advantage(cfg)
    on_policy = cfg.updates_per_batch == 1
    if on_policy:  # the only forward sees the rollout policy: keep its log-probs and entropy
        stats.entropy = torch.full(cmask.shape, math.nan)
        stats.logp = torch.full(cmask.shape, math.nan)
    first = True
    for _epoch in range(cfg.ppo_epochs):
        order = torch.randperm(n) if cfg.num_minibatches > 1 else torch.arange(n)
        for mb in order.tensor_split(cfg.num_minibatches):
            den = dist.sum([grpo.normaliser(cmask[mb], cfg.loss_agg)])[0]
            dist.zero_grad(model, opt)
            bad_loss = False
            # the first minibatch is split in at least two, so grad_sq_micro != grad_sq_full
            size = min(cfg.micro_batch_size, -(-len(mb) // 2)) if first else cfg.micro_batch_size
            micros = mb.split(size)
            for k, micro in enumerate(micros):
                train_idx = micro[adv[micro] != 0] if skip else micro
                last = k == len(micros) - 1  # only the last backward all-reduces (DDP)
                if last and not len(train_idx) and dist.synced(model):
                    _idle_backward(model, rollout)  # this rank's share of the sync
                with contextlib.nullcontext() if last else dist.no_sync(model):
                    if len(train_idx):
                        value = _micro_backward(
                            model, rollout, train_idx, adv, old_logp, ref_logp, cmask, den,
                            cfg, phase, stats,
                        )
                        bad_loss = bad_loss or not math.isfinite(value)
                        stats.loss += value
                stats.clip_tokens += float(cmask[micro].sum())
                if first and k == 0:  # gradient of one micro-batch, scaled to its own mean
                    micro_den = grpo.normaliser(cmask[micro], cfg.loss_agg)
                    scale = den / micro_den if micro_den else 0.0
                    stats.grad_sq_micro = M.grad_sq_norm(model) * scale**2
                    stats.micro_size = len(micro)
            if dist.sum([float(bad_loss)])[0] > 0:  # every rank stops together
                raise Diverged("non-finite loss")
            for p in model.parameters():  # a batch with nothing to learn still steps AdamW
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
            if first:
                stats.grad_sq_full = M.grad_sq_norm(model)
                stats.full_size = int(dist.sum([len(mb)])[0])
            clip_to = cfg.max_grad_norm if cfg.max_grad_norm is not None else math.inf
            params = [p for p in model.parameters() if p.requires_grad]
            norm = float(torch.nn.utils.clip_grad_norm_(params, clip_to))
            if not math.isfinite(norm):
                raise Diverged("non-finite gradient")
            stats.grad_norms.append(norm)
            opt.step()
            first = False
    return stats


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------
def evaluate(engine, reward_fn, held: list[Problem], cfg, tokenizer, step: int) -> float:
    """Held-out accuracy, sampled with a private seeded RNG so training's streams never move."""
    hits = 0.0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(EVAL_SEED + step)
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


def _controller(cfg: TrainConfig, writer, state: dict | None):
    """(controller, event recorder) of an adaptive run, restored from `state`; else (None, None).

    A fresh run calibrates from `adaptive.from_sweep` in the writer's store (recorded as an
    event); a resumed one carries its calibration in the checkpointed state."""
    if cfg.batch_schedule != "adaptive":
        return None, None
    from twoclocks_cli.adaptive import Controller, calibrate, record_event

    store = None
    if writer is not None and getattr(writer, "engine", None) is not None:
        from twoclocks_cli.store import Store

        store = Store(writer.engine)
    base = cfg.phase_at(0)[1]
    if state is not None:
        ctl = Controller(cfg.adaptive, cfg.group_size, base.prompts_per_batch, base.lr,
                         state=state)
    else:
        if cfg.adaptive.from_sweep is not None and store is None:
            raise ConfigError("adaptive.from_sweep needs a store to read the sweep's analysis")
        cal = calibrate(store, cfg.adaptive) if store is not None else {}
        ctl = Controller(cfg.adaptive, cfg.group_size, base.prompts_per_batch, base.lr,
                         calibration=cal)
        if cal:
            record_event(store, writer.run_id, f"adaptive calibration from sweep "
                         f"{cal['from_sweep']!r}: kappa {ctl.state.kappa:.4g} ({cal['kappa_why']})"
                         f"; drift_threshold {ctl.state.drift_threshold} ({cal['drift_why']})")

    def event(message: str) -> None:
        if store is not None:
            record_event(store, writer.run_id, message)

    return ctl, event


def train(
    cfg: TrainConfig,
    writer,
    workdir: Path,
    on_step: Callable[[Progress], None] | None = None,
    extend: bool = False,
    make_rollout: Callable | None = None,
) -> str:
    """Run (or resume from `workdir`) one GRPO training; returns 'completed' or 'diverged'.

    `writer` is a MetricWriter (only rank 0's is used; other ranks may pass None). A checkpoint
    in `workdir` of another store/run or config is refused (ConfigError) before anything is
    loaded; `extend` lets a resume raise sample_budget only. `make_rollout(cfg, model, tok,
    path)` replaces the configured rollout engine (tests feed every world size one batch).
    """
    from trainer.rewards import load_reward
    from trainer.rollout import make_engine
    from trainer.rollout.hf import NonFiniteLogits

    workdir = Path(workdir)
    dist = setup_dist()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    deterministic_kernels(dist.device)
    if cfg.batch_schedule == "adaptive" and dist.world > 1:
        raise ConfigError("batch_schedule = \"adaptive\" runs in one process for now (the "
                          f"controller's batch is not kept divisible by {dist.world} ranks)")
    for i, ph in enumerate(cfg.phases or [cfg.phase_at(0)[1]]):
        if ph.prompts_per_batch % dist.world:
            raise ConfigError(
                f"phases[{i}].prompts_per_batch = {ph.prompts_per_batch} is not "
                f"divisible by the {dist.world} data-parallel processes"
            )
    log = writer.log if (writer is not None and dist.rank == 0) else (lambda *a, **k: None)

    # --- whose checkpoint: refused before any work if it is another run's or config's ------
    owner = checkpoint.owner_record(cfg.model_dump(mode="json"), writer)
    ckpt = checkpoint.latest(workdir)
    problem = checkpoint.refusal(ckpt, owner, extend) if ckpt and dist.rank == 0 else None
    if dist.sum([1.0 if problem else 0.0])[0] > 0:  # every rank stops together
        raise ConfigError(problem or f"rank 0 refused the checkpoint in {workdir}")

    # --- model, reference, optimizer, data, rewards --------------------------------------
    torch.manual_seed(cfg.seed * 7919 + dist.rank)
    # one prompt stream whatever the world size: every rank draws the global batch and keeps
    # its slice, so 1 and N processes train on the same prompts
    data_rng = np.random.default_rng([cfg.seed, 0])
    model_path, tok, model = load_model(cfg, dist.device)
    model.train()
    theta0 = M.flat_params(model)
    need_ref = cfg.kl_coef > 0 or cfg.kl_init_every > 0
    ref = None
    if need_ref:
        import copy

        ref = copy.deepcopy(model).eval().requires_grad_(False)
    net, opt = dist.prepare(model, make_optimizer(model, cfg))  # net: what backward runs on
    source, held = load_data(cfg)
    reward_fn = load_reward(cfg.reward)
    engine = (make_rollout or make_engine)(cfg, model, tok, model_path)  # unwrapped weights
    step, samples = 0, 0

    # --- resume ----------------------------------------------------------------------------
    if ckpt is not None:
        main, rng = checkpoint.load(ckpt, dist.rank)
        model.load_state_dict(main["model"])
        opt.load_state_dict(main["optimizer"])
        step, samples = main["step"], main["samples"]
        source.load_state(main["data"][dist.rank])
        checkpoint.restore_rng(rng, data_rng)
        engine.sync(model)
    ctl, event = _controller(cfg, writer, main.get("controller") if ckpt is not None else None)

    def save() -> None:
        states = [None] * dist.world
        if dist.world > 1:
            torch.distributed.all_gather_object(states, source.state())
        else:
            states = [source.state()]
        main = (
            {
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "step": step,
                "samples": samples,
                "data": states,
                "controller": None if ctl is None else ctl.to_dict(),
            }
            if dist.rank == 0
            else None
        )
        if writer is not None and dist.rank == 0:
            writer.flush()  # metrics never lag the checkpoint
        checkpoint.save(
            workdir, step, dist.rank, main, checkpoint.rng_state(data_rng), dist.barrier,
            owner=owner if dist.rank == 0 else None,
        )

    try:
        if step == 0 and cfg.eval_every_samples > 0 and dist.rank == 0:
            log(0, 0, {"eval_accuracy": evaluate(engine, reward_fn, held, cfg, tok, 0),
                       "eval_n": len(held)})
        while samples < cfg.sample_budget:
            phase_index, phase = cfg.phase_at(samples)
            if ctl is not None:  # the controller's batch and lr, the config's clip range
                phase_index = ctl.state.decisions
                phase = phase.model_copy(update={"prompts_per_batch": ctl.prompts,
                                                 "lr": ctl.lr, "until_samples": None})
            for group in opt.param_groups:
                group["lr"] = phase.lr
            g = cfg.group_size
            local_prompts = phase.prompts_per_batch // dist.world
            t0 = time.perf_counter()
            step += 1

            # --- 1. rollouts -------------------------------------------------------------
            problems = source.sample(data_rng, phase.prompts_per_batch)
            problems = problems[dist.rank * local_prompts : (dist.rank + 1) * local_prompts]
            expanded = [p for p in problems for _ in range(g)]
            roll, bad = None, 0.0
            try:
                roll = engine.generate([prompt_text(p, cfg, tok) for p in expanded])
            except NonFiniteLogits:
                bad = 1.0
            if dist.sum([bad])[0] > 0:  # every rank stops together
                raise Diverged("non-finite sampling distribution")
            t_gen = time.perf_counter() - t0

            # --- 2. rewards and advantages ----------------------------------------------
            rewards = torch.tensor(reward_fn(roll.texts, expanded), dtype=torch.float32)
            t_reward = time.perf_counter() - t0 - t_gen
            n_local = len(expanded)
            r_sum, r_sq, n_all = dist.sum(
                [float(rewards.sum()), float((rewards.double() ** 2).sum()), n_local]
            )
            r_mean = r_sum / n_all
            r_std = math.sqrt(max(r_sq / n_all - r_mean**2, 0.0) * n_all / max(n_all - 1, 1))
            adv = grpo.group_advantages(rewards, g, cfg.advantage_scaling, batch_std=r_std)

            # --- 3. log-probs the update and the metrics need ------------------------------
            kl_due = cfg.kl_init_every > 0 and step % cfg.kl_init_every == 0
            # (one on-policy update: its own forward gives the rollout policy's log-probs and
            # entropy of the samples it trains on; only skipped ones need a forward of their own)
            t1 = time.perf_counter()
            lean = cfg.updates_per_batch == 1
            old_logp = entropy = ref_logp = None
            if not lean:
                old_logp, entropy = no_grad_logprobs(model, roll, cfg, with_entropy=True)
            else:
                rest = (adv == 0).nonzero().flatten()  # the rows the update leaves out
                if not skips_zero_advantage(cfg):
                    rest = rest[:0]
                if len(rest):
                    rest_logp, rest_entropy = no_grad_logprobs(model, roll.select(rest), cfg, True)
            if ref is not None and (kl_due or cfg.kl_coef > 0):
                ref_logp, _ = no_grad_logprobs(ref, roll, cfg, with_entropy=False)

            # --- 4. the update --------------------------------------------------------------
            st = update(net, opt, roll, adv, old_logp, ref_logp, cfg, phase, dist)
            if lean:
                entropy, old_logp = st.entropy, st.logp
                if len(rest):
                    entropy[rest], old_logp[rest] = rest_entropy, rest_logp
            engine.sync(model)
            t_update = time.perf_counter() - t1
            samples += local_prompts * g * dist.world

            # --- 5. metrics (pooled over ranks; rank 0 writes) ---------------------------------
            cm = roll.completion_mask.float()
            lens = cm.sum(1)
            zero = grpo.zero_std_groups(rewards, g)
            ent_s, tokens = M.masked_mean(entropy, cm)
            kl_s = M.masked_mean(M.kl_to_init(old_logp, ref_logp), cm)[0] if kl_due else 0.0
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
                "tr_tok": max(st.trained_tokens, 1.0),
            }
            S = dict(zip(sums, dist.sum(list(sums.values())), strict=True))  # summed over ranks
            elapsed = time.perf_counter() - t0
            d_abs, d_rel = M.drift(model, theta0)
            ups = cfg.updates_per_batch
            values = {
                "reward_mean": r_mean,
                "reward_std": r_std,
                "accuracy": S["hits"] / n_all,
                "zero_std_frac": S["zero"] / S["groups"],
                "entropy": S["ent"] / S["tokens"],
                "drift_abs": d_abs,
                "drift_rel": d_rel,
                "grad_norm": sum(st.grad_norms) / len(st.grad_norms),
                "grad_sq_micro": st.grad_sq_micro,
                "grad_sq_full": st.grad_sq_full,
                "grad_micro_size": st.micro_size,
                "grad_full_size": st.full_size,
                "lr": phase.lr,
                "batch_samples": n_all,
                "prompts": n_all // g,
                "phase": phase_index,
                "loss": S["loss"] / ups,
                "clip_frac": (S["c_low"] + S["c_high"]) / S["c_tok"],
                "clip_frac_low": S["c_low"] / S["c_tok"],
                "clip_frac_high": S["c_high"] / S["c_tok"],
                "approx_kl": S["kl_on"] / S["tr_tok"],
                "resp_len_mean": S["tokens"] / n_all,
                "resp_len_max": dist.max(float(lens.max())),
                "truncated_frac": S["trunc"] / n_all,
                "time_gen_s": t_gen,
                "time_reward_s": t_reward,
                "time_update_s": t_update,
                "tokens_per_s": S["tokens"] / elapsed,
                "nonfinite": 0.0,
            }
            if kl_due:
                values["kl_init"] = S["kl_init"] / S["tokens"]
            decision = None
            if ctl is not None:
                values["adaptive_mode"] = MODES[ctl.state.mode]
                decision = ctl.observe(step, samples, values)
                if decision is not None:
                    values.update(decision_metrics(decision))
            crossed = cfg.eval_every_samples > 0 and (
                samples // cfg.eval_every_samples > (samples - n_all) // cfg.eval_every_samples
                or samples >= cfg.sample_budget
            )
            eval_acc = None
            if crossed and dist.rank == 0:
                eval_acc = values["eval_accuracy"] = evaluate(
                    engine, reward_fn, held, cfg, tok, step
                )
                values["eval_n"] = len(held)
            log(step, samples, values)
            if writer is not None and dist.rank == 0:
                writer.flush()
                if decision is not None:
                    event(decision.reason)
            if on_step is not None and dist.rank == 0:
                on_step(
                    Progress(step, samples, cfg.sample_budget, r_mean, S["hits"] / n_all, eval_acc)
                )

            # --- 6. checkpoint -----------------------------------------------------------------
            every = cfg.checkpoint_every_steps
            if (every and step % every == 0) or samples >= cfg.sample_budget:
                save()
        return "completed"
    except Diverged:
        log(step, samples, {"nonfinite": 1.0})
        if writer is not None and dist.rank == 0:
            writer.flush()
        return "diverged"
    finally:
        close = getattr(reward_fn, "close", None)
        if close is not None:
            close()
