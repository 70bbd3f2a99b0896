"""The HF engine's own decode loop (trainer/rollout/decode.py) on the tiny model.

Truths: the transformers forward of the same weights (the trainer's log-probs of what was
sampled), transformers `generate` (greedy tokens), and the softmax probabilities the sampler must
draw from (empirical frequencies over many rows). The loop's other model shapes and its row
sharing, on random weights, are tests/unit/test_fast_decode.py's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.support.training import load_tiny
from trainer.config import TrainConfig
from trainer.logprobs import completion_logprobs
from trainer.rollout.hf import HFEngine, NonFiniteLogits


@pytest.fixture(scope="module")
def tiny(tiny_model):  # taking tiny_model marks each test given it (conftest)
    """(path, tokenizer, model) of the real cached tiny model."""
    return load_tiny()


def _prompts(tok, n: int, seed: int, group: int) -> list[str]:
    from trainer.data import ArithmeticTask, render_prompt

    problems = ArithmeticTask().sample(np.random.default_rng(seed), n)
    return [render_prompt(p, tok) for p in problems for _ in range(group)]


def _engine(tiny, **over) -> HFEngine:
    path, tok, model = tiny
    cfg = TrainConfig(model=str(path), **{"max_new_tokens": 11, **over})
    return HFEngine(cfg, model, tok)


@pytest.mark.parametrize("decoder", ["auto", "generate"])
def test_sampler_logprobs_equal_the_trainers_forward(tiny, decoder):
    """What either path sampled, scored by the model's forward, has the log-probs the engine
    returned (an off-by-one position, a wrong mask or a stale cache would be far off)."""
    _, tok, model = tiny
    engine = _engine(tiny, hf_decoder=decoder)
    assert (engine.decoder is not None) == (decoder == "auto")
    torch.manual_seed(0)
    roll = engine.generate(_prompts(tok, 12, seed=1, group=4))
    m = roll.completion_mask.bool()
    with torch.no_grad():
        logp, entropy = completion_logprobs(model, roll, 1.0, with_entropy=True)
    assert int(m.sum()) > 100
    assert torch.allclose(roll.sampler_logp[m], logp[m], atol=1e-4)
    assert bool(torch.isnan(roll.sampler_logp[~m]).all())
    if decoder == "auto":  # the loop's numbers are the policy's own: its entropy too
        assert torch.allclose(roll.sampler_entropy[m], entropy[m], atol=1e-4)
        assert bool(torch.isnan(roll.sampler_entropy[~m]).all())
        assert float(entropy[m].std()) > 0.01  # entropies that differ, not one constant
    else:  # `generate` is transformers' code: nothing is claimed about its numerics
        assert roll.sampler_entropy is None
    assert set(roll.texts) != {roll.texts[0]}  # it really sampled


def test_greedy_tokens_equal_transformers_generate(tiny):
    _, tok, model = tiny
    prompts = _prompts(tok, 32, seed=2, group=2)
    ours = _engine(tiny).generate(prompts, temperature=0.0)
    theirs = _engine(tiny, hf_decoder="generate").generate(prompts, temperature=0.0)
    assert ours.texts == theirs.texts
    w = ours.completion_ids.shape[1]
    assert torch.equal(ours.completion_ids, theirs.completion_ids[:, :w])


def test_each_distinct_prompt_is_prefilled_once(tiny):
    """Groups of 4: one pre-fill of the 3 distinct prompts; greedy rows of a group never
    diverge, so every later pass runs one row per group still decoding (never the 12 rows),
    and the rows equal those of the distinct prompts alone."""
    _, tok, _ = tiny
    engine = _engine(tiny, max_new_tokens=6)
    shapes = []
    forward = engine.decoder.forward

    def spy(ids, *args):
        shapes.append(tuple(ids.shape))
        return forward(ids, *args)

    engine.decoder.forward = spy
    distinct = ["12+3=", "7-45=", "100+100="]
    alone = engine.generate(distinct, temperature=0.0)
    shapes.clear()
    grouped = engine.generate([p for p in distinct for _ in range(4)], temperature=0.0)
    p = grouped.prompt_len
    assert shapes[0] == (3, p) and shapes[1] == (3, 1)
    assert all(k <= 3 and t == 1 for k, t in shapes[1:])
    assert len(shapes) == grouped.completion_ids.shape[1]  # no pass after the last token
    assert torch.equal(grouped.input_ids, alone.input_ids.repeat_interleave(4, 0))
    assert grouped.texts == [t for t in alone.texts for _ in range(4)]


def test_first_tokens_follow_the_softmax(tiny):
    """4,000 rows of one prompt: the first token's frequencies match softmax(logits / T)."""
    _, tok, model = tiny
    prompt = _prompts(tok, 1, seed=5, group=1)[0]
    enc = tok([prompt], return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        logits = model(**enc).logits[0, -1]
    for temperature, top_p in ((1.0, 1.0), (1.5, 1.0), (1.5, 0.7)):
        probs = torch.softmax(logits / temperature, -1).double()
        if top_p < 1:
            order = probs.argsort(descending=True)
            mass_before = probs[order].cumsum(0) - probs[order]
            kept = order[mass_before < top_p]
            nucleus = torch.zeros_like(probs)
            nucleus[kept] = probs[kept]
            probs = nucleus / nucleus.sum()
        engine = _engine(tiny, temperature=temperature, top_p=top_p, max_new_tokens=1)
        torch.manual_seed(1)
        roll = engine.generate([prompt] * 4000)
        freq = torch.bincount(roll.completion_ids[:, 0], minlength=len(probs)).double() / 4000
        tv = 0.5 * float((freq - probs).abs().sum())
        assert tv < 0.05, (temperature, top_p, tv)
        assert float(freq[probs == 0].sum()) == 0.0  # nothing outside the nucleus


def test_non_finite_weights_raise_the_engines_divergence_error(tiny):
    path, tok, model = tiny
    broken = type(model)(model.config).eval()
    broken.load_state_dict(model.state_dict())
    with torch.no_grad():
        broken.model.norm.weight.fill_(math.nan)
    engine = HFEngine(TrainConfig(model=str(path)), broken, tok)
    with pytest.raises(NonFiniteLogits):
        engine.generate(_prompts(tok, 2, seed=0, group=2))
