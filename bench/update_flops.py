"""The update's achieved FLOP/s on a real model, as a share of an fp32 GEMM peak measured in the
same run.

Why: a trainer's update is matrix products; on CPU a forward + backward that reaches a small
share of what one large matmul reaches wastes the machine. One micro-batch of the shape
`examples/smollm2-train.toml` trains (4 prompts x G = 8 completions of up to 24 tokens, sampled
by SmolLM2-135M-Instruct at T = 0.7 from its chat-template prompts) goes through the trainer's
own forward (trainer/scorer.py, each prompt run once per group) and a token-mean log-prob loss's
backward. Its FLOPs are counted from the tokens the forward actually runs (prompt tokens once per
group, completion tokens per row) times 2 x the matmul parameters (every Linear plus the tied
lm_head) for the forward and 4 x for the backward; attention scores are left out (sequences of
~60 tokens: under 1% here). The peak is the median of square fp32 matmuls at the same thread
count, alternated with the update so load changes hit both. Target: >= 50%.

    python bench/update_flops.py [--runs 10] [--threads 2] [--gemm 2048]
"""

from __future__ import annotations

import argparse
import statistics
import time


def matmul_params(model) -> int:
    """Parameters multiplied per token: every nn.Linear's weight (lm_head included, tied or
    not); embeddings are lookups, norms are vector work."""
    import torch

    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def run_tokens(roll, group: int) -> int:
    """Tokens the shared-prefix forward runs: each prompt once per group (its unpadded length),
    every completion token of every row (padding included: the forward runs it)."""
    prompt_mask = roll.attention_mask[:, : roll.prompt_len]
    prompts = int(prompt_mask[::group].sum())
    return prompts + roll.completion_mask.numel()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="Alternating runs of update and GEMM.")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gemm", type=int, default=2048, help="Side of the square peak matmul.")
    a = ap.parse_args()

    import tomllib
    from pathlib import Path

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.config import TrainConfig
    from trainer.data import ArithmeticTask
    from trainer.rollout.hf import HFEngine
    from trainer.scorer import Scorer
    from trainer.smollm2 import SMOLLM2_ID
    from trainer.tiny import resolve_model_path

    torch.set_num_threads(a.threads)
    example = tomllib.loads((Path(__file__).resolve().parents[1] / "examples" /
                             "smollm2-train.toml").read_text())
    g = example["group_size"]
    path = resolve_model_path(SMOLLM2_ID)
    tok = AutoTokenizer.from_pretrained(str(path), padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    cfg = TrainConfig(model=str(path), max_new_tokens=example["max_new_tokens"],
                      temperature=example["temperature"],
                      prompt_template=example["prompt_template"])
    problems = ArithmeticTask(max_value=example["arith_max_value"],
                              ops=tuple(example["arith_ops"])).sample(
        np.random.default_rng(0), example["prompts_per_batch"])
    prompts = [cfg.prompt_template.format(question=q.question) for q in problems for _ in range(g)]
    torch.manual_seed(0)
    roll = HFEngine(cfg, model.eval(), tok).generate(prompts, temperature=cfg.temperature)
    ids, mask, p = roll.input_ids, roll.attention_mask, roll.prompt_len
    cm = roll.completion_mask.float()
    model.train()
    scorer = Scorer(model)
    flops = 6 * matmul_params(model) * run_tokens(roll, g)
    x, y = torch.randn(a.gemm, a.gemm), torch.randn(a.gemm, a.gemm)

    def update() -> float:
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        logits = scorer(ids, mask, p).float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, p:, None]).squeeze(-1)
        ((logp * cm).sum() / cm.sum()).backward()
        return time.perf_counter() - t

    def gemm() -> float:
        t = time.perf_counter()
        for _ in range(4):
            torch.mm(x, y)
        return (time.perf_counter() - t) / 4

    update(), gemm()  # warm-up
    ups, gems = [], []
    for _ in range(a.runs):
        ups.append(update())
        gems.append(gemm())
    u, m = statistics.median(ups), statistics.median(gems)
    achieved, peak = flops / u, 2 * a.gemm**3 / m
    print(f"micro-batch: {len(ids)} rows, {p} prompt + {ids.shape[1] - p} completion positions; "
          f"{run_tokens(roll, g)} tokens run, {matmul_params(model) / 1e6:.1f}M matmul params")
    print(f"update forward + backward: {1000 * u:.0f} ms (median of {a.runs}) = "
          f"{achieved / 1e9:.1f} GFLOP/s")
    print(f"fp32 GEMM {a.gemm}^2: {1000 * m:.1f} ms = {peak / 1e9:.1f} GFLOP/s peak "
          f"({a.threads} threads)")
    print(f"update / peak: {achieved / peak:.2f} (target >= 0.50)")


if __name__ == "__main__":
    main()
