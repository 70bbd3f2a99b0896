"""The HF engine's decode loop draws the tokens its sampling rule names: each fixed-seed rollout
of the tiny model, replayed against a plain decoder — transformers' own forward over each row's
whole sequence, no cache, no rows shared — with the same uniforms.

The loop takes one uniform per row per step from the global torch generator (none when greedy)
and picks the token where it falls in the (top-p filtered) softmax(logits / T)'s cumulative
sum. Replayed here: the same seed gives the same uniforms, and at every real token the plain
forward's distribution must put the uniform inside the chosen token's interval, and give the
log-prob the loop returned; greedy tokens must be the plain forward's argmax. Both up to a
tolerance for the two forwards' rounding (float32: 1e-4, as the loop is held to transformers'
forward in tests/integration/test_fast_decode_tiny.py; seen here: 1e-5 and no token off its
interval. The bf16 copy: its two forwards round apart, seen up to 0.13 in a log-prob and 0.002
in the cumulative sum), and nearly every token must pass with no tolerance at all. This holds on any
CPU: the tiny model's weights, built by training, differ from one CPU model to another (its
float sums round differently), so stored rollouts would not.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from tests.support.training import load_tiny
from trainer.config import TrainConfig
from trainer.rollout.hf import HFEngine

SEED = 7
# (name, dtype of the sampling copy, temperature, top_p, group size, max_new_tokens)
CASES = (
    ("t0.7", "float32", 0.7, 1.0, 8, 12),
    ("t1.2-top0.9", "float32", 1.2, 0.9, 4, 12),
    ("greedy", "float32", 0.0, 1.0, 2, 10),
    ("bf16-t0.7", "bfloat16", 0.7, 1.0, 8, 12),
)
# the two forwards' rounding: on log-probs, and on the cumulative sum a uniform falls in
LOGP_TOLERANCE = {"float32": 1e-4, "bfloat16": 0.5}
CDF_TOLERANCE = {"float32": 1e-4, "bfloat16": 0.02}


def _prompts(tok, n: int, group: int) -> list[str]:
    from trainer.data import ArithmeticTask, render_prompt

    problems = ArithmeticTask().sample(np.random.default_rng(3), n)
    return [render_prompt(p, tok) for p in problems for _ in range(group)]


def _copy(model, dtype: str):
    twin = copy.deepcopy(model)
    for p in twin.parameters():
        p.data = p.data.to(getattr(torch, dtype))
    return twin


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The smallest most-likely set of mass >= top_p (the most likely token always kept)."""
    if top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(descending=True)
    keep = (sorted_p.cumsum(0) - sorted_p) < top_p
    keep[0] = True
    return probs * torch.zeros_like(keep).scatter(0, order, keep)


def _plain(model, row_ids: list[int], n_new: int, temperature: float):
    """Float32 logits / T (T > 0 and != 1) at the n_new positions predicting a row's completion,
    from the model's forward over the whole row."""
    with torch.no_grad():
        logits = model(torch.tensor([row_ids])).logits[0, -n_new - 1 : -1].float()
    return logits / temperature if temperature > 0 and temperature != 1 else logits


@pytest.fixture(scope="module")
def tiny(tiny_model):  # taking tiny_model marks each test given it (conftest)
    return load_tiny()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_token_is_the_draw_of_a_plain_decoder(tiny, case):
    name, dtype, t, top_p, group, new = case
    path, tok, model = tiny
    m = model if dtype == "float32" else _copy(model, dtype)
    prompts = _prompts(tok, 5, group)
    torch.manual_seed(SEED)
    roll = HFEngine(TrainConfig(model=str(path), max_new_tokens=new, top_p=top_p), m,
                    tok).generate(prompts, temperature=t)
    steps = roll.completion_ids.shape[1]
    torch.manual_seed(SEED)
    uniforms = torch.cat([torch.rand(len(prompts), 1) for _ in range(steps)], 1) if t > 0 \
        else None
    tol = CDF_TOLERANCE[dtype]
    p = roll.prompt_len
    strict = checked = 0
    for r in range(len(prompts)):
        real = roll.completion_mask[r].bool()
        n = int(real.sum())
        ids = roll.input_ids[r][roll.attention_mask[r].bool()].tolist()
        chosen = roll.input_ids[r, p : p + n]
        logp = torch.log_softmax(_plain(m, ids, n, t), dim=-1)
        dlogp = (roll.sampler_logp[r, :n] - logp[torch.arange(n), chosen]).abs().max()
        assert float(dlogp) <= LOGP_TOLERANCE[dtype], (name, r, float(dlogp))
        assert bool(torch.isnan(roll.sampler_logp[r, n:]).all())
        for j, token in enumerate(chosen.tolist()):
            if uniforms is None:  # greedy: the token scores within rounding of the best
                gap = float(logp[j].max() - logp[j, token])
            else:  # the uniform falls inside the token's interval of the cumulative sum
                cdf = _top_p(logp[j].exp(), top_p).cumsum(0)
                x = float(uniforms[r, j] * cdf[-1])
                lo = float(cdf[token - 1]) if token else 0.0
                gap = max(lo - x, x - float(cdf[token]), 0.0)
            assert gap <= tol, (name, r, j, token, gap)
            strict += gap == 0.0
            checked += 1
    assert checked > 40 and strict >= math.ceil(0.95 * checked), (strict, checked)
    assert set(roll.texts) != {roll.texts[0]} or t == 0  # it sampled
