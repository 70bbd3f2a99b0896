"""The HF engine's own decode loop (trainer/rollout/decode.py) against the model's own forward.

Truths: the transformers forward of the same weights (logits, the trainer's log-probs of what
was sampled), transformers `generate` (greedy tokens), and the softmax probabilities the
sampler must draw from (empirical frequencies over many rows).
"""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch

from tests.support.training import load_tiny
from trainer.config import TrainConfig
from trainer.logprobs import completion_logprobs
from trainer.rollout.decode import FastDecoder, unsupported
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


def test_rows_with_one_history_share_a_pass():
    """`_shared_rows`: one row per distinct (prompt, tokens so far) among rows still decoding,
    each row pointing at its history's; ended rows left out; None when all differ."""
    from trainer.rollout.decode import _shared_rows

    history = torch.tensor([7, 7, 3, 9, 3])  # ids of (prompt, tokens so far)
    done = torch.tensor([False, False, False, True, False])
    rows, back = _shared_rows(history, done)
    assert rows.tolist() == [2, 0]  # histories 3 and 7 (unique sorts them); 9 has ended
    assert back[torch.tensor([0, 1, 2, 4])].tolist() == [1, 1, 0, 0]
    assert _shared_rows(history[:3:2], torch.tensor([False, False])) is None
    assert _shared_rows(history, torch.ones(5, dtype=torch.bool)) is None


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


@pytest.mark.parametrize("arch", ["qwen2-gqa", "llama"])
def test_other_shapes_match_the_forward(arch):
    """Grouped key/value heads (Qwen2) and bias-free projections (Llama), random weights:
    each decode step's log-prob and entropy equal the full forward's over the sequence so far."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    kw = dict(vocab_size=50, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    config = Qwen2Config(**kw) if arch == "qwen2-gqa" else LlamaConfig(**kw)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    assert unsupported(model) is None
    dec = FastDecoder(model)
    ids = torch.randint(3, 50, (3, 5))
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
    torch.manual_seed(4)
    tokens, logp, ent = dec.sample(ids, mask, torch.tensor([0, 1, 2, 2]), 6, 1.0, 1.0, -1, 0)
    rows = ids[[0, 1, 2, 2]]
    rmask = mask[[0, 1, 2, 2]]
    for t in range(tokens.shape[1]):
        seq = torch.cat([rows, tokens[:, :t]], 1)
        m = torch.cat([rmask, torch.ones(4, t, dtype=torch.long)], 1)
        pos = (m.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            ref = torch.log_softmax(model(input_ids=seq, attention_mask=m,
                                          position_ids=pos).logits[:, -1], -1)
        assert torch.allclose(logp[:, t], ref.gather(1, tokens[:, t : t + 1]).squeeze(1),
                              atol=1e-5)
        assert torch.allclose(ent[:, t], -(ref.exp() * ref).sum(-1), atol=1e-5)


def test_unsupported_architectures_say_why():
    def fake(**config):
        c = dict(model_type="qwen2", rope_parameters={"rope_type": "default"}, hidden_act="silu")
        c.update(config)
        return types.SimpleNamespace(config=types.SimpleNamespace(**c), lm_head=None,
                                     model=types.SimpleNamespace(layers=[]))

    assert unsupported(fake()) is None
    assert "gpt2" in unsupported(fake(model_type="gpt2"))
    assert "llama3" in unsupported(fake(rope_parameters={"rope_type": "llama3"}))
    assert "sliding" in unsupported(fake(use_sliding_window=True, sliding_window=4096))
    assert "gelu" in unsupported(fake(hidden_act="gelu"))
