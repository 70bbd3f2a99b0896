"""One step's optimizer work on a rollout batch: log-probs, the clipped GRPO loss accumulated
over micro-batches against the minibatch's global normaliser, gradient-noise terms, TIS.

`update` runs `ppo_epochs * num_minibatches` optimizer steps; with one minibatch its first pass
runs before any step, so it also yields the rollout policy's log-probs and entropy
(`on_policy`). Under DDP only the last micro-batch of a minibatch all-reduces, under FSDP every
one reduce-scatters; a rank with nothing to train in a synced micro-batch still joins the sync
(`_idle_backward`). Every forward here runs in the update's compute precision: on a copy of
the weights in `update_dtype` (`precision.ComputeCopy`, its gradients folded into the `dtype`
ones after each backward) or, under several processes, under autocast over the `dtype` weights;
the old and reference log-probs included, so that the ratio and the KL term compare two
policies, not two precisions (see `no_grad_logprobs`).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch

from trainer import grpo, precision, sampler
from trainer import metrics as M
from trainer.config import TrainConfig
from trainer.dist import Dist
from trainer.logprobs import completion_logits, completion_logprobs
from trainer.sharding import full


class Diverged(Exception):
    """The loss, a gradient or the sampling distribution became non-finite."""


def no_grad_logprobs(model, rollout, cfg, with_entropy: bool, dist: Dist | None = None,
                     rows: torch.Tensor | None = None):
    """Log-probs (and entropy) of the samples `rows` (default all), in micro-batches, without
    building a graph. Under FSDP every forward is collective, so a rank with fewer micro-batches
    than another runs one-row forwards until all ranks have run as many (`dist`).

    They run in the update's compute precision, not in `dtype`: these are the ratio's
    denominator and the KL term's reference, which at an unchanged policy must read 1 and 0
    (up to one forward's own rounding); a float32 denominator against a bf16-autocast numerator
    would read bf16's rounding of the same weights (0.2 of a logit on the tiny model) as a
    policy change."""
    lps, ents = [], []
    rows = torch.arange(len(rollout.texts)) if rows is None else rows
    chunks = [c for c in rows.split(cfg.micro_batch_size) if len(c)]  # none when no rows
    pad = int(dist.max(float(len(chunks)))) - len(chunks) if dist and dist.sharded else 0
    with torch.no_grad(), precision.autocast(cfg, model):
        for idx in chunks:
            lp, ent = completion_logprobs(model, rollout.select(idx), cfg.temperature, with_entropy)
            lps.append(lp)
            ents.append(ent)
        for _ in range(pad):
            _one_row_logits(model, rollout)  # (under the same autocast)
    if not lps:  # no rows here (a sharded rank still joined the others' forwards above)
        empty = torch.empty(0, rollout.completion_mask.shape[1])
        return empty, (empty.clone() if with_entropy else None)
    return torch.cat(lps), (torch.cat(ents) if with_entropy else None)


def on_policy(cfg: TrainConfig) -> bool:
    """One minibatch per epoch: the update's first pass over every row runs before any optimizer
    step, so it sees the rollout policy and yields the rollout's log-probs and entropy (no
    separate forward; the first pass's ratio is exactly 1; later epochs use those log-probs)."""
    return cfg.num_minibatches == 1


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
    tis_weight: float = 0.0  # sum of truncated importance weights over trained tokens
    tis_capped: float = 0.0  # trained tokens whose weight hit tis_cap
    entropy: torch.Tensor | None = None  # [N, C] rows trained on-policy (others stay NaN)
    logp: torch.Tensor | None = None  # [N, C] their sampled tokens' log-probs, likewise


def _micro_backward(model, rollout, idx, adv, old_logp, ref_logp, cmask, den, cfg, phase,
                    stats: UpdateStats, fresh: bool) -> float:
    """Forward and backward of the rows `idx` (their loss over the minibatch's normaliser
    `den`); adds their clip/KL/TIS/token counts to `stats` and returns the loss value. `fresh`:
    this forward sees the rollout policy, so its log-probs/entropy are kept as the rollout's
    (the rollout's entropy then costs no forward of its own, whatever the sampler was). The
    forward runs in the update's compute precision, the backward outside it."""
    with precision.autocast(cfg, model):
        logp, ent = completion_logprobs(model, rollout.select(idx), cfg.temperature, fresh)
    if fresh:
        stats.entropy[idx] = ent
        stats.logp[idx] = logp.detach()
    old = logp.detach() if fresh else old_logp[idx]
    m = cmask[idx]
    tok_loss, low, high = grpo.clipped_surrogate(
        logp, old, adv[idx], phase.clip_eps_low, phase.clip_eps_high
    )
    cap = None if cfg.tis_cap == "off" else cfg.tis_cap  # a number once the loop resolved it
    if cap is not None:  # truncated importance sampling against the engine's log-probs
        w = sampler.tis_weights(old, rollout.sampler_logp[idx], cap)
        tok_loss = tok_loss * w
        stats.tis_weight += float((w * m).sum())
        stats.tis_capped += float(((w >= cap) * m).sum())
    if cfg.kl_coef > 0:
        tok_loss = tok_loss + cfg.kl_coef * grpo.k3(logp, ref_logp[idx])
    loss = grpo.aggregate(tok_loss, m, cfg.loss_agg, cfg.max_new_tokens, den)
    loss.backward()
    stats.clip_low += float((low.float() * m).sum())
    stats.clip_high += float((high.float() * m).sum())
    stats.kl_old_new += float(((old - logp.detach()) * m).sum())
    stats.trained_tokens += float(m.sum())
    return float(loss.detach())


def _one_row_logits(net, rollout) -> torch.Tensor:
    """Logits of one row of `rollout`: a rank's share of a collective pass it has no rows for."""
    device = next(net.parameters()).device
    ids, mask = rollout.input_ids[:1].to(device), rollout.attention_mask[:1].to(device)
    return completion_logits(net, ids, mask, rollout.prompt_len)


def _idle_backward(net, rollout, cfg) -> None:
    """A zero-gradient forward/backward of one row, so a rank with nothing to train in a
    synced micro-batch still joins the gradient sync (every rank must run each synced
    backward: DDP's last one, every one under FSDP), its forward in the update's precision."""
    with precision.autocast(cfg, net):
        logits = _one_row_logits(net, rollout)
    (logits.float().sum() * 0.0).backward()


def update(model, opt, rollout, adv, old_logp, ref_logp, cfg, phase, dist: Dist,
           noise: bool = True, compute: precision.ComputeCopy | None = None) -> UpdateStats:
    """`ppo_epochs * num_minibatches` optimizer steps on one rollout batch.

    Each minibatch is split into micro-batches of `micro_batch_size` samples whose gradients
    accumulate against the minibatch's global normaliser (summed over ranks), so the result
    equals one pass over the whole minibatch. `noise`: measure the gradient-noise terms on the
    first minibatch (split in at least two for them). `compute`: the forward and backward run
    on that copy, whose gradients go into `model`'s after each backward, and which is re-cast
    after each optimizer step but the last (the loop's weight sync does the last). Raises
    Diverged on a non-finite loss or gradient.
    """
    fwd = model if compute is None else compute.net
    stats = UpdateStats()
    n = len(rollout.texts)
    cmask = rollout.completion_mask.float()
    skip = skips_zero_advantage(cfg)
    keep = on_policy(cfg)  # the first pass sees the rollout policy: keep its log-probs, entropy
    if keep:
        stats.entropy = torch.full(cmask.shape, math.nan)
        stats.logp = torch.full(cmask.shape, math.nan)
    first, steps_done = True, 0
    for epoch in range(cfg.ppo_epochs):
        if keep and epoch == 1:
            old_logp = stats.logp  # later epochs' ratios are against the first pass
        order = torch.randperm(n) if cfg.num_minibatches > 1 else torch.arange(n)
        for mb in order.tensor_split(cfg.num_minibatches):
            den = dist.sum([grpo.normaliser(cmask[mb], cfg.loss_agg)])[0]
            dist.zero_grad(model, opt)
            bad_loss = False
            measure = first and noise
            # measured, the first minibatch is split in at least two (grad_sq_micro != _full)
            size = min(cfg.micro_batch_size, -(-len(mb) // 2)) if measure else cfg.micro_batch_size
            micros = mb.split(size)
            for k, micro in enumerate(micros):
                train_idx = micro[adv[micro] != 0] if skip else micro
                last = k == len(micros) - 1  # only the last backward all-reduces (DDP)
                if (last or dist.sharded) and not len(train_idx) and dist.synced(model):
                    _idle_backward(model, rollout, cfg)  # this rank's share of the sync
                with contextlib.nullcontext() if last else dist.no_sync(model):
                    if len(train_idx):
                        value = _micro_backward(
                            fwd, rollout, train_idx, adv, old_logp, ref_logp, cmask, den,
                            cfg, phase, stats, fresh=keep and epoch == 0,
                        )
                        bad_loss = bad_loss or not math.isfinite(value)
                        stats.loss += value
                        if compute is not None:
                            compute.fold()
                stats.clip_tokens += float(cmask[micro].sum())
                if measure and k == 0:  # gradient of one micro-batch, scaled to its own mean
                    micro_den, size = grpo.normaliser(cmask[micro], cfg.loss_agg), len(micro)
                    if dist.sharded:  # reduce-scattered already: every rank's first micro-batch
                        micro_den, size = dist.sum([micro_den, size])
                    scale = den / micro_den if micro_den else 0.0
                    stats.grad_sq_micro = M.grad_sq_norm(model, dist) * scale**2
                    stats.micro_size = int(size)
            if dist.sum([float(bad_loss)])[0] > 0:  # every rank stops together
                raise Diverged("non-finite loss")
            for p in model.parameters():  # a batch with nothing to learn still steps AdamW
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
            if measure:
                stats.grad_sq_full = M.grad_sq_norm(model, dist)
                stats.full_size = int(dist.sum([len(mb)])[0])
            clip_to = cfg.max_grad_norm if cfg.max_grad_norm is not None else math.inf
            params = [p for p in model.parameters() if p.requires_grad]
            norm = float(full(torch.nn.utils.clip_grad_norm_(params, clip_to)))
            if not math.isfinite(norm):
                raise Diverged("non-finite gradient")
            stats.grad_norms.append(norm)
            opt.step()
            steps_done += 1
            if compute is not None and steps_done < cfg.ppo_epochs * cfg.num_minibatches:
                compute.refresh()  # the next minibatch's forward reads the stepped weights
            first = False
    return stats
