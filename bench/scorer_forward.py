"""The update's forward + backward: twoclocks' own forward (trainer/scorer.py) vs transformers'.

One micro-batch of the bench's shape — 8 prompts x G=8 completions of 12 tokens sampled by the
tiny model (left-padded prompts, some completions ended early) — scored and back-propagated
through a token-mean log-prob loss, alternating the two forwards; prints the median ms of each
and their ratio. Both share each prompt across its group (transformers through its KV cache).
Two more contenders are baselines of twoclocks' own choices: its attention through torch's
scaled_dot_product_attention (what it runs on CUDA) instead of the CPU's batched matmuls, and
every completion position run for its own row instead of each prefix shared by the rows of a
group run once.

    python bench/scorer_forward.py [--runs 40] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40, help="Alternating runs of each forward.")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.config import TrainConfig
    from trainer.data import ArithmeticTask, render_prompt
    from trainer.logprobs import completion_logits
    from trainer.rollout.hf import HFEngine
    from trainer.scorer import Scorer
    from trainer.tiny import ensure_tiny_model

    torch.set_num_threads(a.threads)
    path = ensure_tiny_model(progress=True)
    tok = AutoTokenizer.from_pretrained(str(path), padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    problems = ArithmeticTask().sample(np.random.default_rng(0), 8)
    prompts = [render_prompt(p, tok) for p in problems for _ in range(8)]
    torch.manual_seed(0)
    roll = HFEngine(TrainConfig(model=str(path), max_new_tokens=12), model, tok).generate(prompts)
    ids, mask, p = roll.input_ids, roll.attention_mask, roll.prompt_len
    cm = roll.completion_mask.float()
    model.train()
    scorer = Scorer(model)
    forwards = {"transformers": lambda: completion_logits(model, ids, mask, p),
                "twoclocks": lambda: scorer(ids, mask, p),
                "twoclocks-sdpa": lambda: _with_sdpa(lambda: scorer(ids, mask, p)),
                "twoclocks-unshared": lambda: _unshared(lambda: scorer(ids, mask, p))}

    def once(forward) -> float:
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        logp = torch.log_softmax(forward().float(), -1).gather(-1, ids[:, p:, None]).squeeze(-1)
        ((logp * cm).sum() / cm.sum()).backward()
        return time.perf_counter() - t

    for f in forwards.values():  # warm-up
        once(f)
        once(f)
    times = {k: [] for k in forwards}
    for _ in range(a.runs):
        for k, f in forwards.items():
            times[k].append(once(f))
    med = {k: 1000 * statistics.median(v) for k, v in times.items()}
    print(f"micro-batch: {len(ids)} rows, {p} prompt + {ids.shape[1] - p} completion tokens")
    for k, v in med.items():
        print(f"{k:>13} forward + backward: {v:6.1f} ms (median of {a.runs})")
    print(f"ratio transformers/twoclocks: {med['transformers'] / med['twoclocks']:.2f}x")
    print(f"ratio twoclocks-sdpa/twoclocks: {med['twoclocks-sdpa'] / med['twoclocks']:.2f}x "
          "(its attention by torch's scaled_dot_product_attention, as on CUDA, instead of the "
          "CPU's batched matmuls)")
    print(f"ratio twoclocks-unshared/twoclocks: "
          f"{med['twoclocks-unshared'] / med['twoclocks']:.2f}x (every completion position run "
          "for its own row, instead of each prefix the rows of a group share once)")


def _unshared(forward):
    """`forward()` with every completion position run for its own row (no prefix shared by
    the rows of a group run once): the baseline of that sharing."""
    import torch

    import trainer.scorer as scorer_mod

    def alone(prompt, tokens, mask):
        flat = torch.arange(tokens.numel())
        return flat, flat.clone()

    plain, scorer_mod._prefix_nodes = scorer_mod._prefix_nodes, alone
    try:
        return forward()
    finally:
        scorer_mod._prefix_nodes = plain


def _with_sdpa(forward):
    """`forward()` with the Scorer's attention through scaled_dot_product_attention (the path
    decoder_math.attention takes off the CPU): the baseline of its CPU matmul path."""
    import torch.nn.functional as F

    import trainer.scorer as scorer_mod

    def sdpa(q, k, v, bias, scale=1.0):
        g = q.shape[1] // k.shape[1]
        k, v = (x if g == 1 else x.repeat_interleave(g, dim=1) for x in (k, v))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), scale=scale)

    plain, scorer_mod.attention = scorer_mod.attention, sdpa
    try:
        return forward()
    finally:
        scorer_mod.attention = plain


if __name__ == "__main__":
    main()
