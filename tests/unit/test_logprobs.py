"""Shared-prompt log-probs equal one plain forward over every full row: values and gradients."""

from __future__ import annotations

import pytest
import torch

from trainer.logprobs import completion_logits, completion_logprobs
from trainer.rollout import Rollout


@pytest.fixture(scope="module")
def tiny():
    from trainer.tiny import _RECIPE, _build_model, build_tokenizer

    torch.manual_seed(0)
    tok = build_tokenizer()
    return tok, _build_model(tok, _RECIPE)


def _grouped_rollout(tok, g: int = 4, c: int = 7) -> Rollout:
    """Groups of `g` rows sharing a left-padded prompt; random completions, some ended early."""
    prompts = ["12+3=", "7-45=", "100+100=", "5-5="]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    ids = enc["input_ids"].repeat_interleave(g, 0)
    pmask = enc["attention_mask"].repeat_interleave(g, 0)
    gen = torch.Generator().manual_seed(3)
    comp = torch.randint(3, len(tok), (len(ids), c), generator=gen)
    cmask = torch.ones_like(comp)
    cmask[::3, c - 3 :] = 0  # an EOS came early in every third row: pad after it
    comp = torch.where(cmask.bool(), comp, torch.full_like(comp, tok.pad_token_id))
    n = len(ids)
    return Rollout(
        torch.cat([ids, comp], 1),
        torch.cat([pmask, cmask], 1),
        cmask,
        ids.shape[1],
        [""] * n,
        torch.zeros(n, dtype=torch.bool),
    )


def _plain_logprobs(model, roll: Rollout, temperature: float) -> torch.Tensor:
    """The reference: one forward over every full row (no sharing)."""
    ids, mask, p = roll.input_ids, roll.attention_mask, roll.prompt_len
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, p - 1 : -1]
    logp = torch.log_softmax(logits.float() / temperature, -1)
    return logp.gather(-1, ids[:, p:].unsqueeze(-1)).squeeze(-1)


def _grad(model, loss: torch.Tensor) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return torch.cat([q.grad.reshape(-1) for q in model.parameters() if q.grad is not None])


def test_shared_prompts_give_the_plain_forwards_logprobs_and_gradient(tiny):
    tok, model = tiny
    roll = _grouped_rollout(tok)
    m = roll.completion_mask.bool()
    weights = torch.linspace(-1.0, 1.0, len(roll.texts)).unsqueeze(1)  # advantage-like signs

    want = _plain_logprobs(model, roll, 0.7)
    got, ent = completion_logprobs(model, roll, 0.7, with_entropy=True)
    assert got.shape == want.shape == m.shape and ent.shape == m.shape
    assert torch.allclose(got[m], want.detach()[m], atol=2e-5)

    g_want = _grad(model, (want * weights * m).sum())
    g_got = _grad(model, (completion_logprobs(model, roll, 0.7)[0] * weights * m).sum())
    assert g_want.norm() > 0
    # equal up to float32 summation order (the shared prompt sums G rows' gradients first)
    assert (g_got - g_want).norm() <= 1e-5 * g_want.norm()
    assert (g_got - g_want).abs().max() <= 1e-5 * g_want.abs().max()


def test_sharing_actually_runs_each_prompt_once(tiny):
    """The first forward sees only the distinct prompts (4 of 16 rows), the second no prompt."""
    tok, model = tiny
    roll = _grouped_rollout(tok)
    shapes = []
    hook = model.model.embed_tokens.register_forward_hook(
        lambda mod, args, out: shapes.append(tuple(args[0].shape))
    )
    try:
        with torch.no_grad():
            completion_logits(model, roll.input_ids, roll.attention_mask, roll.prompt_len)
    finally:
        hook.remove()
    c = roll.completion_mask.shape[1]
    assert shapes == [(4, roll.prompt_len), (16, c - 1)]


def test_distinct_prompts_and_one_token_completions_fall_back_exactly(tiny):
    tok, model = tiny
    roll = _grouped_rollout(tok, g=1)  # nothing repeats: one plain forward
    with torch.no_grad():
        assert torch.equal(
            completion_logprobs(model, roll, 1.0)[0], _plain_logprobs(model, roll, 1.0)
        )
    one = _grouped_rollout(tok, g=3, c=1)  # shared prompt, a single completion token
    m = one.completion_mask.bool()
    with torch.no_grad():
        got = completion_logprobs(model, one, 1.0)[0]
        assert torch.allclose(got[m], _plain_logprobs(model, one, 1.0)[m], atol=2e-5)


def test_generation_prefills_each_distinct_prompt_once_and_samples_the_same(tiny):
    """Greedy rollouts of repeated prompts (shared pre-fill) equal those of the distinct ones,
    through transformers generate (the decode loop's own test: tests/unit/test_fast_decode.py)."""
    from trainer.config import TrainConfig
    from trainer.rollout.hf import HFEngine

    tok, model = tiny
    engine = HFEngine(TrainConfig(max_new_tokens=6, hf_decoder="generate"), model, tok)
    distinct = ["12+3=", "7-45=", "100+100="]
    shapes = []
    hook = model.model.embed_tokens.register_forward_hook(
        lambda mod, args, out: shapes.append(tuple(args[0].shape))
    )
    try:
        alone = engine.generate(distinct, temperature=0.0)
        shapes.clear()
        grouped = engine.generate([p for p in distinct for _ in range(4)], temperature=0.0)
    finally:
        hook.remove()
    p = grouped.prompt_len
    assert shapes[:2] == [(3, p - 1), (12, 1)]  # pre-fill, then each row's last prompt token
    assert torch.equal(grouped.input_ids, alone.input_ids.repeat_interleave(4, 0))
    assert grouped.texts == [t for t in alone.texts for _ in range(4)]
