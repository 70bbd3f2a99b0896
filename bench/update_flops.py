"""The update's achieved FLOP/s on a real model, as a share of a GEMM peak of the same dtype
measured in the same run.

Why: a trainer's update is matrix products; on CPU a forward + backward that reaches a small
share of what one large matmul reaches wastes the machine. One micro-batch of the shape
`examples/smollm2-train.toml` trains (4 prompts x G = 8 completions of up to 24 tokens, sampled
by SmolLM2-135M-Instruct at T = 0.7 from its chat-template prompts) goes through the trainer's
own log-probs (`completion_logprobs` on trainer/scorer.py's forward) and a token-mean log-prob
loss's backward.

Only useful work is counted: each distinct prompt's real tokens once and each distinct
completion prefix once through the body (rows sharing a prompt and their tokens so far share the
work; padding is not work), and the LM head on the positions that score a real completion token
(a distinct prefix once), times 2 x the matmul parameters for the forward and 4 x for the
backward; attention scores, norms, the log-softmax and the index bookkeeping are left out
(sequences of ~60 tokens: attention is under 1% here). It prints where the batch's padded slots
go (prompt padding, repeated prompts, completion slots that feed no prediction, repeated
prefixes, useful), the rows the forward runs (from its own plan: any above the useful count is
work done and not counted), and those rows for the example's micro-batches, in row order and
sorted by length. The peak is the median of square matmuls of the same dtype at the same thread
count, alternated with the update so load changes hit both. Target: >= 60%.

    python bench/update_flops.py [--runs 10] [--threads 2] [--gemm 2048] [--dtype float32]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from matmul_rate import alternate, gemm_timer, matmul_params, rate_args, rate_lines, smollm2_batch  # noqa: E402


def distinct_work(roll) -> tuple[int, int, int]:
    """(prompt tokens, prefixes, predictions) whose work is needed: each distinct prompt's real
    tokens; each distinct (prompt, completion prefix) ending in a real completion token that
    predicts another; each distinct (prompt, prefix) predicting a real completion token.
    Padding and repeats are not counted."""
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
    return sum(map(len, prompts)), len(body_nodes), len(head_nodes)


def useful_tokens(roll) -> tuple[int, int]:
    """(body, head): token positions whose work is needed (`distinct_work`)."""
    prompt, prefixes, head = distinct_work(roll)
    return prompt + prefixes, head


def slot_breakdown(roll) -> dict[str, int]:
    """Where the padded batch's N x (P + C) input slots go, summing to it: prompt padding,
    repeated prompts (rows of one group), completion slots whose output predicts no real token
    (padding, each row's last token), repeated completion prefixes, and the useful rest; and
    where its N x C predicted positions go: padding, repeated (a prefix rows share), useful."""
    p = roll.prompt_len
    n, c = roll.completion_mask.shape
    prompt, prefixes, head = distinct_work(roll)
    prompt_real = int(roll.attention_mask[:, :p].sum())
    real = int(roll.completion_mask.sum())
    feeding = real - int(roll.completion_mask.any(1).sum())  # inputs predicting a real token
    return {"slots": n * (p + c), "prompt padding": n * p - prompt_real,
            "repeated prompts": prompt_real - prompt,
            "completion slots predicting nothing": n * c - feeding,
            "repeated prefixes": feeding - prefixes, "useful": prompt + prefixes,
            "positions": n * c, "padding": n * c - real, "repeated": real - head,
            "useful head": head}


def run_rows(roll, rows=None) -> tuple[int, int, int]:
    """(body rows, LM head rows, completion width laid out for attention) the trainer's forward
    runs to score the real completion tokens of `rows` (default all) as one micro-batch."""
    from trainer.scorer import plan

    part = roll if rows is None else roll.select(rows)
    pl = plan(part.input_ids, part.attention_mask, part.prompt_len,
              part.completion_mask.bool())
    return pl.body_rows, len(pl.head_rows), pl.width


def split_rows(roll, size: int) -> str:
    """Rows run for `roll` in micro-batches of `size`: rows in order (the trainer's split,
    which keeps a group's rows together) and sorted by completion length."""
    import torch

    order = torch.arange(len(roll.texts))
    by_len = roll.completion_mask.sum(1).argsort(stable=True)
    out = []
    for name, rows in (("in row order", order), ("sorted by length", by_len)):
        counts = [run_rows(roll, mb) for mb in rows.split(size)]
        body, head = sum(b for b, _, _ in counts), sum(h for _, h, _ in counts)
        widths = "/".join(str(w) for _, _, w in counts)
        out.append(f"{name}: body {body}, head {head} (widths {widths})")
    return f"micro-batches of {size}: " + "; ".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    rate_args(ap, "update")
    a = ap.parse_args()

    import torch

    from trainer.logprobs import completion_logprobs
    from trainer.rollout.hf import HFEngine
    from trainer.scorer import Scorer

    torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    b = smollm2_batch(dtype)
    model, cfg = b.model, b.cfg
    torch.manual_seed(0)
    roll = HFEngine(cfg, model.eval(), b.tokenizer).generate(b.prompts,
                                                              temperature=cfg.temperature)
    ids, p = roll.input_ids, roll.prompt_len
    cm = roll.completion_mask.float()
    model.train()
    scorer = Scorer(model)
    (body, head), (body_tok, head_tok) = matmul_params(model), useful_tokens(roll)
    flops = 6 * (body * body_tok + head * head_tok)

    def update() -> float:
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        logp, _ = completion_logprobs(scorer, roll, cfg.temperature)
        ((logp * cm).sum() / cm.sum()).backward()
        return time.perf_counter() - t

    u, m = alternate(a.runs, update, gemm_timer(a.gemm, dtype))
    run_body, run_head, width = run_rows(roll)
    slots = slot_breakdown(roll)
    print(f"micro-batch: {len(ids)} rows, {p} prompt + {ids.shape[1] - p} completion positions; "
          f"{body / 1e6:.1f}M body + {head / 1e6:.1f}M head matmul params")
    print("input slots: " + ", ".join(f"{k} {v}" for k, v in list(slots.items())[:6]))
    print("predicted positions: " + ", ".join(f"{k} {v}" for k, v in list(slots.items())[6:]))
    print(f"run by the forward: {run_body} body rows ({body_tok} useful), {run_head} LM head rows "
          f"({head_tok} useful); attention laid out over {width} completion positions")
    print(split_rows(roll, b.example["micro_batch_size"]))
    print("\n".join(rate_lines("update forward + backward", a, u, m, flops, 0.60)[0]))


if __name__ == "__main__":
    main()
