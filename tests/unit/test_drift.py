"""Parameter drift (`trainer.metrics.Drift`) against a hand computation in float64."""

from __future__ import annotations

import math

import torch

from trainer import metrics
from trainer.metrics import Drift


def test_drift_equals_the_float64_norm_of_the_change():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Linear(5, 3))
    model[1].bias.requires_grad_(False)  # frozen parameters are not part of the drift
    before = [p.detach().double().clone() for p in model.parameters()]
    drift = Drift(model)
    assert drift(model) == (0.0, 0.0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    after = [p.detach().double() for p in model.parameters()]
    trainable = [p.requires_grad for p in model.parameters()]
    pairs = [(a, b) for a, b, t in zip(after, before, trainable, strict=True) if t]
    d2 = sum(float(((a - b) ** 2).sum()) for a, b in pairs)
    n2 = sum(float((b**2).sum()) for _, b in pairs)
    d_abs, d_rel = drift(model)
    # the difference and its squares are float64; the initial norm is summed from float64
    # norms per tensor; a wrong term, scale or frozen parameter is off by far more
    assert math.isclose(d_abs, math.sqrt(d2), rel_tol=1e-12)
    assert math.isclose(d_rel, math.sqrt(d2) / math.sqrt(n2), rel_tol=1e-12)
    assert d_abs > 0.1  # the change is seen


def test_drift_keeps_its_own_copy_of_the_initial_weights():
    model = torch.nn.Linear(4, 4)
    drift = Drift(model)
    with torch.no_grad():
        model.weight.fill_(0.0)
        model.bias.fill_(0.0)
    d_abs, d_rel = drift(model)
    assert math.isclose(d_rel, 1.0, rel_tol=1e-12)  # back to zero: the whole initial norm


def test_drift_summed_block_by_block_equals_the_whole_difference(monkeypatch):
    # blocks of 7 split every tensor, most with a short last block, and one tensor is empty
    # (a rank's empty shard); both sums are float64, so they agree to its rounding
    monkeypatch.setattr(metrics, "DRIFT_BLOCK", 7)
    gen = torch.Generator().manual_seed(1)
    then = [torch.randn(s, generator=gen) for s in ((5, 9), (0,), (23,), (7,))]
    now = [t + 0.01 * torch.randn(t.shape, generator=gen) for t in then]
    whole = sum(float(((a.double() - b.double()) ** 2).sum())
                for a, b in zip(now, then, strict=True))
    assert math.isclose(metrics._diff_sum_sq(now, then), whole, rel_tol=1e-12)
    assert metrics._diff_sum_sq([], []) == 0.0
