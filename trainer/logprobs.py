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


def cache_kwarg(model) -> str | None:
    """The forward's name for the KV cache (`cache` in transformers 5, `past_key_values` before),
    or None when the model takes neither (then nothing is shared)."""
    name = getattr(model, "_twoclockscache_kwarg", False)
    if name is not False:
        return name
    params = inspect.signature(model.forward).parameters
    name = next((n for n in ("cache", "past_key_values") if n in params), None)
    try:
        model._twoclockscache_kwarg = name
    except AttributeError:  # pragma: no cover — a model object that refuses attributes
        pass
    return name


def _shared_prompt_logits(model, ids, mask, pos, p: int, kwarg: str):
    """Logits [n, C, V] for the completion tokens, prompt keys/values computed once per distinct
    prompt; None when no prompt repeats or the model's cache cannot be re-indexed."""
    prompts = torch.cat([ids[:, :p], mask[:, :p]], dim=1)
    unique, inverse = torch.unique(prompts, dim=0, return_inverse=True)
    if len(unique) == len(ids):
        return None
    u_ids, u_mask = unique[:, :p], unique[:, p:]
    u_pos = (u_mask.cumsum(-1) - 1).clamp(min=0)
    head = model(
        input_ids=u_ids,
        attention_mask=u_mask,
        position_ids=u_pos,
        use_cache=True,
        logits_to_keep=1,
    )
    cache = getattr(head, "cache", None) or getattr(head, "past_key_values", None)
    if cache is None or not hasattr(cache, "batch_select_indices"):
        return None
    first = head.logits[:, -1][inverse].unsqueeze(1)  # predicts each row's first completion token
    if ids.shape[1] - p == 1:
        return first
    cache.batch_select_indices(inverse.to(ids.device))  # differentiable gather of every layer
    tail = model(
        input_ids=ids[:, p:-1],
        attention_mask=mask[:, :-1],
        position_ids=pos[:, p:-1],
        use_cache=True,
        **{kwarg: cache},
    ).logits
    return torch.cat([first, tail], dim=1)


def completion_logits(model, ids: torch.Tensor, mask: torch.Tensor, p: int) -> torch.Tensor:
    """Logits [n, C, V] predicting completion tokens ids[:, p:], prompts left-padded to `p`.

    Position ids follow the attention mask, as in generation with left padding.
    """
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    kwarg = cache_kwarg(model)
    if kwarg is not None and ids.shape[1] > p:
        logits = _shared_prompt_logits(model, ids, mask, pos, p, kwarg)
        if logits is not None:
            return logits
    return model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, p - 1 : -1]


def completion_logprobs(model, rollout, temperature: float, with_entropy: bool = False):
    """Log-probs [n, C] of the sampled completion tokens (and token entropy) at `temperature`."""
    device = next(model.parameters()).device
    ids, mask = rollout.input_ids.to(device), rollout.attention_mask.to(device)
    p = rollout.prompt_len
    logits = completion_logits(model, ids, mask, p)
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    logp = logp_all.gather(-1, ids[:, p:].unsqueeze(-1)).squeeze(-1).cpu()
    ent = M.token_entropy(logp_all).detach().cpu() if with_entropy else None
    return logp, ent
