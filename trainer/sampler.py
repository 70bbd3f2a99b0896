"""The sampler against the trainer: how far the rollout engine's log-probs of the sampled tokens
are from the trainer's own, and truncated importance sampling (TIS) to correct the update for it.

The HF engine samples with the training model itself, so its gap is float rounding (~1e-6); a
vLLM engine's kernels, precision and weight sync make a real one (TRL's
`vllm_importance_sampling_correction` is the same correction).
"""

from __future__ import annotations

import math

import torch


def mismatch_sums(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor,
                  mask: torch.Tensor) -> tuple[float, float, int]:
    """(sum of |log pi_train/pi_sampler|, sum of its k3 = r - 1 - log r, token count) over the
    masked tokens where both log-probs are finite: sums, so ranks can pool them."""
    ok = mask.bool() & torch.isfinite(sampler_logp) & torch.isfinite(trainer_logp)
    d = (trainer_logp - sampler_logp)[ok].double()  # log pi_train / pi_sampler
    return float(d.abs().sum()), float((torch.exp(d) - 1 - d).sum()), int(ok.sum())


def sampler_mismatch(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor,
                     mask: torch.Tensor) -> dict[str, float]:
    """How far the engine's sampling distribution is from the trainer's on the sampled tokens:
    mean |log-ratio| and the k3 estimate of KL(sampler || trainer) (`sampler_tokens` counts
    the tokens compared; NaN means when there are none)."""
    abs_sum, k3_sum, n = mismatch_sums(trainer_logp, sampler_logp, mask)
    return {"sampler_abs_logratio": abs_sum / n if n else math.nan,
            "sampler_kl_k3": k3_sum / n if n else math.nan, "sampler_tokens": n}


def tis_weights(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance-sampling weights min(pi_train / pi_sampler, cap) per token (1 where
    the engine gave no log-prob): multiplying the per-token loss by them corrects the update
    for the sampler/trainer mismatch (as TRL's vllm_importance_sampling_correction)."""
    ratio = torch.exp(trainer_logp.detach() - sampler_logp)
    ratio = torch.where(torch.isfinite(sampler_logp), ratio, torch.ones_like(ratio))
    return ratio.clamp(max=cap)

