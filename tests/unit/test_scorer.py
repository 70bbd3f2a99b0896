"""twoclocks' own forward for the update (trainer/scorer.py) against transformers' forward.

Truth: transformers' plain full-row forward of other architectures on random weights (grouped
key/value heads, attention and MLP biases), on rows sharing prompts; and the prefix nodes the
forward shares, worked out by hand and against a trie of tuples. Against the tiny model (logits,
gradients, train()) it is tests/integration/test_scorer_tiny.py's.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.training import full_row_logits
from trainer.scorer import Scorer


@pytest.mark.parametrize("arch", ["qwen2-gqa", "llama-biases"])
def test_other_shapes_equal_transformers(arch):
    """Grouped key/value heads (Qwen2) and Llama with attention and MLP biases, random
    weights, rows sharing prompts of different lengths."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    kw = dict(vocab_size=50, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    if arch == "qwen2-gqa":
        config = Qwen2Config(**kw)
    else:
        config = LlamaConfig(**kw, attention_bias=True, mlp_bias=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    if arch == "llama-biases":
        for m in model.modules():  # transformers initialises biases to 0: make them count
            if isinstance(m, torch.nn.Linear) and m.bias is not None:
                torch.nn.init.normal_(m.bias, std=0.5)
    prompts = torch.randint(3, 50, (3, 5))
    pmask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
    rows = torch.tensor([0, 0, 1, 2, 2, 2])
    comp = torch.randint(3, 50, (6, 4))
    cmask = torch.ones(6, 4, dtype=torch.long)
    cmask[1, 2:] = 0
    ids, mask = torch.cat([prompts[rows], comp], 1), torch.cat([pmask[rows], cmask], 1)
    with torch.no_grad():
        ours = Scorer(model)(ids, mask, 5)
        full = full_row_logits(model, ids, mask, 5)
    valid = cmask.bool()
    assert torch.allclose(ours[valid], full[valid], atol=1e-5)


def test_prefix_nodes_by_hand():
    """A node per distinct (prompt, tokens and mask so far); `rep` one position of each."""
    from trainer.scorer import _prefix_nodes

    tokens = torch.tensor([[5, 6, 7], [5, 6, 8], [5, 9, 9], [5, 6, 7], [5, 9, 9]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1]])
    prompt = torch.tensor([0, 0, 0, 1, 0])
    node, rep = _prefix_nodes(prompt, tokens, mask)
    # rows 0-2 and 4 open alike; row 3 has another prompt; rows 2 and 4 differ only in the
    # last mask bit (an ended row's padding is not a real token)
    assert node.reshape(5, 3).tolist() == [[0, 2, 5], [0, 2, 6], [0, 3, 7], [1, 4, 9],
                                           [0, 3, 8]]
    assert rep.tolist() == [0, 9, 1, 7, 10, 2, 5, 8, 14, 11]
    assert torch.equal(node[rep], torch.arange(len(rep)))


def test_prefix_nodes_match_a_trie_of_tuples():
    """Two positions share a node exactly when their (prompt, tokens and mask so far) are
    equal — checked against Python tuples on random batches that share much, little (every
    row apart from the first token: the early exit) or nothing."""
    from trainer.scorer import _prefix_nodes

    gen = torch.Generator().manual_seed(0)
    for vocab, n, c in ((2, 12, 6), (3, 9, 5), (50, 8, 7), (1, 4, 3)):
        tokens = torch.randint(0, vocab, (n, c), generator=gen)
        mask = (torch.rand(n, c, generator=gen) > 0.2).long()
        prompt = torch.randint(0, 2, (n,), generator=gen)
        node, rep = _prefix_nodes(prompt, tokens, mask)
        keys = [(int(prompt[r]), *tokens[r, : j + 1].tolist(), *mask[r, : j + 1].tolist(), j)
                for r in range(n) for j in range(c)]
        ids = {}
        truth = torch.tensor([ids.setdefault(k, len(ids)) for k in keys])
        flat = node.tolist()
        assert len(rep) == len(ids)
        for a in range(len(keys)):
            for b in range(len(keys)):
                assert (flat[a] == flat[b]) == (truth[a] == truth[b])
        assert torch.equal(node[rep], torch.arange(len(rep)))
