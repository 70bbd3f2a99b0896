"""A decode loop of our own for Qwen2- and Llama-architecture models (the HF engine's fast path).

transformers' `generate` rebuilds masks, caches and logits processors around every token; for
small models on CPU that bookkeeping costs as much as the arithmetic. This loop runs the same
decoder (read from the live modules of the model it is handed — the training model, or its
copy in the rollout precision that the loop refreshes in place — so there is nothing to sync) over
key/value buffers with one slot per distinct history: the distinct prompts are pre-filled once
into theirs, then each new token is one pass of plain tensor ops (RMSNorm, RoPE, attention over
the buffer, SwiGLU MLP) over the slots of the histories still decoding (rows of a group that
sampled the same tokens so far share one; ended rows have none), the buffers re-gathered only
when that set changes. Each distinct distribution is worked out once and its rows draw from it.
In float32 on CPU the widest weights are multiplied from a transposed copy made per sample
(faster for a pass's few rows there; see `Layers.fuse_transposed`). Its logits
agree with the model's own forward to float rounding (tests/unit/test_fast_decode.py); the
trainer recomputes every log-prob with the model's forward anyway, and the per-token sampler
log-probs it returns measure the gap (in a bf16 copy, the precision's own gap as well).

The layer math is `trainer.decoder_math`'s (shared with the update's forward): only
architectures it reproduces are accepted (`unsupported` says why not); anything else goes
through `generate`.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from torch.profiler import record_function

from trainer.decoder_math import (
    Layers,
    additive_bias,
    attention,
    first_of_each,
    prefill_bias,
    row_ids,
    transposed,
    unsupported,  # noqa: F401 (the HF engine imports it from here)
)

# profiler scopes of the loop's parts (bench/decode_flops.py reads them)
PREFILL, STEP, DRAW, CACHE, SHARE = ("decode.prefill", "decode.step", "decode.draw",
                                     "decode.cache", "decode.share")


def _scope(name: str):
    """A profiler scope `name` while a profiler runs, else nothing: an idle scope still costs
    ~10 us, and one opens for every layer of every pass."""
    return record_function(name) if torch.autograd._profiler_enabled() else contextlib.nullcontext()


@dataclass(frozen=True)
class Weights:
    """What a sample's passes multiply by: each layer's `Layers.fused` tuple, and the LM head's
    weight when stored in another layout than the module's (else None: the module is called)."""

    layers: list[tuple]
    head: torch.Tensor | None


class FastDecoder:
    """Samples completions with `model`'s decoder; weights are read at every call."""

    def __init__(self, model):
        self.model = model
        self.layers = Layers(model)
        d = self.layers.dims
        self.heads, self.kv_heads, self.head_dim = d.heads, d.kv_heads, d.head_dim

    # --- the decoder -------------------------------------------------------------------------
    def fused(self) -> Weights:
        """The layers' fused projections (`Layers.fused`) with the q rows (the first H*d, in
        either layout) scaled by 1/sqrt(d): RoPE is linear, so attention scores come out
        already scaled; in float32 on CPU the gate/up, down and LM head weights stored
        transposed (`Layers.fuse_transposed`: faster products of a pass's few rows there; the
        head's ran 2x faster). Computed once per sample; the weights stay fixed while
        sampling."""
        q_rows, scale = self.heads * self.head_dim, self.head_dim**-0.5
        head = self.model.lm_head.weight
        t = head.dtype == torch.float32 and head.device.type == "cpu"
        layers = self.layers.fused(stored_transposed=t)
        for w, b, *_ in layers:  # fresh tensors (cat, index_select)
            w[:q_rows] *= scale
            if b is not None:
                b[:q_rows] *= scale
        return Weights(layers, transposed(head) if t else None)

    def forward(self, ids, pos, keys, values, start: int, bias, fused: Weights | None = None):
        """Logits [N, V] of the last of tokens `ids` [N, T] at positions `pos`, writing their
        keys/values into slots 0..N-1 of the buffers [N, KV, width, d] at [start, start+T) and
        attending over [0, start+T). `fused`: `self.fused()`, computed once per sample (else
        now)."""
        L = self.layers
        n, t = ids.shape
        end = start + t
        fused = self.fused() if fused is None else fused
        x = L.embed(ids.reshape(-1))
        rope = L.rope(pos.reshape(-1), x.dtype)

        def attend(i, q, k, v):
            with _scope(CACHE):
                keys[i][:, :, start:end] = k.view(n, t, self.kv_heads, -1).transpose(1, 2)
                values[i][:, :, start:end] = v.view(n, t, self.kv_heads, -1).transpose(1, 2)
            o = attention(q.view(n, t, self.heads, -1).transpose(1, 2), keys[i][:, :, :end],
                          values[i][:, :, :end], bias)
            return o.transpose(1, 2).reshape(n * t, -1)

        x = L.run(x, rope, attend, fused.layers)
        return L.logits(x.view(n, t, -1)[:, -1], fused.head)

    # --- sampling ------------------------------------------------------------------------------
    def sample(self, u_ids, u_mask, inverse, max_new_tokens: int, temperature: float,
               top_p: float, eos_id: int, pad_id: int):
        """(completion ids [N, C'], the sampler's log-prob of each, the entropy of each
        token's distribution [N, C']) for N rows, row r continuing distinct left-padded prompt
        `inverse[r]` of `u_ids`/`u_mask` [U, P].

        Tokens come from softmax(logits / T) (top-p filtered when top_p < 1; greedy when
        T = 0) through the global torch generator, so checkpointed RNG state resumes it. The
        log-prob and entropy are of softmax(logits / T), unfiltered — what the trainer computes.
        Rows past their EOS get `pad_id` (log-prob and entropy NaN); decoding stops once every
        row has ended (C' <= C).

        The key/value buffers hold one slot per distinct history being decoded (the U prompts
        at first): a pass runs those slots only, and the buffers are re-gathered only on steps
        where the set of histories changes (a group's rows drew different tokens, a row ended).
        Raises FloatingPointError when the logits are not finite.
        """
        n, p = len(inverse), u_ids.shape[1]
        dev, dtype = u_ids.device, self.model.model.embed_tokens.weight.dtype
        width = p + max_new_tokens
        with _scope(PREFILL):
            keys = [torch.zeros(len(u_ids), self.kv_heads, width, self.head_dim, dtype=dtype,
                                device=dev) for _ in self.model.model.layers]
            values = [torch.zeros_like(b) for b in keys]
            u_pos = (u_mask.cumsum(-1) - 1).clamp(min=0)
            fused = self.fused()  # the weights stay fixed while sampling
            logits = self.forward(u_ids, u_pos, keys, values, 0, prefill_bias(u_mask), fused)
        # each prompt's attention bias over the whole width (generated keys are all allowed)
        u_bias = additive_bias(torch.cat([u_mask.bool(), u_mask.new_ones(
            len(u_ids), max_new_tokens, dtype=torch.bool)], 1))
        last_pos = u_pos[:, -1]
        slot = inverse  # each row's slot (its logits' row); ended rows: any
        done = torch.zeros(n, dtype=torch.bool, device=dev)
        history = inverse  # an id of each row's prompt and tokens so far
        tokens, logps, ents = [], [], []
        for step in range(max_new_tokens):
            with _scope(DRAW):
                token, logp, ent = _draw(logits, slot, done, temperature, top_p)
            token = token.masked_fill(done, pad_id)
            tokens.append(token)
            logps.append(logp.masked_fill(done, math.nan))
            ents.append(ent.masked_fill(done, math.nan))
            done = done | (token == eos_id)
            if step == max_new_tokens - 1 or bool(done.all()):
                break
            with _scope(SHARE):
                history = row_ids(history, token)
                rows, back = _passes(history, done)
                parent = slot[rows]
            if len(parent) != len(keys[0]) or not bool((parent == _arange(parent)).all()):
                with _scope(CACHE):
                    keys = [k.index_select(0, parent) for k in keys]
                    values = [v.index_select(0, parent) for v in values]
            prompt = inverse[rows]
            with _scope(STEP):
                logits = self.forward(token[rows, None], (last_pos[prompt] + step + 1)[:, None],
                                      keys, values, p + step,
                                      u_bias[prompt, : p + step + 1][:, None, None, :], fused)
            slot = back
        return torch.stack(tokens, dim=1), torch.stack(logps, dim=1), torch.stack(ents, dim=1)


def _arange(like: torch.Tensor) -> torch.Tensor:
    return torch.arange(len(like), dtype=like.dtype, device=like.device)


def _passes(history: torch.Tensor, done: torch.Tensor):
    """(rows, back): the rows a pass runs (one per distinct live history, `_shared_rows`; every
    row, in order, when all are distinct and live) and each row's place among them."""
    share = _shared_rows(history, done)
    if share is None:
        every = _arange(history)
        return every, every
    return share


def _shared_rows(history: torch.Tensor, done: torch.Tensor):
    """(rows, back) when rows still decoding share a history (`history` [N]: an id per distinct
    prompt and tokens so far; the next token's distribution is then the same): one row of each
    distinct history (`rows`), and for every row the position in `rows` of its history
    (`back`; ended rows, whose logits are never used, map to 0). None when every row is
    distinct and live.

    Early in a completion most of a group's G rows agree (a format's opening tokens, a chat
    template's first words), so a pass over the distinct ones does the same work for fewer
    rows; the rows still draw their tokens one by one from those logits."""
    live = (~done).nonzero().squeeze(1)
    if len(live) == 0:
        return None
    distinct, where = torch.unique(history[live], return_inverse=True)
    if len(distinct) == len(history):
        return None
    rows = first_of_each(where, len(distinct), live)
    back = torch.zeros(len(history), dtype=where.dtype, device=where.device)
    back[live] = where
    return rows, back


def _draw(logits: torch.Tensor, slot: torch.Tensor, done: torch.Tensor, temperature: float,
          top_p: float):
    """(token [N], its log-prob under softmax(logits / T), that distribution's entropy) of N
    rows, row r drawing from logits row `slot[r]` of `logits` [S, V] — by inverse-CDF sampling
    from the (top-p filtered) distribution, or the argmax when T = 0. Each distinct
    distribution is worked out once; rows that are `done` draw nothing (their entries are
    unspecified) but still take their uniform, so the generator's stream is one per row."""
    logits = logits.float()
    scaled = logits / temperature if temperature > 0 and temperature != 1 else logits
    logp_all = torch.log_softmax(scaled, dim=-1)
    probs = logp_all.exp()
    entropy = -(probs * logp_all).sum(dim=-1)
    # NaN exactly when a logit is inf or NaN (0 * -inf, inf - inf): one check of S numbers
    if not bool(torch.isfinite(entropy).all()):
        raise FloatingPointError("non-finite logits while sampling")
    token = torch.zeros_like(slot)
    live = (~done).nonzero().squeeze(1)
    at = slot[live]
    if temperature <= 0:
        token[live] = logits.argmax(dim=-1)[at]
    else:
        if top_p < 1.0:
            probs = _top_p(probs, top_p)
        cdf = probs.cumsum(dim=-1)
        u = torch.rand(len(slot), 1, device=probs.device)[live] * cdf[at, -1:]
        token[live] = torch.searchsorted(cdf[at], u, right=True).squeeze(1).clamp(
            max=probs.shape[1] - 1)
    return token, logp_all[slot, token], entropy[slot]


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """`probs` with everything outside the smallest top-mass-`top_p` set zeroed (the most likely
    token always kept), as transformers' TopPLogitsWarper keeps it."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly above each token
    keep_sorted = before < top_p
    keep_sorted[:, 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)
    return probs * keep
