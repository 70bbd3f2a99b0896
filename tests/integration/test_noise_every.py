"""`noise_every`: which steps measure the gradient-noise terms, and that not measuring them
changes nothing else (the split of the first minibatch only reorders the gradient's sum)."""

from __future__ import annotations

import pytest

from tests.support.training import Collect, load_tiny
from trainer.config import TrainConfig
from trainer.loop import train

pytestmark = pytest.mark.tiny_model

NOISE_KEYS = ("grad_sq_micro", "grad_sq_full", "grad_micro_size", "grad_full_size")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{noise_every: {step: values}} for 4 steps of the tiny model at noise_every 1, 2 and 0."""
    path = load_tiny()[0]
    out = {}
    for every in (1, 2, 0):
        cfg = TrainConfig(model=str(path), prompts_per_batch=8, group_size=4, max_new_tokens=12,
                          lr=5e-4, sample_budget=128, eval_every_samples=0,
                          checkpoint_every_steps=0, seed=1, noise_every=every)
        sink = Collect()
        assert train(cfg, sink, tmp_path_factory.mktemp(f"n{every}")) == "completed"
        out[every] = sink.rows
    return out


def test_which_steps_carry_the_noise_terms(runs):
    assert sorted(runs[1]) == [1, 2, 3, 4]
    for every, measured in ((1, {1, 2, 3, 4}), (2, {2, 4}), (0, set())):
        for step, values in runs[every].items():
            assert all((k in values) == (step in measured) for k in NOISE_KEYS), (every, step)
    for values in runs[1].values():  # a real split: half the 32 samples, then all of them
        assert (values["grad_micro_size"], values["grad_full_size"]) == (16, 32)
        assert values["grad_sq_micro"] >= 0 and values["grad_sq_full"] > 0
    # a first half whose groups all got equal rewards has no gradient (0 is right there), so
    # the sampled batches decide which steps have one: at least two of the four here
    split = [v for v in runs[1].values() if 0 < v["grad_sq_micro"] != v["grad_sq_full"]]
    assert len(split) >= 2


def test_skipping_the_measurement_changes_nothing_else(runs):
    """The same samples, rewards and updates (to float rounding) whether or not a step split
    its minibatch to measure the noise terms."""
    for step in (1, 2, 3, 4):
        a, b = runs[1][step], runs[0][step]
        assert a["reward_mean"] == b["reward_mean"]
        for key in ("loss", "grad_norm", "entropy", "drift_rel"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-7), (step, key)
    assert runs[1][4]["drift_rel"] > 0 and runs[1][4]["reward_mean"] > 0
