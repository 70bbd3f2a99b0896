"""Sampler/trainer mismatch metrics and truncated importance sampling, through `train()`.

The truth: an engine whose log-probs are the HF engine's shifted by a known delta. Its mismatch
is |log ratio| = delta and k3 = e^delta - 1 - delta on every token; with TIS every token's loss
is scaled by min(e^delta, cap), so the (unclipped) gradient norm scales by exactly that factor
against the same step without TIS.
"""

from __future__ import annotations

import math

import pytest

from tests.support.training import Collect

pytestmark = pytest.mark.tiny_model

DELTA = 0.1


class _Shifted:
    """The HF engine, reporting every sampled token's log-prob `DELTA` lower than it is."""

    def __init__(self, inner):
        self.inner = inner

    def sync(self, model):
        self.inner.sync(model)

    def generate(self, prompts, temperature=None):
        roll = self.inner.generate(prompts, temperature)
        roll.sampler_logp = roll.sampler_logp - DELTA
        roll.sampler_entropy = None  # its numbers are no longer the policy's own
        return roll


class _Foreign(_Shifted):
    """The HF engine claiming nothing about its numerics (as vLLM): no `sampler_entropy`, so
    the trainer runs its own forward for the rows the update skips."""

    def generate(self, prompts, temperature=None):
        roll = self.inner.generate(prompts, temperature)
        roll.sampler_entropy = None
        return roll


def _first_step(tmp_path, name: str, shifted: bool | type, **over) -> dict:
    from trainer.config import TrainConfig
    from trainer.loop import train
    from trainer.rollout import make_engine

    wrap = _Shifted if shifted is True else shifted or None

    def make(cfg, model, tok, path):
        engine = make_engine(cfg, model, tok, path)
        return wrap(engine) if wrap else engine

    cfg = TrainConfig(prompts_per_batch=8, group_size=4, lr=1e-3, sample_budget=32, seed=5,
                      eval_every_samples=0, checkpoint_every_steps=0, threads=1,
                      max_grad_norm=None, **over)
    sink = Collect()
    assert train(cfg, sink, tmp_path / name, make_rollout=make) == "completed"
    return sink.rows[1]


def test_the_hf_engine_agrees_with_the_trainer_to_rounding(tmp_path):
    row = _first_step(tmp_path, "plain", shifted=False)
    assert 0 <= row["sampler_abs_logratio"] < 1e-4
    assert 0 <= row["sampler_kl_k3"] < 1e-8
    assert "tis_weight_mean" not in row


@pytest.mark.parametrize("epochs", [1, 2])
def test_a_shifted_sampler_is_measured_and_corrected(tmp_path, epochs):
    base = _first_step(tmp_path, "base", shifted=True, ppo_epochs=epochs)
    assert base["sampler_abs_logratio"] == pytest.approx(DELTA, abs=1e-4)
    assert base["sampler_kl_k3"] == pytest.approx(math.exp(DELTA) - 1 - DELTA, rel=1e-3)
    for cap, weight in ((2.0, math.exp(DELTA)), (1.05, 1.05)):
        row = _first_step(tmp_path, f"cap{cap}", shifted=True, ppo_epochs=epochs, tis_cap=cap)
        assert row["tis_weight_mean"] == pytest.approx(weight, rel=1e-4)
        assert row["tis_capped_frac"] == (1.0 if cap < math.exp(DELTA) else 0.0)
        # same rollout (same seeds), every token's loss scaled by `weight`: so is the gradient
        # of the first optimizer step (later epochs start from other weights)
        assert row["reward_mean"] == base["reward_mean"]
        if epochs == 1:
            assert row["grad_norm"] == pytest.approx(weight * base["grad_norm"], rel=1e-4)
        assert row["grad_sq_full"] == pytest.approx(weight**2 * base["grad_sq_full"], rel=1e-3)


def test_skipped_rows_take_the_samplers_numbers_as_a_forward_would_give_them(tmp_path):
    """The decode loop's log-probs and entropy stand in for a trainer forward over the rows the
    update leaves out (zero advantage): the step's entropy and KL-to-init equal those of the
    run that scores them with its own forward, to float rounding; everything else is equal."""
    ours = _first_step(tmp_path, "sampler", shifted=False)
    forward = _first_step(tmp_path, "forward", shifted=_Foreign)
    assert ours["zero_std_frac"] > 0  # there were rows to leave out
    assert ours["reward_mean"] == forward["reward_mean"]
    assert ours["entropy"] == pytest.approx(forward["entropy"], rel=1e-5)
    assert ours["kl_init"] == pytest.approx(forward["kl_init"], abs=1e-7)
    for key in ("loss", "grad_norm", "clip_frac", "drift_abs"):
        assert ours[key] == pytest.approx(forward[key], rel=1e-6), key
    # the mismatch is measured on the rows the trainer scored itself, and stays at rounding
    assert 0 <= ours["sampler_abs_logratio"] < 1e-4
