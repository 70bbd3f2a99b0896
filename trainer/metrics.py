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


def flat_params(model) -> torch.Tensor:
    """All trainable parameters as one detached fp32 vector (drift needs theta and theta_0);
    under FSDP this rank's shards only."""
    return torch.cat(
        [local(p.detach()).float().reshape(-1) for p in model.parameters() if p.requires_grad]
    )


def drift(model, theta0: torch.Tensor, dist=None) -> tuple[float, float]:
    """(||theta - theta_0||_2, the same divided by ||theta_0||_2); `dist` (a trainer.dist.Dist)
    completes sums of squares over ranks when the parameters are sharded."""
    # squares summed in float64: a float32 norm of ~1M entries is off in the 5th digit, which
    # made the drift depend on how the parameters were split over ranks
    d2 = float(torch.linalg.vector_norm(flat_params(model) - theta0, dtype=torch.float64) ** 2)
    n2 = float(torch.linalg.vector_norm(theta0, dtype=torch.float64) ** 2)
    if dist is not None and dist.sharded:
        d2, n2 = dist.sum([d2, n2])
    d = d2**0.5
    return d, d / max(n2**0.5, 1e-12)


def grad_sq_norm(model, dist=None) -> float:
    """Squared L2 norm of the accumulated gradient (missing grads count as zero): one fused
    pass over every gradient (torch's clip_grad_norm_ kernel), each norm in float32; sharded
    gradients (FSDP) are summed over ranks through `dist`."""
    grads = [local(p.grad.detach()) for p in model.parameters() if p.grad is not None]
    total = 0.0
    if grads:
        norms = torch._foreach_norm(grads, 2, dtype=torch.float32)
        total = float(torch.stack(norms).double().pow(2).sum())
    return dist.sum_shards(total) if dist is not None else total


def gradient_noise_scale(sq_micro: float, b: float, sq_full: float, big: float) -> float:
    """B_simple = tr(S)/|G|^2 from one pair of gradient terms (McCandlish et al. 2018, app. A).

    Noisy from a single step: average both unbiased estimates over steps before dividing.
    """
    g2 = (big * sq_full - b * sq_micro) / (big - b)
    tr_s = (sq_micro - sq_full) / (1 / b - 1 / big)
    return tr_s / g2 if g2 > 0 else float("inf")
