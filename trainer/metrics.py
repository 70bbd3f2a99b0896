"""Training diagnostics: token entropy, KL to the initial policy, parameter drift, gradient terms.

All are computed from tensors the loop already has; none changes the model or any RNG.
"""

from __future__ import annotations

import torch

from trainer.grpo import k3
from trainer.sharding import local


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """(sum, count) of `x` over `mask`, so ranks and micro-batches can be pooled exactly."""
    m = mask.to(x.dtype)
    return float((x * m).sum()), float(m.sum())


def token_entropy(log_probs: torch.Tensor) -> torch.Tensor:
    """Entropy of each next-token distribution, from full log-probs [..., V]."""
    return -(log_probs.exp() * log_probs).sum(dim=-1)


def kl_to_init(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi_theta || pi_init) on tokens sampled from pi_theta."""
    return k3(logp, ref_logp)


def _trainable(model) -> list[torch.Tensor]:
    """This rank's part (its shards under FSDP) of every trainable parameter, detached."""
    return [local(p.detach()) for p in model.parameters() if p.requires_grad]


# Entries per block of the drift's difference: its float64 buffer (1 MiB) stays in cache, so
# no parameter-sized difference is ever written to memory (SmolLM2's is 0.5 GB in float32).
DRIFT_BLOCK = 1 << 17


class Drift:
    """||theta - theta_0||_2 and its ratio to ||theta_0||_2, theta_0 being the trainable
    parameters when this was made (a copy; this rank's shards under FSDP). `dist` (a
    trainer.dist.Dist) completes the sums of squares over ranks when they are sharded."""

    def __init__(self, model, dist=None):
        self.theta0 = [t.clone() for t in _trainable(model)]
        self.dist = dist
        # per tensor in float64, then summed: a float32 norm of ~1M entries is off in the 5th
        # digit, which made the drift depend on how the parameters were split over ranks
        self.norm0_sq = _sum_sq(self.theta0, torch.float64, dist)  # fixed: computed once

    def __call__(self, model) -> tuple[float, float]:
        """(absolute, relative) drift of `model`'s parameters now."""
        d = _diff_sum_sq(_trainable(model), self.theta0, self.dist) ** 0.5
        return d, d / max(self.norm0_sq**0.5, 1e-12)


def _diff_sum_sq(now: list[torch.Tensor], then: list[torch.Tensor], dist=None) -> float:
    """Sum over every entry of (now - then)^2, DRIFT_BLOCK entries at a time in one reused float64
    buffer (the difference exact there, its squares summed in float64); completed over ranks
    through `dist`."""
    total = 0.0
    if now:
        buf = torch.empty(DRIFT_BLOCK, dtype=torch.float64, device=now[0].device)
        acc = torch.zeros((), dtype=torch.float64, device=now[0].device)  # no sync per block
        for a, b in zip(now, then, strict=True):
            for x, y in zip(a.reshape(-1).split(DRIFT_BLOCK), b.reshape(-1).split(DRIFT_BLOCK),
                            strict=True):
                d = buf[: x.numel()].copy_(x).sub_(y)  # the difference exact, in float64
                acc += torch.dot(d, d)
        total = float(acc)
    return dist.sum_shards(total) if dist is not None else total


def grad_sq_norm(model, dist=None) -> float:
    """Squared L2 norm of the accumulated gradient (missing grads count as zero): one fused
    pass over every gradient (torch's clip_grad_norm_ kernel), each norm in float32; sharded
    gradients (FSDP) are summed over ranks through `dist`."""
    grads = [local(p.grad.detach()) for p in model.parameters() if p.grad is not None]
    return _sum_sq(grads, torch.float32, dist)


def _sum_sq(tensors: list[torch.Tensor], dtype, dist=None) -> float:
    """Sum of squares of every entry of `tensors`: one fused norm per tensor in `dtype`, their
    squares summed in float64; completed over ranks through `dist` when sharded (FSDP)."""
    total = 0.0
    if tensors:
        norms = torch._foreach_norm(tensors, 2, dtype=dtype)
        total = float(torch.stack(norms).double().pow(2).sum())
    return dist.sum_shards(total) if dist is not None else total


def gradient_noise_scale(sq_micro: float, b: float, sq_full: float, big: float) -> float:
    """B_simple = tr(S)/|G|^2 from one pair of gradient terms (McCandlish et al. 2018, app. A).

    Noisy from a single step: average both unbiased estimates over steps before dividing.
    """
    g2 = (big * sq_full - b * sq_micro) / (big - b)
    tr_s = (sq_micro - sq_full) / (1 / b - 1 / big)
    return tr_s / g2 if g2 > 0 else float("inf")
