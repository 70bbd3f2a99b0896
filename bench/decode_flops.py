"""The HF engine's decode loop's achieved FLOP/s on a real model, as a share of a GEMM peak of the
same dtype measured in the same run, with a breakdown of where the rest of its time goes.

Why: sampling a GRPO batch is matrix products too; a loop that reaches a small share of what one
large matmul reaches spends its time on bookkeeping, or on products too thin (a few rows a pass)
to use the machine; the breakdown and the matmul replay below tell which. One step's rollout of
`examples/smollm2-train.toml` (4 prompts x G = 8 completions of up to 24 tokens, T = 0.7, from
SmolLM2-135M-Instruct's chat-template prompts) is sampled by the engine (trainer/rollout/hf.py,
its decode loop trainer/rollout/decode.py) with a fixed seed, so every run samples the same
tokens.

Only useful work is counted: each distinct prompt's real tokens once (the pre-fill), and each
distinct (prompt, completion prefix) that a row needs a next token for once through the body and
the LM head (rows of a group that sampled the same tokens so far need one pass; a row ended at
its EOS and padding are not work), times 2 x the matmul parameters; attention scores are left
out (an upper bound is printed: ~4% here). The peak is the median of square matmuls of the same
dtype at the same thread count, alternated with the rollout so load changes hit both. Target:
>= 50%.

The breakdown is one more rollout under torch.profiler: each aten op's own time goes to the loop
part whose scope (decode.py's PREFILL, STEP, DRAW, CACHE, SHARE) encloses it, the step's split
into matmuls and the rest; what the ops do not account for of that run's time is Python
(interpreter, dispatch) overhead (the profiler's own cost lands there too). Beside it, the
loop's matmuls alone: its own weights in its own layout on constant rows, at the row counts of
the loop's passes (a pass of few rows streams every weight for little work: the limit that the
loop's shapes set, below the square GEMM's).

    python bench/decode_flops.py [--runs 10] [--threads 2] [--gemm 2048] [--dtype float32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from matmul_rate import alternate, gemm_timer, matmul_params, rate_args, rate_lines, smollm2_batch  # noqa: E402

MATMULS = ("aten::mm", "aten::addmm")
PARTS = ("prefill", "step matmuls", "step other ops", "sampling", "cache handling",
         "row sharing", "outside the loop", "python overhead")


def useful_tokens(roll) -> tuple[int, int]:
    """(body, head): token positions a rollout needed. Body: each distinct prompt's real tokens
    (the pre-fill) and each distinct (prompt, completion prefix) ending in a real completion
    token that a next token was drawn after; head: each distinct (prompt, prefix) a real
    completion token was drawn from. Padding, tokens after a row's EOS and prefixes that rows
    share beyond the first are not work."""
    p = roll.prompt_len
    prompts, body_nodes, head_nodes = set(), set(), set()
    for row in range(roll.input_ids.shape[0]):
        prompt = tuple(roll.input_ids[row, :p][roll.attention_mask[row, :p].bool()].tolist())
        prompts.add(prompt)
        drawn = roll.input_ids[row, p:][roll.completion_mask[row].bool()].tolist()
        for t in range(len(drawn)):
            head_nodes.add((prompt, tuple(drawn[:t])))
            if t:
                body_nodes.add((prompt, tuple(drawn[:t])))
    return sum(map(len, prompts)) + len(body_nodes), len(head_nodes)


def attention_flops(model, roll) -> int:
    """2 x 2 (q.k and p.v) x head dim x heads x layers per (real position, real key up to
    it) of every row: an upper bound (shared prefixes counted per row) on what the count above
    leaves out."""
    c = model.config
    heads, layers = c.num_attention_heads, c.num_hidden_layers
    d = getattr(c, "head_dim", None) or c.hidden_size // heads
    seen = roll.attention_mask.cumsum(-1) * roll.attention_mask  # keys each position sees
    return int(4 * layers * heads * d * seen.sum())


def decode_flops(model, roll) -> tuple[int, int, int]:
    """(useful FLOPs, body tokens, head tokens) of a rollout: 2 x matmul parameters per token."""
    (body, head), (body_tok, head_tok) = matmul_params(model), useful_tokens(roll)
    return 2 * (body * body_tok + head * head_tok), body_tok, head_tok


def breakdown(events, wall: float) -> dict[str, float]:
    """Seconds of `wall` per part (PARTS) from a profiler's events: each aten op's own time to
    the innermost decode scope around it; the wall time no op accounts for is Python's."""
    from trainer.rollout import decode

    names = {decode.PREFILL: "prefill", decode.STEP: "step", decode.DRAW: "sampling",
             decode.CACHE: "cache handling", decode.SHARE: "row sharing"}
    out = dict.fromkeys(PARTS, 0.0)
    for ev in events:
        if not ev.name.startswith("aten::") or (ev.cpu_parent and
                                                ev.cpu_parent.name.startswith("aten::")):
            continue  # a top-level op's total holds its children's
        scope, up = "outside the loop", ev.cpu_parent
        while up is not None:
            if up.name in names:
                scope = names[up.name]
                break
            up = up.cpu_parent
        if scope == "step":
            scope = "step matmuls" if _has_matmul(ev) else "step other ops"
        out[scope] += ev.cpu_time_total / 1e6
    out["python overhead"] = max(wall - sum(out.values()), 0.0)
    return out


def _has_matmul(ev) -> bool:
    return ev.name in MATMULS or any(_has_matmul(c) for c in ev.cpu_children)


def replay_matmuls(decoder, passes: list[tuple[int, int]], dtype) -> float:
    """Seconds the matmuls of forwards over `passes` ((rows, tokens) per call) take alone: the
    loop's own weights in its own layout (`FastDecoder.fused`), every layer's projections on
    rows x tokens rows, the LM head on the last."""
    import torch
    import torch.nn.functional as F

    weights, layers = decoder.fused(), decoder.model.model.layers
    mats = []
    for (w, _, gu_w, _, *rest), layer in zip(weights.layers, layers, strict=True):
        o_w, down_w = rest or (layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight)
        mats += [w, o_w, gu_w, down_w]
    head = decoder.model.lm_head.weight if weights.head is None else weights.head
    t = time.perf_counter()
    for n, k in passes:
        for w in mats:
            F.linear(torch.ones(n * k, w.shape[1], dtype=dtype), w)
        F.linear(torch.ones(n, head.shape[1], dtype=dtype), head)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    rate_args(ap, "rollout")
    a = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from trainer.rollout.hf import HFEngine

    torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    b = smollm2_batch(dtype)
    model, cfg = b.model.eval(), b.cfg
    engine = HFEngine(cfg, model, b.tokenizer)
    if engine.decoder is None:
        raise SystemExit("the HF engine does not run its own decode loop on this model")

    def rollout():
        torch.manual_seed(0)  # the same tokens every run: the same work
        return engine.generate(b.prompts, temperature=cfg.temperature)

    def timed_rollout() -> float:
        t = time.perf_counter()
        rollout()
        return time.perf_counter() - t

    passes, forward = [], engine.decoder.forward

    def counted(ids, *args, **kw):
        passes.append(tuple(ids.shape))
        return forward(ids, *args, **kw)

    engine.decoder.forward = counted
    roll = rollout()  # warm-up, and the rollout every run repeats
    engine.decoder.forward = forward
    flops, body_tok, head_tok = decode_flops(model, roll)
    u, m = alternate(a.runs, timed_rollout, gemm_timer(a.gemm, dtype))
    with torch.no_grad():
        alone = statistics.median(replay_matmuls(engine.decoder, passes, dtype)
                                  for _ in range(a.runs))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        profiled = timed_rollout()
    parts = breakdown(prof.events(), profiled)
    rates, peak = rate_lines("rollout", a, u, m, flops, 0.50)
    n, c = roll.completion_mask.shape
    live = int(roll.completion_mask.sum())
    print(f"rollout: {n} rows, {roll.prompt_len} prompt + {c} completion positions, {live} "
          f"completion tokens; useful: {body_tok} tokens through the body, {head_tok} through "
          f"the LM head; attention scores {attention_flops(model, roll) / flops:.1%} of the count")
    print("\n".join(rates))
    print(f"its matmuls alone at its passes' row counts ({', '.join(str(n) for n, _ in passes)}):"
          f" {1000 * alone:.0f} ms = {flops / alone / peak:.2f} of peak, {alone / u:.0%} of the "
          f"rollout's time")
    print(f"where the rollout's time goes (one run under the profiler, {1000 * profiled:.0f} ms):")
    for name in PARTS:
        print(f"  {name:<18} {1000 * parts[name]:7.0f} ms  {parts[name] / profiled:6.1%}")


if __name__ == "__main__":
    main()
