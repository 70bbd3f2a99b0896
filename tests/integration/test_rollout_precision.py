"""Rollouts in bf16 while the update runs in fp32, through `train()` on the tiny model.

The truths: the trainer's log-probs of the sampled tokens recomputed apart (transformers'
forward of the initial fp32 weights) against the sampler's, which gives the logged mismatch;
an explicit fp32 config's rows against the defaults' (bit for bit); a run cut after a
checkpoint and resumed against the same run uninterrupted (bit for bit).
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.support.training import (
    SMALL_RUN,
    Collect,
    KeptEngine,
    full_row_logits,
    load_tiny,
    train_small,
    without_timings,
)

pytestmark = pytest.mark.tiny_model

def test_the_bf16_samplers_mismatch_is_small_and_is_what_the_trainer_measures(tmp_path):
    """The sampler's log-probs come from the bf16 copy: their gap to the fp32 policy is far
    above fp32 rounding (the HF engine in fp32 reads < 1e-6) and small; the logged
    `sampler_abs_logratio` and `sampler_kl_k3` are what an fp32 forward of transformers over
    the same tokens gives against them; TIS is on at the default cap 2."""
    kept = KeptEngine()
    sink = train_small(tmp_path, "bf16", make=kept, rollout_dtype="bfloat16")
    assert kept.model.dtype == torch.bfloat16 and not kept.model.lm_head.weight.requires_grad
    row, roll = sink.rows[1], kept.rollouts[0]
    _, _, model = load_tiny()  # the run's initial weights: what step 1 sampled from
    with torch.no_grad():
        logits = full_row_logits(model, roll.input_ids, roll.attention_mask, roll.prompt_len)
    trainer = torch.log_softmax(logits.float(), -1).gather(
        -1, roll.completion_ids.unsqueeze(-1)).squeeze(-1)
    ok = roll.completion_mask.bool()
    d = (trainer - roll.sampler_logp)[ok].double()
    abs_mean, k3 = float(d.abs().mean()), float((d.exp() - 1 - d).mean())
    assert row["sampler_abs_logratio"] == pytest.approx(abs_mean, rel=1e-3, abs=1e-6)
    assert row["sampler_kl_k3"] == pytest.approx(k3, rel=1e-2, abs=1e-8)
    assert 1e-4 < row["sampler_abs_logratio"] < 0.05  # bf16's own gap, and a small one
    assert 0 < row["tis_weight_mean"] <= 2.0 and abs(row["tis_weight_mean"] - 1) < 0.05
    assert 0 <= row["tis_capped_frac"] <= 1
    assert sink.events == [
        "rollouts sample in bfloat16 (rollout_dtype = 'bfloat16'), the update runs in float32; "
        "tis_cap 2 (tis_cap unset, the sampler differs from the trainer: the default cap)"]


def test_tis_off_keeps_the_mismatch_and_drops_the_correction(tmp_path):
    row = train_small(tmp_path, "off", rollout_dtype="bfloat16", tis_cap="off").rows[1]
    assert row["sampler_abs_logratio"] > 1e-4
    assert "tis_weight_mean" not in row and "tis_capped_frac" not in row


def test_an_explicit_fp32_config_is_bit_identical_to_the_defaults(tmp_path):
    """The defaults sample with the training model itself (no copy, no TIS, no event), and a
    config that names float32 for both is the same run, value for value."""
    kept = KeptEngine()
    default = train_small(tmp_path, "default", make=kept, sample_budget=64)
    assert kept.model.dtype == torch.float32 and kept.model.lm_head.weight.requires_grad
    named = train_small(tmp_path, "named", dtype="float32", rollout_dtype="float32",
                        sample_budget=64)
    assert sorted(default.rows) == [1, 2]
    assert without_timings(default.rows) == without_timings(named.rows)
    assert default.events == [] and "tis_weight_mean" not in default.rows[2]
    assert 0 <= default.rows[1]["sampler_abs_logratio"] < 1e-4  # the trainer's own rounding
    assert named.events == [
        "rollouts sample in float32 (rollout_dtype = 'float32'), the update runs in float32; "
        "tis_cap off (tis_cap unset, the sampler is the trainer: off)"]


class _Cut(Exception):
    """Stops a training after a step, as a kill would."""


def test_a_bf16_rollout_run_resumes_exactly(tmp_path):
    """Cut after step 3 (checkpoint at step 2) and resumed, the run's rows equal the
    uninterrupted run's: the bf16 copy is rebuilt from the checkpoint's fp32 weights."""
    over = dict(rollout_dtype="bfloat16", prompts_per_batch=4, sample_budget=64,
                checkpoint_every_steps=2, eval_every_samples=32, eval_size=16)
    whole = train_small(tmp_path, "whole", **over)

    def cut(progress):
        if progress.step == 3:
            raise _Cut

    sink = Collect()
    from trainer.config import TrainConfig
    from trainer.loop import train

    cfg = TrainConfig(**{**SMALL_RUN, **over})
    with pytest.raises(_Cut):
        train(cfg, sink, tmp_path / "cut", on_step=cut)
    assert train(cfg, sink, tmp_path / "cut") == "completed"
    assert sorted(whole.rows) == [0, 1, 2, 3, 4]
    assert without_timings(sink.rows) == without_timings(whole.rows)
    assert not math.isnan(whole.rows[4]["eval_accuracy"])
