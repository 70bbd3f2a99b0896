"""The update's log-probs through twoclocks' own forward on a real sampled batch of the tiny
model, against transformers' forward of each row alone.

Truth: each row's real prompt tokens then its real completion tokens through the HF model, no
padding, nothing shared, log_softmax at the temperature; and the distinct useful prefixes listed
as Python tuples. The batch has prompts of several lengths, rows that end early (EOS) and rows cut
at max_new_tokens. Synthetic rows on random Llama/Qwen2 weights are
tests/unit/test_scorer_scored.py's.
"""

from __future__ import annotations

import numpy as np
import torch

from tests.support.training import load_tiny
from trainer.config import TrainConfig
from trainer.logprobs import completion_logprobs
from trainer.rollout.hf import HFEngine
from trainer.scorer import Scorer, plan

T = 0.8


def _sampled(path, tok, model):
    from trainer.data import ArithmeticTask, render_prompt

    problems = ArithmeticTask().sample(np.random.default_rng(3), 6)
    prompts = [render_prompt(p, tok) for p in problems for _ in range(4)]
    engine = HFEngine(TrainConfig(model=str(path), max_new_tokens=12), model, tok)
    torch.manual_seed(4)
    return engine.generate(prompts, temperature=T)


def _rows(roll):
    """(real prompt tokens, real completion tokens) of each row, as lists."""
    p = roll.prompt_len
    return [(roll.input_ids[i, :p][roll.attention_mask[i, :p].bool()].tolist(),
             roll.input_ids[i, p:][roll.completion_mask[i].bool()].tolist())
            for i in range(len(roll.texts))]


def test_sampled_rows_equal_each_row_alone(tiny_model):
    """Log-probs and entropies to 1e-5 relative (measured 9e-7), each parameter's gradient to
    1e-4 of its own largest entry (measured 8e-6: float32 sums over other row counts, and a
    shared prefix's rows summed first), all of them to 1e-5 of the largest; 0 off the real
    tokens; the forward runs exactly the distinct useful rows."""
    path, tok, model = load_tiny()
    roll = _sampled(path, tok, model)
    rows, c = _rows(roll), roll.completion_mask.shape[1]
    lengths = [len(done) for _, done in rows]
    assert len({len(prompt) for prompt, _ in rows}) > 1  # prompts of several lengths
    assert min(lengths) < c and max(lengths) == c  # rows ended early and rows cut

    want = torch.zeros(len(rows), c)
    want_ent = torch.zeros(len(rows), c)
    for i, (prompt, done) in enumerate(rows):
        logits = model(input_ids=torch.tensor([prompt + done])).logits[0, len(prompt) - 1 : -1]
        la = torch.log_softmax(logits / T, -1)
        want[i, : len(done)] = la.gather(-1, torch.tensor(done)[:, None]).squeeze(-1)
        want_ent[i, : len(done)] = -(la.exp() * la).sum(-1)
    w = torch.randn(want.shape, generator=torch.Generator().manual_seed(0))
    model.zero_grad(set_to_none=True)
    (want * w).sum().backward()
    g_want = {n: q.grad.clone() for n, q in model.named_parameters()}

    model.zero_grad(set_to_none=True)
    got, ent = completion_logprobs(Scorer(model), roll, T, with_entropy=True)
    (got * w).sum().backward()
    real = roll.completion_mask.bool()
    scale = float(want.detach().abs().max())
    assert float((got.detach() - want.detach()).abs().max()) <= 1e-5 * scale
    assert float((ent - want_ent.detach()).abs().max()) <= 1e-5 * scale
    assert not got.detach()[~real].any() and not ent[~real].any()  # 0 off the real tokens
    top = max(float(g.abs().max()) for g in g_want.values())
    assert top > 1e-2  # a real gradient
    for name, q in model.named_parameters():
        g = g_want[name]
        gap = float((q.grad - g).abs().max())
        assert gap <= 1e-4 * float(g.abs().max()) + 1e-9 and gap <= 1e-5 * top, name
    model.zero_grad(set_to_none=True)

    prompts, body, head = set(), set(), set()
    for prompt, done in rows:
        prompts.add(tuple(prompt))
        head.update((tuple(prompt), tuple(done[:t])) for t in range(len(done)))
        body.update((tuple(prompt), tuple(done[:t])) for t in range(1, len(done)))
    pl = plan(roll.input_ids, roll.attention_mask, roll.prompt_len, real)
    assert pl.body_rows == sum(map(len, prompts)) + len(body)
    assert len(pl.head_rows) == len(head) < int(real.sum())  # some prefixes shared
