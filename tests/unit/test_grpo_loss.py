"""GRPO maths on hand-computed tensors, and the update on a real (randomly initialised) Qwen2."""

from __future__ import annotations

import math

import pytest
import torch

from trainer import grpo


def test_group_advantages_group_batch_none():
    r = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1])
    # group 1: mean .25, centred [.75, -.25, -.25, -.25], unbiased std .5; group 2: all equal
    adv = grpo.group_advantages(r, 4, "group")
    assert torch.allclose(adv, torch.tensor([1.5, -0.5, -0.5, -0.5, 0, 0, 0, 0]), atol=1e-5)
    std = math.sqrt(1.875 / 7)  # unbiased std of five ones and three zeros
    adv_b = grpo.group_advantages(r, 4, "batch")
    assert torch.allclose(adv_b[:4], torch.tensor([0.75, -0.25, -0.25, -0.25]) / std, atol=1e-5)
    adv_n = grpo.group_advantages(r, 4, "none")
    assert torch.allclose(adv_n, torch.tensor([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0]))
    assert grpo.zero_std_groups(r, 4).tolist() == [False, True]
    with pytest.raises(ValueError):
        grpo.group_advantages(r, 4, "rank")


@pytest.mark.parametrize("low,high", [(0.2, 0.2), (0.2, 0.28), (0.1, 0.4)])
def test_clipped_surrogate_hand_computed(low, high):
    ratio = torch.tensor([[0.5, 1.0, 1.5], [0.5, 1.0, 1.5]])
    logp, old = torch.log(ratio), torch.zeros(2, 3)
    adv = torch.tensor([1.0, -1.0])
    loss, lo, hi = grpo.clipped_surrogate(logp, old, adv, low, high)
    expect = torch.tensor(
        [
            [-0.5, -1.0, -(1 + high)],  # A>0: min(r, clip(r)) — only the upper clip binds
            [1 - low, 1.0, 1.5],  # A<0: max(r, clip(r)) — only the lower clip binds
        ]
    )
    assert torch.allclose(loss, expect, atol=1e-6)
    assert lo.tolist() == [[False, False, False], [True, False, False]]
    assert hi.tolist() == [[False, False, True], [False, False, False]]


def test_aggregations_hand_computed_and_split_exactly():
    per_tok = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    expect = {
        "token-mean": (1 + 2 + 3 + 4) / 4,
        "seq-mean-token-mean": (6 / 3 + 4 / 1) / 2,
        "seq-mean-token-sum-norm": (6 / 4 + 4 / 4) / 2,  # max_new_tokens = 4
    }
    for agg, value in expect.items():
        whole = grpo.aggregate(per_tok, mask, agg, 4)
        assert float(whole) == pytest.approx(value)
        den = grpo.normaliser(mask, agg)
        parts = sum(
            grpo.aggregate(per_tok[i : i + 1], mask[i : i + 1], agg, 4, den) for i in range(2)
        )
        assert float(parts) == pytest.approx(value)  # micro-batches sum to the whole
    with pytest.raises(ValueError):
        grpo.aggregate(per_tok, mask, "sum", 4)


def test_k3_hand_computed_and_zero_on_policy():
    logp, ref = torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))
    assert float(grpo.k3(logp, ref)) == pytest.approx(0.5 + math.log(2) - 1)
    assert float(grpo.k3(logp, logp)) == 0.0


# --- the update on a real model ------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    from trainer.tiny import _RECIPE, _build_model, build_tokenizer

    torch.manual_seed(0)
    tok = build_tokenizer()
    return tok, _build_model(tok, _RECIPE)


def _rollout(tok, model, n=8):
    from trainer.config import TrainConfig
    from trainer.rollout.hf import HFEngine

    cfg = TrainConfig(group_size=4, max_new_tokens=6, micro_batch_size=3)
    torch.manual_seed(1)
    prompts = ["12+3=", "7-45="] * (n // 2)
    return cfg, HFEngine(cfg, model, tok).generate(prompts)


def test_recomputed_logprobs_match_sampler(tiny):
    """Left padding + position ids: the trainer's forward reproduces generation's log-probs."""
    from trainer.logprobs import completion_logprobs

    tok, model = tiny
    cfg, roll = _rollout(tok, model)
    enc = tok(["12+3=", "7-45="] * 4, return_tensors="pt", padding=True, add_special_tokens=False)
    assert roll.prompt_len == enc["input_ids"].shape[1]
    with torch.no_grad():
        out = model.generate(
            **enc,
            max_new_tokens=6,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=tok.pad_token_id,
        )
        greedy = roll.__class__(
            out.sequences,
            torch.cat(
                [
                    enc["attention_mask"],
                    torch.ones(8, out.sequences.shape[1] - roll.prompt_len, dtype=torch.long),
                ],
                1,
            ),
            torch.ones(8, 6),
            roll.prompt_len,
            [""] * 8,
            torch.zeros(8, dtype=torch.bool),
        )
        lp, _ = completion_logprobs(model, greedy, 1.0)
    gen = torch.stack([torch.log_softmax(x, -1) for x in out.logits], 1)
    want = gen.gather(-1, out.sequences[:, roll.prompt_len :, None]).squeeze(-1)
    assert torch.allclose(lp, want, atol=1e-4)


def test_on_policy_update_ratio_one_nothing_clipped_and_accumulation_exact(tiny):
    import copy

    from trainer.dist import Dist
    from trainer.update import no_grad_logprobs, update

    tok, model = tiny
    cfg, roll = _rollout(tok, model)
    rewards = torch.tensor([1.0, 0, 0, 1, 0, 0, 0, 0])
    adv = grpo.group_advantages(rewards, 4)
    grads = []
    for micro in (3, 8):
        m = copy.deepcopy(model)
        c = cfg.model_copy(
            update={"micro_batch_size": micro, "clip_eps_low": 0.0, "clip_eps_high": 0.0}
        )
        opt = torch.optim.SGD(m.parameters(), lr=0.0)
        old, _ = no_grad_logprobs(m, roll, c, False)
        st = update(m, opt, roll, adv, old, None, c, c.phase_at(0)[1], Dist())
        assert st.clip_low == 0 and st.clip_high == 0  # ratio exactly 1 even with eps 0
        assert st.kl_old_new == 0.0
        assert st.trained_tokens == float(roll.completion_mask[:4].sum())  # group 2 skipped
        grads.append(torch.cat([p.grad.reshape(-1) for p in m.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
    assert float(grads[0].norm()) > 0


def test_skipping_zero_advantage_is_exact(tiny):
    import copy

    from trainer.dist import Dist
    from trainer.update import update

    tok, model = tiny
    cfg, roll = _rollout(tok, model)
    adv = grpo.group_advantages(torch.tensor([1.0, 0, 0, 1, 0, 0, 0, 0]), 4)
    grads = []
    for skip in (True, False):
        m = copy.deepcopy(model)
        c = cfg.model_copy(update={"skip_zero_advantage": skip})
        update(
            m,
            torch.optim.SGD(m.parameters(), lr=0.0),
            roll,
            adv,
            None,
            None,
            c,
            c.phase_at(0)[1],
            Dist(),
        )
        grads.append(torch.cat([p.grad.reshape(-1) for p in m.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-7)


def test_second_update_is_off_policy_and_can_clip(tiny):
    import copy

    from trainer.dist import Dist
    from trainer.update import no_grad_logprobs, update

    tok, model = tiny
    cfg, roll = _rollout(tok, model)
    adv = grpo.group_advantages(torch.tensor([1.0, 0, 0, 1, 0, 1, 1, 1]), 4)
    m = copy.deepcopy(model)
    c = cfg.model_copy(
        update={
            "ppo_epochs": 3,
            "clip_eps_low": 0.001,
            "clip_eps_high": 0.001,
            "max_grad_norm": None,
        }
    )
    opt = torch.optim.SGD(m.parameters(), lr=5.0)
    old, _ = no_grad_logprobs(m, roll, c, False)
    st = update(m, opt, roll, adv, old, None, c, c.phase_at(0)[1], Dist())
    assert len(st.grad_norms) == 3
    assert st.clip_low + st.clip_high > 0 and st.kl_old_new != 0
