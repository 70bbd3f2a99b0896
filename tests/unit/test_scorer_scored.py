"""The update's log-probs through twoclocks' own forward (`completion_logprobs` on a `Scorer`),
which runs only real prompt tokens, the completion prefixes that feed a real token's prediction
and the LM head on those predictions, against a straightforward computation.

Truth: transformers' forward of each row alone (its real prompt tokens then its real completion
tokens, no padding, nothing shared), log_softmax at the temperature at each completion token:
the log-probs, the entropies and every parameter's gradient of a weighted sum of log-probs; and
the rows the forward runs against the distinct prefixes listed as Python tuples. Random small
Llama (biases on) and Qwen2 (grouped key/value heads) models; rows of three prompt lengths, one
with an empty completion and one that fills all of max_new_tokens.
"""

from __future__ import annotations

import pytest
import torch

from trainer.logprobs import completion_logprobs
from trainer.rollout import Rollout
from trainer.scorer import Scorer, plan

VOCAB, P, C, T = 40, 6, 5, 0.7

# (prompt, completion) of each row; a prompt's rows are one group (rows 0-1 share two tokens)
ROWS = [
    ([5, 6, 7], [8, 9, 10]),
    ([5, 6, 7], [8, 9, 11, 12, 13]),  # fills max_new_tokens
    ([5, 6, 7], [8]),
    ([21, 22, 23, 24, 25, 26], []),  # empty completion
    ([21, 22, 23, 24, 25, 26], [30, 31]),
    ([33, 34, 35, 36, 37], [38, 8, 9, 10]),
    ([33, 34, 35, 36, 37], [38, 8, 9, 10]),  # the same row twice
]


def _model(arch: str, dtype):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    kw = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=32)
    if arch == "llama":
        config = LlamaConfig(**kw, num_key_value_heads=4, attention_bias=True, mlp_bias=True,
                             tie_word_embeddings=False)
    else:
        config = Qwen2Config(**kw, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    for m in model.modules():  # transformers initialises biases to 0: make them count
        if isinstance(m, torch.nn.Linear) and m.bias is not None:
            torch.nn.init.normal_(m.bias, std=0.3)
    return model.to(dtype).eval()


def _rollout(rows=ROWS) -> Rollout:
    """Prompts left-padded to P, completions right-padded to C with token 0."""
    n = len(rows)
    ids = torch.zeros(n, P + C, dtype=torch.long)
    mask = torch.zeros(n, P + C, dtype=torch.long)
    for i, (prompt, done) in enumerate(rows):
        ids[i, P - len(prompt) : P], mask[i, P - len(prompt) : P] = torch.tensor(prompt), 1
        ids[i, P : P + len(done)] = torch.tensor(done, dtype=torch.long)
        mask[i, P : P + len(done)] = 1
    return Rollout(ids, mask, mask[:, P:].clone(), P, [""] * n, torch.zeros(n, dtype=torch.bool))


def _alone(model, rows=ROWS):
    """(log-probs, entropies) [N, C] of each row's completion tokens from a forward of that row
    alone (0 where no token), as graph tensors."""
    logp = torch.zeros(len(rows), C, dtype=torch.float64)
    ent = torch.zeros(len(rows), C, dtype=torch.float64)
    for i, (prompt, done) in enumerate(rows):
        if not done:
            continue
        seq = torch.tensor([prompt + done])
        logits = model(input_ids=seq).logits[0, len(prompt) - 1 : -1]
        la = torch.log_softmax(logits.float() / T, -1)
        logp[i, : len(done)] = la.gather(-1, torch.tensor(done)[:, None]).squeeze(-1)
        ent[i, : len(done)] = -(la.exp() * la).sum(-1)
    return logp, ent


def _grads(model, logp) -> torch.Tensor:
    """Every parameter's gradient of sum(w * logp) for fixed signed weights w."""
    w = torch.linspace(-1.0, 1.0, logp.numel(), dtype=torch.float64).reshape(logp.shape)
    model.zero_grad(set_to_none=True)
    (logp.double() * w).sum().backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_logprobs_entropies_and_gradients_equal_each_row_alone(arch, dtype):
    """Values to 1e-12 in float64 (measured: equal) and 1e-5 relative in float32 (6e-8);
    gradients to 1e-6 of their largest entry in float64 and 1e-5 in float32 (measured 2-3e-7
    in both): the log-softmax and RMSNorm run in float32 either way, and a prefix rows share
    sums their gradients once, in float32, where the rows alone sum them in float64 (a wrong
    mask, position or row is off by O(1)). Positions without a real token come back 0."""
    model = _model(arch, dtype)
    roll = _rollout()
    real = roll.completion_mask.bool()
    want_lp, want_ent = _alone(model)
    got_lp, got_ent = completion_logprobs(Scorer(model), roll, T, with_entropy=True)
    assert got_lp.shape == got_ent.shape == (len(ROWS), C)
    assert torch.equal(got_lp[~real], torch.zeros(int((~real).sum())))
    assert torch.equal(got_ent[~real], torch.zeros(int((~real).sum())))
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    scale = float(want_lp.detach().abs().max())
    assert float((got_lp.detach().double() - want_lp.detach()).abs().max()) <= tol * scale
    assert float((got_ent.double() - want_ent.detach()).abs().max()) <= tol * scale

    g_want = _grads(model, want_lp)
    g_got = _grads(model, completion_logprobs(Scorer(model), roll, T)[0])
    assert float(g_want.abs().max()) > 1e-2  # a real gradient
    gap = float((g_got.double() - g_want.double()).abs().max() / g_want.abs().max())
    assert gap <= (1e-6 if dtype == torch.float64 else 1e-5)


def test_the_forward_runs_only_the_useful_rows():
    """Through the layers: each distinct prompt's real tokens and each distinct (prompt,
    completion prefix) whose last token predicts a real one, once; the LM head: each distinct
    (prompt, prefix) predicting a real token, once. Nothing for padding or an ended row."""
    roll = _rollout()
    prompts, body, head = set(), set(), set()
    for prompt, done in ROWS:
        prompts.add(tuple(prompt))
        for t in range(len(done)):
            head.add((tuple(prompt), tuple(done[:t])))
            if t:
                body.add((tuple(prompt), tuple(done[:t])))
    pl = plan(roll.input_ids, roll.attention_mask, P, roll.completion_mask.bool())
    assert len(pl.prompt_ids) == sum(map(len, prompts)) == 14
    assert len(pl.node_ids) == len(body) == 8
    assert len(pl.head_rows) == len(head) == 11
    assert pl.width == C - 1  # the row that fills max_new_tokens needs every input


def test_rows_with_nothing_to_score_give_zeros_and_a_zero_gradient():
    """A micro-batch whose rows all have empty completions: zeros, still a graph whose
    backward reaches every parameter with zeros (a synced backward needs one)."""
    model = _model("llama", torch.float32)
    rows = [([5, 6, 7], []), ([21, 22], [])]
    logp, ent = completion_logprobs(Scorer(model), _rollout(rows), T, with_entropy=True)
    assert torch.equal(logp, torch.zeros(2, C)) and torch.equal(ent, torch.zeros(2, C))
    model.zero_grad(set_to_none=True)
    logp.sum().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and not g.any() for g in grads)


def test_short_rows_lay_out_only_their_longest_prediction():
    """Completions of at most 2 real tokens in a 5-wide batch: one completion input per row is
    laid out (not 4), and every value still equals the rows alone."""
    model = _model("qwen2", torch.float64)
    rows = [([5, 6, 7], [8, 9]), ([5, 6, 7], [8]), ([21, 22], [23, 24])]
    roll = _rollout(rows)
    pl = plan(roll.input_ids, roll.attention_mask, P, roll.completion_mask.bool())
    assert pl.width == 1 and len(pl.node_ids) == 2 and len(pl.head_rows) == 4
    with torch.no_grad():
        got = completion_logprobs(Scorer(model), roll, T)[0]
        want = _alone(model, rows)[0]
    assert float((got.double() - want).abs().max()) <= 1e-12
