"""bench/decode_flops.py's useful-token count against the passes the decode loop really runs on
the tiny model: the pre-fill's distinct prompts, then one row per distinct live history."""

from __future__ import annotations

import torch

from tests.support.bench import load_bench
from tests.support.training import load_tiny
from trainer.config import TrainConfig
from trainer.rollout.hf import HFEngine


def test_useful_tokens_are_the_loops_own_passes(tiny_model):
    """Every row a pass after the pre-fill runs is one distinct (prompt, prefix) a next token
    is drawn after (the body's prefixes); the LM head works on those and on each distinct
    prompt's last position. Rows of a group share passes and ended rows run none: fewer rows
    than a row-by-row loop feeds (each row's real tokens but its last)."""
    bench = load_bench("decode_flops")
    path, tok, model = load_tiny()
    engine = HFEngine(TrainConfig(model=str(path), max_new_tokens=10), model, tok)
    passes, forward = [], engine.decoder.forward

    def counted(ids, *args):
        passes.append(tuple(ids.shape))
        return forward(ids, *args)

    engine.decoder.forward = counted
    prompts = [f"{a}+{b}=" for a, b in ((12, 7), (30, 41), (5, 5))]
    torch.manual_seed(0)
    roll = engine.generate([q for q in prompts for _ in range(8)], temperature=1.0)
    body, head = bench.useful_tokens(roll)
    real_prompt = int(roll.attention_mask[::8, : roll.prompt_len].sum())
    decoded = sum(n for n, t in passes[1:])
    assert passes[0][0] == 3 and all(t == 1 for _, t in passes[1:])
    assert body == real_prompt + decoded
    assert head == 3 + decoded
    assert decoded < int(roll.completion_mask.sum()) - 24
