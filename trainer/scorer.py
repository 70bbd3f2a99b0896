"""The update's forward for Qwen2/Llama models: logits of the completion tokens, in one call.

`Scorer` wraps the HF model (its parameters are the model's) and computes what
`trainer.logprobs.completion_logits` computes through transformers — each distinct prompt run
once, its keys/values shared by the G completions of its group — with the layer math of
`trainer.decoder_math`: the distinct prompts' tokens and each distinct completion prefix's
last token (rows whose prompt and tokens so far agree share it: `_prefix_nodes`) go through each
layer's projections and MLP as one block of rows, and only the attention is split (prompt rows
attend causally within their prompt; every row's completion positions, read from their
prefixes, over their prompt's keys and causally over their own). No cache object, no mask
builder, no per-layer module dispatch, fused q/k/v and gate/up projections. Being one module
call, it is also what DDP wraps (one forward per backward on every rank).
"""

from __future__ import annotations

import torch

from trainer.decoder_math import (
    Layers,
    additive_bias,
    attention,
    first_of_each,
    prefill_bias,
    unsupported,
)


def _heads_first(t: torch.Tensor, rows: int, length: int) -> torch.Tensor:
    """Token rows [rows * length, heads, d] as [rows, heads, length, d]."""
    return t.reshape(rows, length, *t.shape[1:]).transpose(1, 2)


def _attention(q, k, v, shape, bias) -> torch.Tensor:
    """Self-attention of token rows q [R*L, H, d], k, v [R*L, KV, d] within each of R rows of
    length L (`shape`), additive `bias` [R, 1, L, L]; output [R, L, H, d]."""
    rows, length = shape
    q, k, v = (_heads_first(t, rows, length) for t in (q, k, v))
    return attention(q, k, v, bias, q.shape[-1] ** -0.5).transpose(1, 2)


class Scorer(torch.nn.Module):
    """Completion logits of `lm` (a Qwen2/Llama causal LM) by twoclocks' own forward."""

    def __init__(self, lm):
        super().__init__()
        why = unsupported(lm)
        if why is not None:
            raise ValueError(f"twoclocks' own forward cannot run this model: {why}")
        self.lm = lm
        self._layers = Layers(lm)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, p: int) -> torch.Tensor:
        """Logits [N, C, V] predicting ids[:, p:] (prompts left-padded to `p`, completions
        right-padded); positions follow the attention mask, as in generation."""
        n, c = ids.shape[0], ids.shape[1] - p
        L, dims = self._layers, self._layers.dims
        prompts = torch.cat([ids[:, :p], mask[:, :p]], dim=1)
        unique, inverse = torch.unique(prompts, dim=0, return_inverse=True)
        u_ids, u_mask, u = unique[:, :p], unique[:, p:], len(unique)
        c_ids = ids[:, p:-1] if c > 1 else ids[:, :0]  # the inputs after each prompt's last
        c_mask = mask[:, p : p + c_ids.shape[1]]
        c1 = c_ids.shape[1]
        u_pos = (u_mask.cumsum(-1) - 1).clamp(min=0)
        c_pos = u_pos[inverse, -1:] + c_mask.cumsum(-1)
        node, rep = _prefix_nodes(inverse, c_ids, c_mask)  # each shared prefix once
        m = len(rep)
        x = L.embed(torch.cat([u_ids.reshape(-1), c_ids.reshape(-1)[rep]]))
        rope = L.rope(torch.cat([u_pos.reshape(-1), c_pos.reshape(-1)[rep]]), x.dtype)
        u_bias, c_bias = self._biases(u_mask, c_mask, inverse, x.dtype)
        nu = u * p

        def attend(_i, q, k, v):
            h, d = dims.heads, dims.head_dim
            if not c1:
                return _attention(q, k, v, (u, p), u_bias).reshape(nu, h * d)
            (qu, qm), (ku, km), (vu, vm) = (t.split([nu, m]) for t in (q, k, v))
            ou = _attention(qu, ku, vu, (u, p), u_bias)
            # every row's completion positions, each read from its prefix's node
            qc, kc, vc = (t.index_select(0, node) for t in (qm, km, vm))
            keys = torch.cat([_heads_first(ku, u, p).index_select(0, inverse),
                              _heads_first(kc, n, c1)], dim=2)
            values = torch.cat([_heads_first(vu, u, p).index_select(0, inverse),
                                _heads_first(vc, n, c1)], dim=2)
            oc = attention(_heads_first(qc, n, c1), keys, values, c_bias, d**-0.5)
            om = oc.transpose(1, 2).reshape(n * c1, h * d).index_select(0, rep)
            return torch.cat([ou.reshape(nu, h * d), om])

        x = L.run(x, rope, attend)
        xu, xm = x.split([nu, m])
        last = xu.reshape(u, p, -1)[:, -1]  # each prompt's last token: the first prediction
        first, rest = L.logits(torch.cat([last, xm])).split([u, m])
        first = first.index_select(0, inverse).unsqueeze(1)
        if not c1:
            return first
        return torch.cat([first, rest.index_select(0, node).reshape(n, c1, -1)], dim=1)

    @staticmethod
    def _biases(u_mask, c_mask, inverse, dtype):
        """Additive attention masks: [U, 1, P, P] causal over each distinct prompt's real tokens
        (a padding query sees itself, so no row is all -inf), and [N, 1, C', P + C'] for the
        completion rows (their prompt's real tokens, then causal over their own real ones)."""
        p, c1, n = u_mask.shape[1], c_mask.shape[1], len(inverse)
        own = torch.ones(c1, c1, dtype=torch.bool, device=u_mask.device).tril()
        own = own[None] & c_mask.bool()[:, None]
        allowed = torch.cat([u_mask.bool()[inverse][:, None, :].expand(n, c1, p), own], dim=-1)
        return prefill_bias(u_mask, dtype), additive_bias(allowed, dtype)[:, None]


def _prefix_nodes(prompt: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor):
    """(node [N*C'], rep [M]) for completion inputs `tokens`/`mask` [N, C'] after prompts
    `prompt` [N] (distinct-prompt ids): positions with one history — same prompt, same tokens
    and mask up to and including it — are one node, since every layer computes the same for
    them; `node` numbers each row-major position's node, `rep` is one position of each.

    G completions of a prompt often open alike (a format's first tokens, a chat template's
    first words): their shared prefix then runs once through every layer, forward and backward,
    as the shared prompt does, and its gradient collects every row's."""
    n, c = tokens.shape
    node = torch.empty(n, c, dtype=torch.long, device=tokens.device)
    parent, count = prompt, 0
    for j in range(c):  # a position's node: (its parent's node, its token, its mask bit)
        _, local = torch.unique(torch.stack([parent, tokens[:, j], mask[:, j]], 1), dim=0,
                                return_inverse=True)
        node[:, j] = parent = local + count
        distinct = int(local.max()) + 1 if n else 0
        count += distinct
        if distinct == n:  # every row on its own: histories never merge again
            rest = n * (c - j - 1)
            node[:, j + 1 :] = count + torch.arange(rest, device=node.device).reshape(n, -1)
            count += rest
            break
    flat = node.reshape(-1)
    return flat, first_of_each(flat, count, torch.arange(len(flat), device=flat.device))


def make_scorer(model, cfg):
    """`Scorer(model)` when `cfg.scorer` is "auto" and the model's architecture is supported,
    else the model itself (the transformers forward)."""
    if getattr(cfg, "scorer", "auto") == "auto" and unsupported(model) is None:
        return Scorer(model)
    return model
