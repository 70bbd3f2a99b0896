"""The HF engine's own decode loop (trainer/rollout/decode.py) against the model's own forward.

Truths: the transformers forward of the same random weights (each decode step's log-prob and
entropy) for the architectures the loop supports, and the rows sharing one history worked out by
hand. The loop on the tiny model (against the trainer's log-probs, transformers `generate` and
the softmax) is tests/integration/test_fast_decode_tiny.py's.
"""

from __future__ import annotations

import types

import pytest
import torch

from trainer.rollout.decode import FastDecoder, unsupported


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
