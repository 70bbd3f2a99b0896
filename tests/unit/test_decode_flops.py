"""bench/decode_flops.py's counting: the matmul parameters of a small random Llama, the useful
tokens of a hand-made rollout, and the breakdown's attribution of profiler events, each against
a count by hand."""

from __future__ import annotations

import types

import torch

from tests.support.bench import load_bench
from trainer.rollout.batch import Rollout


def _model():
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=50, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         tie_word_embeddings=False)
    return AutoModelForCausalLM.from_config(config)


def hand_rollout() -> Rollout:
    """Two prompts x 2 rows, EOS = 2, pad = 0: prompt A = 5 6 7, B = 8 9 (one pad); A's rows
    draw 10 11 EOS and 10 12 13 14 (no EOS), B's both draw EOS at once."""
    prompt = torch.tensor([[5, 6, 7], [5, 6, 7], [0, 8, 9], [0, 8, 9]])
    pmask = (prompt != 0).long()
    comp = torch.tensor([[10, 11, 2, 0], [10, 12, 13, 14], [2, 0, 0, 0], [2, 0, 0, 0]])
    cmask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 0, 0, 0]])
    return Rollout(torch.cat([prompt, comp], 1), torch.cat([pmask, cmask], 1), cmask, 3,
                   [""] * 4, torch.tensor([False, True, False, False]))


def test_matmul_params_count_every_projection_and_the_head():
    """Per layer q 64x64, k and v 64x32 (2 of 4 heads), o 64x64, gate and up 64x96, down
    96x64: 30,720, two layers; the head 50 x 64; embeddings and norms are not matmuls."""
    assert load_bench("decode_flops").matmul_params(_model()) == (2 * 30_720, 3_200)


def test_useful_tokens_count_distinct_prefixes_once():
    """Body: prompt tokens 3 + 2, and the prefixes a next token was drawn after: A's (10),
    (10 11), (10 12), (10 12 13); B's rows ended at their first token. Head: the draws from
    A's (), (10), (10 11), (10 12), (10 12 13) and B's () once for both rows."""
    bench = load_bench("decode_flops")
    roll = hand_rollout()
    assert bench.useful_tokens(roll) == (5 + 4, 6)
    flops, body_tok, head_tok = bench.decode_flops(_model(), roll)
    assert (body_tok, head_tok) == (9, 6)
    assert flops == 2 * (2 * 30_720 * 9 + 3_200 * 6)


def test_attention_flops_over_the_keys_each_position_sees():
    """4 x layers x heads x head dim per (position, key it sees): A's rows see 1..3 prompt keys
    then 4..6 (row 0) and 4..7 (row 1); B's 1..2 then 3."""
    seen = (1 + 2 + 3) * 2 + (4 + 5 + 6) + (4 + 5 + 6 + 7) + (1 + 2 + 3) * 2
    bench = load_bench("decode_flops")
    assert bench.attention_flops(_model(), hand_rollout()) == 4 * 2 * 4 * 16 * seen


def _event(name, us, parent=None):
    ev = types.SimpleNamespace(name=name, cpu_time_total=us, cpu_parent=parent, cpu_children=[])
    if parent is not None:
        parent.cpu_children.append(ev)
    return ev


def test_breakdown_gives_each_top_level_op_to_its_innermost_scope():
    """A step scope holding a linear (with its mm) and an add, a cache scope inside the step, a
    draw scope, an op outside every scope: each top-level op's time counted once, where it
    belongs; the wall time left over is Python's."""
    from trainer.rollout import decode

    step = _event(decode.STEP, 900)
    linear = _event("aten::linear", 500, step)
    _event("aten::mm", 480, linear)
    _event("aten::add", 100, step)
    cache = _event(decode.CACHE, 60, step)
    _event("aten::copy_", 50, cache)
    draw = _event(decode.DRAW, 200)
    _event("aten::cumsum", 150, draw)
    outside = _event("aten::cat", 40)
    events = [step, *step.cpu_children, linear.cpu_children[0], cache.cpu_children[0], draw,
              draw.cpu_children[0], outside]
    parts = load_bench("decode_flops").breakdown(events, wall=0.002)
    want = {"step matmuls": 500e-6, "step other ops": 100e-6, "cache handling": 50e-6,
            "sampling": 150e-6, "outside the loop": 40e-6, "prefill": 0.0, "row sharing": 0.0}
    for name, seconds in want.items():
        assert abs(parts[name] - seconds) < 1e-12, name
    assert abs(parts["python overhead"] - (0.002 - 840e-6)) < 1e-12
