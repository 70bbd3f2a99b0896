"""The Qwen2/Llama decoder layer as plain tensor functions, shared by the decode loop
(`trainer.rollout.decode`) and the update's forward (`trainer.scorer`).

A layer is split around attention into two blocks over token rows [T, D] (any batch flattened):
`pre_attention` (RMSNorm, one fused q/k/v projection, RoPE) and `post_attention` (output
projection, residual, RMSNorm, one fused gate/up projection, SwiGLU, down projection,
residual). Attention itself, which depends on who may see whom, stays with the caller. They
reproduce transformers' forward of the same weights to float rounding
(tests/unit/test_scorer.py, tests/unit/test_fast_decode.py). torch.compile of the two blocks
was measured slower than eager on 2 CPU cores here: inductor's kernels for dynamic row counts
lost to ATen's.
"""

from __future__ import annotations

import functools
import math
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

    def rope(self, pos: torch.Tensor, dtype, interleaved: bool):
        """The rotation for positions `pos` [...], broadcasting over a heads axis: unit complex
        numbers [..., 1, head_dim / 2] for `interleaved` rows (pairs (2i, 2i+1) rotate
        together), else cos, sin [..., 1, head_dim] of the rotate-half layout; angles in
        float32, as transformers computes them."""
        freqs = pos.float()[..., None] * self.inv_freq.to(pos.device)
        if interleaved:
            return torch.complex(freqs.cos(), freqs.sin()).unsqueeze(-2)
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype).unsqueeze(-2), emb.sin().to(dtype).unsqueeze(-2)

    def qk_interleave(self) -> torch.Tensor:
        """Row order of the fused q/k/v weight that puts each q and k head's rotate-half pairs
        (i, i + d/2) next to each other; v rows stay. Attention scores are sums over a head's
        dims, so q and k permuted alike give the same scores."""
        d = self.head_dim
        pairs = torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], 1).flatten()
        qk = (torch.arange(self.heads + self.kv_heads)[:, None] * d + pairs).flatten()
        v0 = (self.heads + self.kv_heads) * d
        return torch.cat([qk, torch.arange(v0, v0 + self.kv_heads * d)])


def additive_bias(allowed: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """0 where attention is allowed, -inf elsewhere."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
        ~allowed, -math.inf
    )


def prefill_bias(mask: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """[U, 1, P, P] causal attention over each left-padded row's real tokens; a padding query
    sees itself only, so no row is all -inf (its output is never used)."""
    p = mask.shape[1]
    causal = torch.ones(p, p, dtype=torch.bool, device=mask.device).tril()
    eye = torch.eye(p, dtype=torch.bool, device=mask.device)
    return additive_bias((causal[None] & mask.bool()[:, None, :]) | eye[None], dtype)[:, None]


def attention(q, k, v, bias, scale: float = 1.0) -> torch.Tensor:
    """softmax(scale * q kᵀ + bias) v of q [N, H, T, d] over k, v [N, KV, L, d] with additive
    `bias` [N, 1, T or 1, L]; output [N, H, T, d].

    On CPU it is plain batched matrix products: at the short lengths of a GRPO batch's rows
    (tens of tokens) they ran forward + backward in half the time of
    `scaled_dot_product_attention`'s CPU flash kernel (2.9 vs 6.4 ms for 120 rows, 4 heads,
    11 queries over 17 keys, 2 threads). Elsewhere (CUDA) that kernel, which never holds the
    score matrix. The G query heads of a key/value head (GQA) are stacked along the query axis,
    so the keys are used as they lie, with no repeated copy. Scores are softmaxed in float32 at
    least.
    """
    n, h, t, d = q.shape
    kv = k.shape[1]
    if q.device.type != "cpu":
        g = h // kv
        k, v = (x if g == 1 else x.repeat_interleave(g, dim=1) for x in (k, v))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), scale=scale)
    if h != kv and bias.shape[2] > 1:  # one bias row per query, for each head of a group
        bias = bias.repeat(1, 1, h // kv, 1)
    scores = q.reshape(n, kv, h // kv * t, d) @ k.transpose(-1, -2)
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    probs = torch.softmax(torch.add(bias, scores, alpha=scale), dim=-1).to(v.dtype)
    return (probs @ v).reshape(n, h, t, d)


def first_of_each(groups: torch.Tensor, count: int, index: torch.Tensor) -> torch.Tensor:
    """For group ids `groups` [K] in [0, count), the smallest of `index` [K] in each group: one
    representative of each (rows sharing a prefix, in the decode loop and the Scorer)."""
    first = torch.full((count,), torch.iinfo(index.dtype).max, dtype=index.dtype,
                       device=index.device)
    return first.scatter_reduce(0, groups, index, reduce="amin")


def row_ids(*columns: torch.Tensor) -> torch.Tensor:
    """An id of each distinct row of integer `columns` (each [N]), numbered in the rows'
    lexicographic order: the inverse of torch.unique(stack(columns, 1), dim=0,
    return_inverse=True). Computed on one int64 key per row (each column shifted to start at 0,
    weighted by the spans of those after it): unique over rows compares them entry by entry
    and took ~13x as long at a decode step's 128 rows (164 vs 13 us, 2 threads). Falls back to
    it when the spans' product would not fit in an int64."""
    columns = [col.long() for col in columns]  # a mask column may be bool
    if not len(columns[0]):
        return columns[0].new_zeros(0)
    key, room = None, 1
    for col in columns:
        lo, hi = (int(v) for v in torch.aminmax(col))
        span = hi - lo + 1
        room *= span
        if room >= 2**62:
            return torch.unique(torch.stack(columns, 1), dim=0, return_inverse=True)[1]
        shifted = col - lo
        key = shifted if key is None else key * span + shifted
    return torch.unique(key, return_inverse=True)[1]


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


def pre_attention(x, norm_w, w, b, rope, eps: float, heads: int, kv_heads: int):
    """q [T, H, d], k, v [T, KV, d] of token rows x [T, D], q and k rotated by `rope` (one
    complex multiply of interleaved rows, or cos/sin of rotate-half rows; see Dims.rope)."""
    h = rms_norm(x, norm_w, eps)
    d = w.shape[0] // (heads + 2 * kv_heads)
    qk, v = F.linear(h, w, b).split([(heads + kv_heads) * d, kv_heads * d], dim=-1)
    v = v.unflatten(-1, (kv_heads, d))
    if isinstance(rope, torch.Tensor):
        qk = torch.view_as_real(torch.view_as_complex(qk.unflatten(-1, (-1, d // 2, 2))) * rope)
        q, k = qk.flatten(-2).split([heads, kv_heads], dim=1)
        return q, k, v
    cos, sin = rope
    q, k = qk.unflatten(-1, (-1, d)).split([heads, kv_heads], dim=1)
    return rotate(q, cos, sin), rotate(k, cos, sin), v


def post_attention(x, o, o_w, o_b, norm_w, gu_w, gu_b, down_w, down_b, eps: float):
    """The layer's output rows from its input rows x [T, D] and attention output o [T, H*d]."""
    x = x + F.linear(o, o_w, o_b)
    gate, up = F.linear(rms_norm(x, norm_w, eps), gu_w, gu_b).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, down_w, down_b)


BLOCK = "twoclocks_block"  # a decoder layer's method FSDP treats as its forward


def layer_block(layer, x, rope, attend, i: int, layers: Layers, fused: tuple | None = None):
    """Decoder layer `layer` (number `i`) on rows x [T, D]: `layers.fuse` of its weights unless
    `fused` is given (`fuse`'s four, or `fuse_transposed`'s six), then pre-attention, the
    caller's `attend`, post-attention."""
    dims = layers.dims
    a, mlp = layer.self_attn, layer.mlp
    w, b, gu_w, gu_b, *rest = fused if fused is not None else layers.fuse(layer)
    o_w, down_w = rest or (a.o_proj.weight, mlp.down_proj.weight)
    q, k, v = pre_attention(x, layer.input_layernorm.weight, w, b, rope, dims.eps, dims.heads,
                            dims.kv_heads)
    return post_attention(
        x, attend(i, q, k, v), o_w, a.o_proj.bias,
        layer.post_attention_layernorm.weight, gu_w, gu_b, down_w,
        mlp.down_proj.bias, dims.eps,
    )


class Layers:
    """Runs `model`'s decoder layers block by block; attention is the caller's `attend`.

    In float32/float64 q and k come out in the interleaved layout (`Dims.qk_interleave`) and
    RoPE is one complex multiply; other dtypes (no complex bfloat16) keep rotate-half. Either
    way q and k share a layout, which is all attention needs; keys cached by the caller are in
    it too.
    """

    def __init__(self, model):
        self.model = model
        self.dims = Dims.of(model.config)
        self.interleaved = model.model.embed_tokens.weight.dtype in (torch.float32, torch.float64)
        self._perm = self.dims.qk_interleave() if self.interleaved else None

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings, through the embedding module itself (FSDP may shard it as a unit
        of its own, whose weight is gathered around the call)."""
        return self.model.model.embed_tokens(ids)

    def rope(self, pos: torch.Tensor, dtype):
        """The rotation of positions `pos` [T] in this model's q/k layout."""
        return self.dims.rope(pos, dtype, self.interleaved)

    def fuse(self, layer) -> tuple:
        """(q/k/v weight, its bias, gate/up weight, its bias) of one decoder layer: the
        projections run as one matrix each, q/k rows in this model's layout. Differentiable."""
        gu = (layer.mlp.gate_proj, layer.mlp.up_proj)
        return *self._qkv(layer), torch.cat([m.weight for m in gu]), _cat_bias(gu)

    def _qkv(self, layer) -> tuple:
        """The fused q/k/v weight of one layer, q/k rows in this model's layout, and its bias."""
        a = layer.self_attn
        qkv = (a.q_proj, a.k_proj, a.v_proj)
        w, b = torch.cat([m.weight for m in qkv]), _cat_bias(qkv)
        if self._perm is not None:
            perm = self._perm.to(w.device)
            w = w.index_select(0, perm)
            b = None if b is None else b.index_select(0, perm)
        return w, b

    def fuse_transposed(self, layer) -> tuple:
        """`fuse`'s four, then the output and down projections' weights, the gate/up and down
        ones stored transposed ([in, out] contiguous, returned as the [out, in] view): F.linear
        then multiplies by the stored matrix as it lies, which for a pass's few rows in float32
        on CPU ran 1.3-1.4x faster for these (the same numbers to float rounding); q/k/v and o
        ran no faster so, and bfloat16 products no faster at all. For fixed weights (decoding)."""
        a, mlp = layer.self_attn, layer.mlp
        gu = (mlp.gate_proj, mlp.up_proj)
        return (*self._qkv(layer), torch.cat([m.weight.t() for m in gu], 1).t(), _cat_bias(gu),
                a.o_proj.weight, transposed(mlp.down_proj.weight))

    def fused(self, stored_transposed: bool = False) -> list[tuple]:
        """`fuse` (or `fuse_transposed`) of every layer, for a caller running many forwards on
        fixed weights (decoding), which computes them once."""
        fuse = self.fuse_transposed if stored_transposed else self.fuse
        return [fuse(layer) for layer in self.model.model.layers]

    def run(self, x, rope, attend, fused: list[tuple] | None = None):
        """Rows x [T, D] through every layer; `attend(i, q, k, v)` returns layer i's attention
        output [T, H*d] from its rows' q [T, H, d], k, v [T, KV, d]. `fused`: `self.fused()`
        computed beforehand (else each layer's now, inside its block). A layer sharded by FSDP
        (`trainer.sharding`) carries its block as the method `BLOCK`, which gathers its weights
        first."""
        for i, layer in enumerate(self.model.model.layers):
            block = getattr(layer, BLOCK, None) or functools.partial(layer_block, layer)
            x = block(x, rope, attend, i, self, fused[i] if fused else None)
        return x

    def logits(self, x: torch.Tensor, head: torch.Tensor | None = None) -> torch.Tensor:
        """The LM head's logits of final rows x [T, D] (final norm applied); `head`: its weight
        in another layout (`transposed`), else the head is called as a module, as in `embed`."""
        m = self.model
        x = rms_norm(x, m.model.norm.weight, self.dims.eps)
        return m.lm_head(x) if head is None else F.linear(x, head, m.lm_head.bias)


def transposed(w: torch.Tensor) -> torch.Tensor:
    """`w` [out, in] stored transposed: the same values, a [out, in] view of [in, out] memory."""
    return w.t().contiguous().t()
