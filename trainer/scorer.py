"""The update's forward for Qwen2/Llama models: logits of the completion tokens, in one call.

`Scorer` wraps the HF model (its parameters are the model's) and computes what
`trainer.logprobs.completion_logits` computes through transformers — each distinct prompt run
once, its keys/values shared by the G completions of its group — with the layer math of
`trainer.decoder_math`. Only tokens whose output is used go through the layers' projections and
MLP, as one block of rows (`Plan`): each distinct prompt's real tokens (no left padding), and
each distinct completion prefix (rows whose prompt and tokens so far agree share it:
`_prefix_nodes`) that predicts a wanted position; the LM head runs on the wanted positions
only, once per distinct prefix. Only the attention is laid out in rows (prompt rows attend
causally within their prompt; every row's completion positions, read from their prefixes, over
their prompt's keys and causally over their own). No cache object, no mask builder, no
per-layer module dispatch, fused q/k/v and gate/up projections. Being one module call, it is
also what DDP wraps (one forward per backward on every rank).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.decoder_math import (
    Layers,
    additive_bias,
    attention,
    first_of_each,
    prefill_bias,
    row_ids,
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


def _suffix_any(want: torch.Tensor) -> torch.Tensor:
    """[N, L] bool: whether any of want[:, j:] is set."""
    return want.flip(1).cumsum(1).flip(1) > 0


@dataclass
class Plan:
    """Which token rows one Scorer call runs, as indices (no model needed).

    Body rows: `prompt_ids`/`prompt_pos` (each distinct prompt's real tokens, row-major over
    the [U, P'] grid `prompt_mask`, P' its longest; `prompt_slot` each one's cell) then
    `node_ids`/`node_pos` (each kept completion prefix's last token). Attention: completion
    position (row, j < C') reads node `node_map` (`len(node_ids)`: a zero stand-in, never
    read by a kept position) and attends `allowed` [N, C', P' + C']; `rep` is each node's first
    position. LM head: body rows `head_rows`; `index` [N, C] is the head row predicting each
    completion position, -1 where not wanted."""

    inverse: torch.Tensor  # [N] distinct prompt of each row
    prompt_mask: torch.Tensor  # [U, P'] real prompt tokens
    prompt_slot: torch.Tensor  # [Tp] cell of each run prompt token in the [U * P'] grid
    prompt_ids: torch.Tensor
    prompt_pos: torch.Tensor
    node_ids: torch.Tensor  # [M]
    node_pos: torch.Tensor
    node_map: torch.Tensor  # [N * C'] node read by each completion position (M: none)
    rep: torch.Tensor  # [M] a completion position of each node
    allowed: torch.Tensor  # [N, C', P' + C'] bool
    head_rows: torch.Tensor  # [K] body rows the LM head runs on
    index: torch.Tensor  # [N, C] head row of each completion position, -1: not wanted

    @property
    def width(self) -> int:
        """C': completion positions laid out for attention (the longest row that feeds a
        wanted prediction)."""
        return self.allowed.shape[1]

    @property
    def body_rows(self) -> int:
        """Token rows through every layer's projections and MLP."""
        return len(self.prompt_ids) + len(self.node_ids)


def plan(ids: torch.Tensor, mask: torch.Tensor, p: int, want: torch.Tensor) -> Plan:
    """The rows a forward over `ids`/`mask` [N, P + C] (prompts left-padded to `p`,
    completions after) runs to predict the completion positions `want` [N, C] (bool)."""
    n, c = ids.shape[0], ids.shape[1] - p
    prompts = torch.cat([ids[:, :p], mask[:, :p]], dim=1)
    unique, inverse = torch.unique(prompts, dim=0, return_inverse=True)
    u_mask = unique[:, p:]
    u_pos = (u_mask.cumsum(-1) - 1).clamp(min=0)
    run = u_mask.bool()
    run[:, -1] = True  # the last cell makes the first prediction, even if padding
    lead = int(run.any(0).int().argmax())  # columns of padding in every prompt: never laid out
    u_ids, u_mask, u_pos, run = (t[:, lead:] for t in (unique[:, :p], u_mask, u_pos, run))
    flat_run = run.reshape(-1)
    slot = flat_run.nonzero().squeeze(1)

    # completion input j (token j) runs while a later position is wanted: a prefix of each row
    later = _suffix_any(want[:, 1:]) if c > 1 else want[:, :0]
    c1 = int(later.sum(1).max()) if later.numel() else 0
    c_ids, c_mask, need = ids[:, p : p + c1], mask[:, p : p + c1], later[:, :c1]
    node, rep = _prefix_nodes(inverse, c_ids, c_mask)
    keep = torch.zeros(len(rep), dtype=torch.bool, device=ids.device)
    keep[node[need.reshape(-1)]] = True  # a node runs when any row sharing it needs it
    renumber = keep.cumsum(0) - 1
    m = int(keep.sum())
    node_map = torch.where(keep[node], renumber[node], m)
    rep = rep[keep]
    c_pos = u_pos[inverse, -1:] + c_mask.cumsum(-1)

    own = torch.ones(c1, c1, dtype=torch.bool, device=ids.device).tril()
    own = own[None] & c_mask.bool()[:, None]
    width = u_mask.shape[1]
    allowed = torch.cat([u_mask.bool()[inverse][:, None, :].expand(n, c1, width), own], dim=-1)

    head_rows, index = _head(want, inverse, run, node_map.reshape(n, c1), keep, m, len(slot))
    return Plan(inverse, u_mask, slot, u_ids.reshape(-1)[slot], u_pos.reshape(-1)[slot],
                c_ids.reshape(-1)[rep], c_pos.reshape(-1)[rep], node_map, rep, allowed,
                head_rows, index)


def _head(want, inverse, run, node_map, keep, m: int, tp: int):
    """(body rows the LM head runs on, [N, C] head row of each wanted completion position):
    a distinct prompt's last token predicts its rows' first position, the node of completion
    input j predicts position j + 1; each predicting row once."""
    n, c = want.shape
    c1 = node_map.shape[1]
    u = run.shape[0]
    dev = want.device
    first = want[:, 0] if c else torch.zeros(n, dtype=torch.bool, device=dev)
    by_prompt = torch.zeros(u, dtype=torch.bool, device=dev)
    by_prompt[inverse[first]] = True
    rest = want[:, 1 : c1 + 1]
    by_node = torch.zeros(m + 1, dtype=torch.bool, device=dev)
    by_node[node_map[rest]] = True
    by_node = by_node[:m]
    k0 = int(by_prompt.sum())
    prompt_row = by_prompt.cumsum(0) - 1
    node_row = torch.cat([by_node.cumsum(0) - 1 + k0, node_map.new_zeros(1)])
    index = torch.full((n, c), -1, dtype=torch.long, device=dev)
    if c:
        index[:, 0] = torch.where(first, prompt_row[inverse], -1)
        index[:, 1 : c1 + 1] = torch.where(rest, node_row[node_map], -1)
    last = run.sum(1).cumsum(0) - 1  # each prompt's last run token, in body row order
    return torch.cat([last[by_prompt], tp + by_node.nonzero().squeeze(1)]), index


class Scorer(torch.nn.Module):
    """Completion logits of `lm` (a Qwen2/Llama causal LM) by twoclocks' own forward."""

    def __init__(self, lm):
        super().__init__()
        why = unsupported(lm)
        if why is not None:
            raise ValueError(f"twoclocks' own forward cannot run this model: {why}")
        self.lm = lm
        self._layers = Layers(lm)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, p: int,
                want: torch.Tensor | None = None):
        """Logits [N, C, V] predicting ids[:, p:] (prompts left-padded to `p`, completions
        right-padded); positions follow the attention mask, as in generation. With `want`
        [N, C] (bool): only the positions it marks, as (logits [K, V], index [N, C]: the logits
        row of each position, -1 where not wanted), a distinct prefix's row once."""
        n, c = ids.shape[0], ids.shape[1] - p
        every = want is None
        if every:
            want = torch.ones(n, c, dtype=torch.bool, device=ids.device)
        pl = plan(ids, mask, p, want.bool())
        logits = self._layers.logits(self._body(pl).index_select(0, pl.head_rows))
        if not every:
            return logits, pl.index
        return logits.index_select(0, pl.index.reshape(-1)).reshape(n, c, -1)

    def _body(self, pl: Plan) -> torch.Tensor:
        """The final hidden rows [body rows, D] of plan `pl`."""
        L, dims = self._layers, self._layers.dims
        x = L.embed(torch.cat([pl.prompt_ids, pl.node_ids]))
        rope = L.rope(torch.cat([pl.prompt_pos, pl.node_pos]), x.dtype)
        u, width = pl.prompt_mask.shape
        n, c1 = len(pl.inverse), pl.width
        tp, m = len(pl.prompt_ids), len(pl.node_ids)
        grid = tp < u * width  # some prompt cells are padding: lay the run tokens out
        u_bias = prefill_bias(pl.prompt_mask, x.dtype)
        c_bias = additive_bias(pl.allowed, x.dtype)[:, None]
        dummy = bool((pl.node_map == m).any())

        def on_grid(t):
            if not grid:
                return t
            return t.new_zeros(u * width, *t.shape[1:]).index_copy(0, pl.prompt_slot, t)

        def attend(_i, q, k, v):
            h, d = dims.heads, dims.head_dim
            (qu, qm), (ku, km), (vu, vm) = (t.split([tp, m]) for t in (q, k, v))
            qu, ku, vu = on_grid(qu), on_grid(ku), on_grid(vu)
            ou = _attention(qu, ku, vu, (u, width), u_bias).reshape(u * width, h * d)
            if grid:
                ou = ou.index_select(0, pl.prompt_slot)
            if not c1:
                return ou
            # every row's completion positions, each read from its prefix's node
            if dummy:
                qm, km, vm = (torch.cat([t, t.new_zeros(1, *t.shape[1:])]) for t in (qm, km, vm))
            qc, kc, vc = (t.index_select(0, pl.node_map) for t in (qm, km, vm))
            keys = torch.cat([_heads_first(ku, u, width).index_select(0, pl.inverse),
                              _heads_first(kc, n, c1)], dim=2)
            values = torch.cat([_heads_first(vu, u, width).index_select(0, pl.inverse),
                                _heads_first(vc, n, c1)], dim=2)
            oc = attention(_heads_first(qc, n, c1), keys, values, c_bias, d**-0.5)
            om = oc.transpose(1, 2).reshape(n * c1, h * d).index_select(0, pl.rep)
            return torch.cat([ou, om])

        return L.run(x, rope, attend)


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
        local = row_ids(parent, tokens[:, j], mask[:, j])
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
