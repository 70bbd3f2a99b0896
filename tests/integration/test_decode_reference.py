"""The HF engine's decode loop keeps its rollouts: fixed-seed samples of the tiny model equal the
ones the loop drew before its overhead was cut (tests/fixtures/decode/reference.pt, written by
`reference_rollouts` at commit bd0e907; the tiny model's weights are the same on any machine with
this torch).

In bfloat16 the arithmetic is the same, op for op: everything equal bit for bit. In float32 the
loop now multiplies by its widest weights stored transposed (`Layers.fuse_transposed`), which
sums the products in another order: the tokens are the same and the log-probs and entropies agree to
2e-5 (seen: under 4e-6 here, under 3e-5 on SmolLM2-135M's 30 layers and 49k vocabulary, where
the tokens matched too), far inside the 1e-4 to which the loop is held to transformers' forward
(tests/integration/test_fast_decode_tiny.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.training import load_tiny
from trainer.config import TrainConfig
from trainer.rollout.hf import HFEngine

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "decode" / "reference.pt"
# (name, dtype of the sampling copy, temperature, top_p, group size, max_new_tokens)
CASES = (
    ("t0.7", "float32", 0.7, 1.0, 8, 12),
    ("t1.2-top0.9", "float32", 1.2, 0.9, 4, 12),
    ("greedy", "float32", 0.0, 1.0, 2, 10),
    ("bf16-t0.7", "bfloat16", 0.7, 1.0, 8, 12),
)


def _prompts(tok, n: int, group: int) -> list[str]:
    from trainer.data import ArithmeticTask, render_prompt

    problems = ArithmeticTask().sample(np.random.default_rng(3), n)
    return [render_prompt(p, tok) for p in problems for _ in range(group)]


def reference_rollouts(path, tok, model) -> dict[str, dict[str, torch.Tensor]]:
    """{case: completion ids, sampler log-probs and entropies} of a fixed-seed rollout per case
    (the model is copied into the case's dtype, as `rollout_dtype` does)."""
    out = {}
    for name, dtype, t, top_p, group, new in CASES:
        m = model if dtype == "float32" else _copy(model, dtype)
        cfg = TrainConfig(model=str(path), max_new_tokens=new, top_p=top_p)
        torch.manual_seed(7)
        roll = HFEngine(cfg, m, tok).generate(_prompts(tok, 5, group), temperature=t)
        out[name] = {"ids": roll.completion_ids.clone(), "logp": roll.sampler_logp.clone(),
                     "entropy": roll.sampler_entropy}
    return out


def _copy(model, dtype: str):
    import copy

    twin = copy.deepcopy(model)
    for p in twin.parameters():
        p.data = p.data.to(getattr(torch, dtype))
    return twin


@pytest.fixture(scope="module")
def tiny(tiny_model):  # taking tiny_model marks each test given it (conftest)
    return load_tiny()


@pytest.fixture(scope="module")
def rollouts(tiny):
    return reference_rollouts(*tiny)


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_rollouts_equal_the_stored_reference(rollouts, case):
    """The same tokens; log-probs and entropies bit for bit in bfloat16, to 2e-5 in float32."""
    want, got = torch.load(FIXTURE)[case], rollouts[case]
    tol = 0.0 if case.startswith("bf16") else 2e-5
    assert int((~torch.isnan(want["logp"])).sum()) > 40  # real tokens, not all padding
    assert torch.equal(got["ids"], want["ids"])
    assert torch.equal(torch.isnan(got["logp"]), torch.isnan(want["logp"]))
    assert torch.allclose(got["logp"], want["logp"], atol=tol, rtol=0, equal_nan=True)
    if want["entropy"] is None:
        assert got["entropy"] is None
    else:
        assert torch.allclose(got["entropy"], want["entropy"], atol=tol, rtol=0, equal_nan=True)
