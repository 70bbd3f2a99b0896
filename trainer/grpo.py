"""GRPO's pure tensor maths: group advantages, the clipped surrogate, its aggregations, k3 KL.

No model, no state: every function maps tensors to tensors, so each is unit-tested on
hand-computed values. Aggregations are written as per-token weights over one global
normaliser, so a batch split into micro-batches (gradient accumulation, data parallel) sums to
exactly the loss of the whole batch.
"""

from __future__ import annotations

import torch

LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def group_advantages(
    rewards: torch.Tensor,
    group_size: int,
    scaling: str = "group",
    eps: float = 1e-6,
    batch_std: float | None = None,
) -> torch.Tensor:
    """Rewards centred on their group's mean, divided by the group's std, the batch's std, or 1.

    `rewards` holds whole groups in order (N = prompts * G). `batch_std` overrides the std of
    `rewards` for `batch` scaling (data parallel passes the global one). Stds are unbiased.
    """
    r = rewards.reshape(-1, group_size).to(torch.float64)
    centred = r - r.mean(dim=1, keepdim=True)
    if scaling == "group":
        centred = centred / (r.std(dim=1, keepdim=True) + eps)
    elif scaling == "batch":
        std = r.std() if batch_std is None else torch.tensor(batch_std, dtype=torch.float64)
        centred = centred / (std + eps)
    elif scaling != "none":
        raise ValueError(f"unknown advantage scaling {scaling!r}")
    return centred.reshape(-1).to(rewards.dtype)


def zero_std_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Boolean per group: every completion got the same reward (the group teaches nothing)."""
    r = rewards.reshape(-1, group_size)
    return (r == r[:, :1]).all(dim=1)


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO loss max(-A r, -A clip(r, 1-low, 1+high)), and where each clip binds.

    `logp`/`old_logp` are [N, T]; `advantages` is [N]. The clip masks follow TRL: low binds
    where r < 1-low with A < 0, high where r > 1+high with A > 0.
    """
    adv = advantages.unsqueeze(1)
    ratio = torch.exp(logp - old_logp)
    loss = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high))
    low = (ratio < 1 - clip_low) & (adv < 0)
    high = (ratio > 1 + clip_high) & (adv > 0)
    return loss, low, high


def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || ref) on tokens sampled from pi: e^d - d - 1, d=ref-logp."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def token_weights(mask: torch.Tensor, agg: str, max_new_tokens: int) -> torch.Tensor:
    """Per-token weights whose weighted sum, over `normaliser`, is the aggregated loss."""
    mask = mask.to(torch.float32)
    if agg == "token-mean":
        return mask
    if agg == "seq-mean-token-mean":
        return mask / mask.sum(dim=1, keepdim=True).clamp(min=1)
    if agg == "seq-mean-token-sum-norm":
        return mask / max_new_tokens
    raise ValueError(f"unknown loss aggregation {agg!r}: allowed are {', '.join(LOSS_AGGS)}")


def normaliser(mask: torch.Tensor, agg: str) -> float:
    """The denominator of `agg` over `mask`: tokens for token-mean, else sequences."""
    return float(mask.sum()) if agg == "token-mean" else float(mask.shape[0])


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    agg: str,
    max_new_tokens: int,
    denominator: float | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss [N, T] by `agg`; `denominator` defaults to this batch's own."""
    den = normaliser(mask, agg) if denominator is None else denominator
    return (per_token * token_weights(mask, agg, max_new_tokens)).sum() / max(den, 1e-12)
