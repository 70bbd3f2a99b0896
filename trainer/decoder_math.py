"""The Qwen2/Llama decoder layer as plain tensor functions, shared by the decode loop
(`trainer.rollout.decode`) and the update's forward (`trainer.scorer`).

A layer is split around attention into two blocks over token rows [T, D] (any batch flattened):
`pre_attention` (RMSNorm, one fused q/k/v projection, RoPE) and `post_attention` (output
projection, residual, RMSNorm, one fused gate/up projection, SwiGLU, down projection,
residual). Attention itself, which depends on who may see whom, stays with the caller. They
reproduce transformers' forward of the same weights exactly in float32
(tests/unit/test_scorer.py). (torch.compile of the two blocks was measured slower than eager
on 2 CPU cores here: inductor's kernels for dynamic row counts lost to ATen's.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# model types whose layers these functions reproduce (biases are read where present)
ARCHITECTURES = ("qwen2", "llama")


def rope_config(config) -> tuple[str, float]:
    """(rope type, theta) in either transformers layout (rope_parameters, or rope_scaling +
    rope_theta before v5)."""
    params = getattr(config, "rope_parameters", None) or {}
    scaling = getattr(config, "rope_scaling", None) or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    return kind, float(theta)


def unsupported(model) -> str | None:
    """Why these functions cannot reproduce `model`'s forward (None when they can)."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in ARCHITECTURES:
        return f"model_type {kind!r} (twoclocks' own forward knows {', '.join(ARCHITECTURES)})"
    rope, _ = rope_config(config)
    if rope != "default":
        return f"rope_type {rope!r} (twoclocks' own forward knows 'default')"
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return "sliding-window attention"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r}"
    if not hasattr(model, "lm_head") or not hasattr(getattr(model, "model", None), "layers"):
        return "no lm_head / model.layers"
    return None


@dataclass(frozen=True)
class Dims:
    """A model's attention geometry and RoPE frequencies, read once from its config."""

    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    inv_freq: torch.Tensor  # [head_dim / 2] float32

    @classmethod
    def of(cls, config) -> Dims:
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        _, theta = rope_config(config)
        half = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        return cls(heads, getattr(config, "num_key_value_heads", None) or heads, head_dim,
                   config.rms_norm_eps, 1.0 / (theta**half))

    def rope(self, pos: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [..., 1, head_dim] for positions `pos` [...] (rotate-half layout, computed
        in float32 and cast, as transformers does), broadcasting over the heads axis."""
        freqs = pos.float()[..., None] * self.inv_freq.to(pos.device)
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype).unsqueeze(-2), emb.sin().to(dtype).unsqueeze(-2)


def _cat_bias(mods) -> torch.Tensor | None:
    """The biases of linear layers `mods` concatenated (zeros for those without), or None."""
    if all(m.bias is None for m in mods):
        return None
    return torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.out_features)
                      for m in mods])


def rms_norm(x, weight, eps: float):
    """transformers' Qwen2/Llama RMSNorm: normalised in float32, cast back, then scaled."""
    dtype = x.dtype
    x = x.float()
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)


def rotate(x, cos, sin):
    """RoPE in the rotate-half layout."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def pre_attention(x, norm_w, w, b, cos, sin, eps: float, heads: int, kv_heads: int):
    """q [T, H, d], k, v [T, KV, d] of token rows x [T, D], q and k rotated by cos/sin [T, 1, d]."""
    h = rms_norm(x, norm_w, eps)
    d = w.shape[0] // (heads + 2 * kv_heads)
    q, k, v = F.linear(h, w, b).split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q = rotate(q.unflatten(-1, (heads, d)), cos, sin)
    k = rotate(k.unflatten(-1, (kv_heads, d)), cos, sin)
    return q, k, v.unflatten(-1, (kv_heads, d))


def post_attention(x, o, o_w, o_b, norm_w, gu_w, gu_b, down_w, down_b, eps: float):
    """The layer's output rows from its input rows x [T, D] and attention output o [T, H*d]."""
    x = x + F.linear(o, o_w, o_b)
    gate, up = F.linear(rms_norm(x, norm_w, eps), gu_w, gu_b).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, down_w, down_b)


class Layers:
    """Runs `model`'s decoder layers block by block; attention is the caller's `attend`."""

    def __init__(self, model):
        self.model = model
        self.dims = Dims.of(model.config)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.model.model.embed_tokens.weight)

    def run(self, x, cos, sin, attend):
        """Rows x [T, D] through every layer; `attend(i, q, k, v)` returns layer i's attention
        output [T, H*d] from its rows' q [T, H, d], k, v [T, KV, d]."""
        dims = self.dims
        for i, layer in enumerate(self.model.model.layers):
            a, mlp = layer.self_attn, layer.mlp
            qkv = (a.q_proj, a.k_proj, a.v_proj)
            q, k, v = pre_attention(
                x, layer.input_layernorm.weight, torch.cat([m.weight for m in qkv]),
                _cat_bias(qkv), cos, sin, dims.eps, dims.heads, dims.kv_heads,
            )
            gu = (mlp.gate_proj, mlp.up_proj)
            x = post_attention(
                x, attend(i, q, k, v), a.o_proj.weight, a.o_proj.bias,
                layer.post_attention_layernorm.weight, torch.cat([m.weight for m in gu]),
                _cat_bias(gu), mlp.down_proj.weight, mlp.down_proj.bias, dims.eps,
            )
        return x

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The LM head's logits of final rows x [T, D] (final norm applied)."""
        m = self.model
        x = rms_norm(x, m.model.norm.weight, self.dims.eps)
        return F.linear(x, m.lm_head.weight, getattr(m.lm_head, "bias", None))
