"""A decode loop of our own for Qwen2- and Llama-architecture models (the HF engine's fast path).

transformers' `generate` rebuilds masks, caches and logits processors around every token; for
small models on CPU that bookkeeping costs as much as the arithmetic. This loop runs the same
decoder (read from the live training model's own modules, so there is nothing to sync) over
static key/value buffers: the distinct prompts are pre-filled once and their keys/values copied
to every row of their group, then each new token is one pass of plain tensor ops (RMSNorm,
RoPE, attention over the buffer, SwiGLU MLP). Its logits agree with the model's own forward to
float rounding (tests/unit/test_fast_decode.py); the trainer recomputes every log-prob with
the model's forward anyway, and the per-token sampler log-probs it returns measure the gap.

Only architectures whose forward this file reproduces are accepted (`unsupported` says why
not); anything else goes through `generate`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# model types whose forward `FastDecoder.forward` reproduces (biases are read where present)
ARCHITECTURES = ("qwen2", "llama")


def _rope_config(config) -> tuple[str, float]:
    """(rope type, theta) in either transformers layout (rope_parameters, or rope_scaling +
    rope_theta before v5)."""
    params = getattr(config, "rope_parameters", None) or {}
    scaling = getattr(config, "rope_scaling", None) or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    return kind, float(theta)


def unsupported(model) -> str | None:
    """Why this loop cannot reproduce `model`'s forward (None when it can)."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in ARCHITECTURES:
        return f"model_type {kind!r} (the loop knows {', '.join(ARCHITECTURES)})"
    rope, _ = _rope_config(config)
    if rope != "default":
        return f"rope_type {rope!r} (the loop knows 'default')"
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return "sliding-window attention"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r}"
    if not hasattr(model, "lm_head") or not hasattr(getattr(model, "model", None), "layers"):
        return "no lm_head / model.layers"
    return None


class FastDecoder:
    """Samples completions with `model`'s decoder; weights are read at every call."""

    def __init__(self, model):
        c = model.config
        self.model = model
        self.heads = c.num_attention_heads
        self.kv_heads = getattr(c, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // self.heads
        self.eps = c.rms_norm_eps
        _, theta = _rope_config(c)
        half = torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim
        self.inv_freq = 1.0 / (theta**half)

    # --- the decoder -------------------------------------------------------------------------
    def _rms(self, x, weight):
        dtype = x.dtype
        x = x.float()
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype)

    def _rope(self, pos, dtype):
        """cos, sin [N, 1, T, head_dim] for positions `pos` [N, T] (rotate-half layout)."""
        freqs = pos.float()[..., None] * self.inv_freq.to(pos.device)
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]

    @staticmethod
    def _rotate(x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

    def _attend(self, q, k, v, bias):
        """Attention of q [N, H, T, d] over k, v [N, KV, L, d] with additive `bias`
        [N, 1, T, L]; query heads grouped over their key/value head (GQA)."""
        n, h, t, d = q.shape
        g = h // self.kv_heads
        q = q.reshape(n, self.kv_heads, g, t, d)
        scores = (q @ k.unsqueeze(2).transpose(-1, -2)).float() * d**-0.5 + bias.unsqueeze(1)
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        return (probs @ v.unsqueeze(2)).reshape(n, h, t, d)

    def forward(self, ids, pos, keys, values, start: int, bias):
        """Logits [N, V] of the last of tokens `ids` [N, T] at positions `pos`, writing their
        keys/values into the buffers at [start, start+T) and attending over [0, start+T)."""
        m = self.model
        n, t = ids.shape
        end = start + t
        x = F.embedding(ids, m.model.embed_tokens.weight)
        cos, sin = self._rope(pos, x.dtype)
        for i, layer in enumerate(m.model.layers):
            a = layer.self_attn
            h = self._rms(x, layer.input_layernorm.weight)
            q = F.linear(h, a.q_proj.weight, a.q_proj.bias).view(n, t, self.heads, -1)
            k = F.linear(h, a.k_proj.weight, a.k_proj.bias).view(n, t, self.kv_heads, -1)
            v = F.linear(h, a.v_proj.weight, a.v_proj.bias).view(n, t, self.kv_heads, -1)
            q = self._rotate(q.transpose(1, 2), cos, sin)
            keys[i][:, :, start:end] = self._rotate(k.transpose(1, 2), cos, sin)
            values[i][:, :, start:end] = v.transpose(1, 2)
            o = self._attend(q, keys[i][:, :, :end], values[i][:, :, :end], bias)
            x = x + F.linear(o.transpose(1, 2).reshape(n, t, -1), a.o_proj.weight, a.o_proj.bias)
            mlp = layer.mlp
            h = self._rms(x, layer.post_attention_layernorm.weight)
            gate = F.silu(F.linear(h, mlp.gate_proj.weight)) * F.linear(h, mlp.up_proj.weight)
            x = x + F.linear(gate, mlp.down_proj.weight)
        last = self._rms(x[:, -1], m.model.norm.weight)
        return F.linear(last, m.lm_head.weight, getattr(m.lm_head, "bias", None))

    # --- sampling ------------------------------------------------------------------------------
    def sample(self, u_ids, u_mask, inverse, max_new_tokens: int, temperature: float,
               top_p: float, eos_id: int, pad_id: int):
        """(completion ids [N, C'], the sampler's log-prob of each [N, C']) for N rows, row r
        continuing distinct left-padded prompt `inverse[r]` of `u_ids`/`u_mask` [U, P].

        Tokens come from softmax(logits / T) (top-p filtered when top_p < 1; greedy when
        T = 0) through the global torch generator, so checkpointed RNG state resumes it. The
        log-prob is of the token under softmax(logits / T) — what the trainer computes. Rows
        past their EOS get `pad_id`; decoding stops once every row has ended (C' <= C).
        Raises FloatingPointError when the logits are not finite.
        """
        n, p = len(inverse), u_ids.shape[1]
        dev, dtype = u_ids.device, self.model.model.embed_tokens.weight.dtype
        width = p + max_new_tokens
        u_keys = [torch.zeros(len(u_ids), self.kv_heads, p, self.head_dim, dtype=dtype, device=dev)
                  for _ in self.model.model.layers]
        u_values = [torch.zeros_like(b) for b in u_keys]
        u_pos = (u_mask.cumsum(-1) - 1).clamp(min=0)
        logits = self.forward(u_ids, u_pos, u_keys, u_values, 0, _prefill_bias(u_mask))[inverse]
        keys = [torch.zeros(n, self.kv_heads, width, self.head_dim, dtype=dtype, device=dev)
                for _ in u_keys]
        values = [torch.zeros_like(b) for b in keys]
        for buf, src in zip(keys + values, u_keys + u_values, strict=True):
            buf[:, :, :p] = src[inverse]
        key_ok = torch.zeros(n, width, dtype=torch.bool, device=dev)
        key_ok[:, :p] = u_mask[inverse].bool()
        pos = u_pos[inverse, -1:]
        done = torch.zeros(n, dtype=torch.bool, device=dev)
        tokens, logps = [], []
        for step in range(max_new_tokens):
            token, logp = _draw(logits.float(), temperature, top_p)
            token = torch.where(done, torch.full_like(token, pad_id), token)
            tokens.append(token)
            logps.append(torch.where(done, torch.full_like(logp, math.nan), logp))
            done = done | (token == eos_id)
            if step == max_new_tokens - 1 or bool(done.all()):
                break
            key_ok[:, p + step] = True
            pos = pos + 1
            bias = _bias(key_ok[:, : p + step + 1])[:, None, None, :]
            logits = self.forward(token[:, None], pos, keys, values, p + step, bias)
        return torch.stack(tokens, dim=1), torch.stack(logps, dim=1)


def _bias(allowed: torch.Tensor) -> torch.Tensor:
    """0 where attention is allowed, -inf elsewhere (float32)."""
    return torch.zeros(allowed.shape, device=allowed.device).masked_fill(~allowed, -math.inf)


def _prefill_bias(mask: torch.Tensor) -> torch.Tensor:
    """[U, 1, P, P] causal attention over real tokens; a padding query sees itself only, so no
    row is all -inf (its output is never used)."""
    p = mask.shape[1]
    causal = torch.ones(p, p, dtype=torch.bool, device=mask.device).tril()
    eye = torch.eye(p, dtype=torch.bool, device=mask.device)
    return _bias((causal[None] & mask.bool()[:, None, :]) | eye[None])[:, None]


def _draw(logits: torch.Tensor, temperature: float, top_p: float):
    """(token [N], its log-prob under softmax(logits / T)) — by inverse-CDF sampling from the
    (top-p filtered) distribution, or the argmax when T = 0."""
    if not bool(torch.isfinite(logits).all()):
        raise FloatingPointError("non-finite logits while sampling")
    scaled = logits / temperature if temperature > 0 else logits
    logp_all = torch.log_softmax(scaled, dim=-1)
    if temperature <= 0:
        token = logits.argmax(dim=-1)
    else:
        probs = logp_all.exp()
        if top_p < 1.0:
            probs = _top_p(probs, top_p)
        cdf = probs.cumsum(dim=-1)
        u = torch.rand(len(probs), 1, device=probs.device) * cdf[:, -1:]
        token = torch.searchsorted(cdf, u, right=True).squeeze(1).clamp(max=probs.shape[1] - 1)
    return token, logp_all.gather(1, token[:, None]).squeeze(1)


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """`probs` with everything outside the smallest top-mass-`top_p` set zeroed (the most likely
    token always kept), as transformers' TopPLogitsWarper keeps it."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly above each token
    keep_sorted = before < top_p
    keep_sorted[:, 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)
    return probs * keep
