"""The update's achieved FLOP/s on a real model, as a share of a GEMM peak of the same dtype
measured in the same run.

Why: a trainer's update is matrix products; on CPU a forward + backward that reaches a small
share of what one large matmul reaches wastes the machine. One micro-batch of the shape
`examples/smollm2-train.toml` trains (4 prompts x G = 8 completions of up to 24 tokens, sampled
by SmolLM2-135M-Instruct at T = 0.7 from its chat-template prompts) goes through the trainer's
own forward (trainer/scorer.py) and a token-mean log-prob loss's backward.

Only useful work is counted: each distinct prompt's real tokens once and each distinct
completion prefix once through the body (rows sharing a prompt and their tokens so far share the
work; padding is not work), and the LM head on the positions that score a real completion token
(a distinct prefix once), times 2 x the matmul parameters for the forward and 4 x for the
backward; attention scores are left out (sequences of ~60 tokens: under 1% here). Padded slots
the forward runs anyway count as lost, so the fraction shows them. The peak is the median of
square matmuls of the same dtype at the same thread count, alternated with the update so load
changes hit both. Target: >= 60%.

    python bench/update_flops.py [--runs 10] [--threads 2] [--gemm 2048] [--dtype float32]
"""

from __future__ import annotations

import argparse
import statistics
import time


def matmul_params(model) -> tuple[int, int]:
    """(body, head): parameters multiplied per token by the transformer's nn.Linear layers and
    by the LM head (tied or not); embeddings are lookups, norms are vector work."""
    import torch

    head = model.get_output_embeddings()
    body = sum(m.weight.numel() for m in model.modules()
               if isinstance(m, torch.nn.Linear) and m is not head)
    return body, head.weight.numel()


def useful_tokens(roll, group: int) -> tuple[int, int]:
    """(body, head): token positions whose work is needed. Body: each distinct prompt's real
    tokens once, and each distinct (prompt, completion prefix) ending in a real completion token
    that predicts another; head: each distinct (prompt, prefix) predicting a real completion
    token. Padding and duplicate prefixes are not counted."""
    p = roll.prompt_len
    prompts, body_nodes, head_nodes = set(), set(), set()
    for row in range(roll.input_ids.shape[0]):
        prompt = tuple(roll.input_ids[row, :p][roll.attention_mask[row, :p].bool()].tolist())
        prompts.add(prompt)
        done = roll.input_ids[row, p:][roll.completion_mask[row].bool()].tolist()
        for t in range(len(done)):
            head_nodes.add((prompt, tuple(done[:t])))
            if t:
                body_nodes.add((prompt, tuple(done[:t])))
    return sum(map(len, prompts)) + len(body_nodes), len(head_nodes)


def run_slots(roll) -> int:
    """Token slots the forward runs: each distinct padded prompt once, every completion slot."""
    import torch

    p = roll.prompt_len
    rows = torch.cat([roll.input_ids[:, :p], roll.attention_mask[:, :p]], dim=1)
    return len(torch.unique(rows, dim=0)) * p + roll.completion_mask.numel()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="Alternating runs of update and GEMM.")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gemm", type=int, default=2048, help="Side of the square peak matmul.")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="The model's and the peak matmul's dtype.")
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
    dtype = getattr(torch, a.dtype)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
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
    (body, head), (body_tok, head_tok) = matmul_params(model), useful_tokens(roll, g)
    flops = 6 * (body * body_tok + head * head_tok)
    x, y = (torch.randn(a.gemm, a.gemm, dtype=dtype) for _ in range(2))

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
          f"{run_slots(roll)} token slots run, {body_tok} useful through the body, {head_tok} "
          f"through the LM head; {body / 1e6:.1f}M body + {head / 1e6:.1f}M head matmul params")
    print(f"update forward + backward ({a.dtype}): {1000 * u:.0f} ms (median of {a.runs}) = "
          f"{achieved / 1e9:.1f} useful GFLOP/s")
    print(f"{a.dtype} GEMM {a.gemm}^2: {1000 * m:.1f} ms = {peak / 1e9:.1f} GFLOP/s peak "
          f"({a.threads} threads)")
    print(f"update / peak: {achieved / peak:.2f} (target >= 0.60)")

if __name__ == "__main__":
    main()
