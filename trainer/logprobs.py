"""Log-probs of sampled completions under a policy, with each distinct prompt run only once.

A GRPO batch holds G completions of every prompt. Running the prompt tokens once per group and
sharing their keys/values with its G completions gives the same logits as one forward over every
full row (up to float rounding) and, with gradients, the same gradient: the shared keys/values
collect the gradient of all G completions. It saves (G-1)/G of the prompt tokens' compute in
every log-prob pass (the update's forward and backward included) — the share of the work the
prompt has, which on long prompts (chat templates, few-shot) is most of it.
"""

from __future__ import annotations

import inspect

import torch

from trainer import metrics as M
from trainer.scorer import Scorer


def _signature(model) -> dict:
    """What this model's forward calls the KV cache (`cache` in transformers 5, `past_key_values`
    before; None: nothing is shared) and the keep-only-the-last-logits option, if any."""
    sig = getattr(model, "_twoclocks_forward_sig", None)
    if sig is None:
        ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
        inner = model.module if ddp else model  # a DDP wrapper forwards every keyword
        params = inspect.signature(inner.forward).parameters
        sig = {
            "cache": next((n for n in ("cache", "past_key_values") if n in params), None),
            "keep": next(
                (n for n in ("logits_to_keep", "num_logits_to_keep") if n in params), None
            ),
        }
        try:
            model._twoclocks_forward_sig = sig
        except AttributeError:  # pragma: no cover — a model object that refuses attributes
            pass
    return sig


def cache_kwarg(model) -> str | None:
    """The forward's (and `generate`'s) keyword for a KV cache, or None."""
    return _signature(model)["cache"]


def prefix_cache(model, ids: torch.Tensor, mask: torch.Tensor):
    """(last position's logits [n, V], KV cache) of one forward over left-padded `ids`, or None
    when the model has no cache that can be re-indexed by row (then nothing is shared)."""
    sig = _signature(model)
    if sig["cache"] is None:
        return None
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    keep = {sig["keep"]: 1} if sig["keep"] else {}
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **keep)
    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    if cache is None or not hasattr(cache, "batch_select_indices"):
        return None
    return out.logits[:, -1], cache


def _shared_prompt_logits(model, ids, mask, pos, p: int):
    """Logits [n, C, V] for the completion tokens, prompt keys/values computed once per distinct
    prompt; None when no prompt repeats or the model's cache cannot be re-indexed."""
    prompts = torch.cat([ids[:, :p], mask[:, :p]], dim=1)
    unique, inverse = torch.unique(prompts, dim=0, return_inverse=True)
    if len(unique) == len(ids):
        return None
    head = prefix_cache(model, unique[:, :p], unique[:, p:])
    if head is None:
        return None
    last, cache = head
    first = last[inverse].unsqueeze(1)  # predicts each row's first completion token
    if ids.shape[1] - p == 1:
        return first
    cache.batch_select_indices(inverse.to(ids.device))  # differentiable gather of every layer
    tail = model(
        input_ids=ids[:, p:-1],
        attention_mask=mask[:, :-1],
        position_ids=pos[:, p:-1],
        use_cache=True,
        **{cache_kwarg(model): cache},
    ).logits
    return torch.cat([first, tail], dim=1)


def _is_scorer(model) -> bool:
    inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    return isinstance(inner, Scorer)


def _sharded(model) -> bool:
    """Whether `model` is FSDP-sharded (trainer.sharding's `fully_shard`): its head then runs on
    every position, so that every rank's head forward and backward gather and reduce the same
    shapes."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2 cannot have sharded it
        return False
    return isinstance(model, FSDPModule)


def completion_logits(model, ids: torch.Tensor, mask: torch.Tensor, p: int) -> torch.Tensor:
    """Logits [n, C, V] predicting completion tokens ids[:, p:], prompts left-padded to `p`.

    Position ids follow the attention mask, as in generation with left padding. A
    `trainer.scorer.Scorer` (or DDP around one) computes them itself, in one call.
    """
    if _is_scorer(model):
        return model(ids, mask, p)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    if ids.shape[1] > p:
        logits = _shared_prompt_logits(model, ids, mask, pos, p)
        if logits is not None:
            return logits
    return model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, p - 1 : -1]


def completion_logprobs(model, rollout, temperature: float, with_entropy: bool = False):
    """Log-probs [n, C] of the sampled completion tokens (and token entropy) at `temperature`.

    Through a `Scorer`, only the positions of real completion tokens (`completion_mask`) get
    logits, a log-softmax and an entropy, each distinct prefix's once; the others are 0, the
    value every caller masks (so a ratio there is exp(0 - 0) = 1, a k3 term 0)."""
    device = next(model.parameters()).device
    ids, mask = rollout.input_ids.to(device), rollout.attention_mask.to(device)
    p = rollout.prompt_len
    if _is_scorer(model) and not _sharded(model):
        logits, index = model(ids, mask, p, rollout.completion_mask.to(device).bool())
        return _scored(logits, index, ids[:, p:], temperature, with_entropy)
    logits = completion_logits(model, ids, mask, p)
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    logp = logp_all.gather(-1, ids[:, p:].unsqueeze(-1)).squeeze(-1).cpu()
    ent = M.token_entropy(logp_all).detach().cpu() if with_entropy else None
    return logp, ent


def _scored(logits, index, tokens, temperature: float, with_entropy: bool):
    """Log-probs (and entropy) [n, C] of `tokens` from `logits` [K, V], position (i, t) read
    from row index[i, t] (-1: none, 0). The log-softmax runs in float32 at least."""
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    if not len(logp_all):  # nothing scored: one zero row keeps the result in the graph
        logp_all = torch.cat([logp_all, logp_all.new_zeros(1, logp_all.shape[1])])
    real, at = index >= 0, index.clamp(min=0)
    logp = torch.where(real, logp_all[at, tokens], 0.0).cpu()
    if not with_entropy:
        return logp, None
    ent = M.token_entropy(logp_all.detach())
    return logp, torch.where(real, ent[at], 0.0).cpu()
