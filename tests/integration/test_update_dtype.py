"""The update in bf16 over float32 master weights (`update_dtype`): on a bf16 copy of the
weights in one process, under autocast where several train; through `update()` and `train()`
on the tiny model.

The truths: an fp32 config that leaves update_dtype unset against one that names float32 (bit
for bit); one micro-batch's gradient recomputed apart with the same forward and with
transformers' on the same bf16 copy or under the same autocast, and in float32; the rollout's
entropy recomputed apart with transformers' float32 forward over the same rows, with every
trainer forward counted by a hook; a run cut after a checkpoint and resumed against the same
run uninterrupted (bit for bit).
"""

from __future__ import annotations

import copy
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

def test_unset_is_bit_identical_to_an_explicit_float32(tmp_path):
    """update_dtype unset is the update as before the option existed: a config naming float32
    logs the same rows value for value; only the named one says so in an event."""
    default = train_small(tmp_path, "default", sample_budget=64)
    named = train_small(tmp_path, "named", update_dtype="float32", sample_budget=64)
    assert sorted(default.rows) == [1, 2]
    assert without_timings(default.rows) == without_timings(named.rows)
    assert default.events == []
    assert named.events == [
        "rollouts sample in float32 (rollout_dtype unset: the parameter dtype), the update runs "
        "in float32 (update_dtype = 'float32'); tis_cap off (tis_cap unset, the sampler is the "
        "trainer: off)"]


def _grad(model) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def _recomputed_grad(model, roll, adv, autocast: bool, own: bool,
                     bf16_copy: bool = False) -> torch.Tensor:
    """The first on-policy pass's token-mean gradient, -mean over tokens of A * grad log p
    (the ratio is exactly 1 there), from a copy of `model` (`bf16_copy`: its weights cast to
    bf16, the gradient returned in float32): by twoclocks' own forward (`own`) or
    transformers' over whole rows, under bf16 autocast or in the copy's dtype."""
    from trainer.logprobs import completion_logprobs
    from trainer.scorer import Scorer

    m = copy.deepcopy(model)
    if bf16_copy:
        m = m.to(torch.bfloat16)
    p = roll.prompt_len
    with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        if own:
            logp, _ = completion_logprobs(Scorer(m), roll, 1.0)
        else:
            logits = full_row_logits(m, roll.input_ids, roll.attention_mask, p)
            logp = torch.log_softmax(logits.float(), -1).gather(
                -1, roll.completion_ids.unsqueeze(-1)).squeeze(-1)
    cm = roll.completion_mask.float()
    (-(adv[:, None] * logp * cm).sum() / cm.sum()).backward()
    return _grad(m).float()


def _one_batch(model, tok, cfg):
    """(rollout, advantages) of four prompts x G = 4 sampled by `model` at seed 3, with fixed
    rewards: the batch the `update()` tests below train on."""
    from trainer import grpo
    from trainer.rollout.hf import HFEngine

    torch.manual_seed(3)
    roll = HFEngine(cfg, model, tok).generate(["12+34=", "7+45=", "61+2=", "30+30="] * 4)
    adv = grpo.group_advantages(torch.tensor([1.0, 0, 0, 1, 0, 1, 1, 1, 1, 0, 0, 0,
                                              0, 0, 1, 0]), 4)
    return roll, adv


def test_a_bf16_update_keeps_float32_weights_and_its_gradient_is_autocasts(tmp_path):
    """One micro-batch through `update()` with update_dtype bfloat16 and no compute copy (as
    under several processes): the parameters, their
    gradients and AdamW's moments stay float32, and the gradient is the one of the same
    forward under bf16 autocast, recomputed here apart from the update's loss bookkeeping.

    Tolerances: against the same forward (`completion_logprobs` through twoclocks' own
    forward) under the same autocast, 1e-5 of the gradient's norm: the same ops on the same bf16
    casts, only the loss assembled apart (measured 0, bit for bit). Against transformers'
    forward under autocast, 3e-2: other matmul shapes and orders (fused q/k/v and gate/up, the
    group's prompt run once, RoPE in another layout) round intermediate sums to bf16 apart, as
    far from each other as from float32 (measured 0.8e-2 to 1.2e-2 over three rollouts; in
    float32 the two forwards agree to 1.6e-6). The float32 gradient (0.7e-2 to 1.1e-2 away)
    must be over 100x the same-forward distance: the update computed in bf16, not float32.
    """
    from trainer.config import TrainConfig
    from trainer.dist import Dist
    from trainer.loop import make_optimizer
    from trainer.scorer import make_scorer
    from trainer.update import update

    _, tok, model = load_tiny()
    model.train()
    cfg = TrainConfig(group_size=4, max_new_tokens=8, micro_batch_size=16, temperature=1.0,
                      update_dtype="bfloat16", max_grad_norm=None, skip_zero_advantage=False,
                      threads=1)
    roll, adv = _one_batch(model, tok, cfg)
    same = _recomputed_grad(model, roll, adv, autocast=True, own=True)
    hf = _recomputed_grad(model, roll, adv, autocast=True, own=False)
    fp32 = _recomputed_grad(model, roll, adv, autocast=False, own=True)

    m = copy.deepcopy(model)
    opt = make_optimizer(m, cfg)
    st = update(make_scorer(m, cfg), opt, roll, adv, None, None, cfg, cfg.phase_at(0)[1],
                Dist(), noise=False)
    got = _grad(m)
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32
               for p in m.parameters())
    moments = [v for s in opt.state.values() for k, v in s.items() if k != "step"]
    assert moments and all(v.dtype == torch.float32 for v in moments)

    def off(want):
        return float((got - want).norm() / want.norm())

    assert off(same) < 1e-5, off(same)
    assert off(hf) < 3e-2, off(hf)
    assert off(fp32) > 100 * max(off(same), 1e-6), (off(fp32), off(same))  # autocast's
    cm = roll.completion_mask.float()
    assert st.loss == pytest.approx(float(-(adv[:, None] * cm).sum() / cm.sum()), abs=1e-6)
    assert st.kl_old_new == 0.0 and st.clip_low == st.clip_high == 0.0  # ratio exactly 1
    assert torch.isfinite(st.entropy).any() and st.entropy.dtype == torch.float32


def test_a_bf16_update_on_a_copy_folds_the_copys_gradient_into_float32(tmp_path):
    """One micro-batch through `update()` on a bf16 compute copy (one process): the
    parameters, their gradients and AdamW's moments stay float32, the copy keeps no gradient,
    and the gradient is that of the same forward on a bf16 copy, recomputed apart.

    Tolerances: against the same forward on the same bf16 weights, 1e-5 of the norm (the same
    ops, only the loss assembled apart; measured 0). Against transformers' forward on the bf16
    copy, 5e-2: other matmul shapes and orders round intermediate sums to bf16 apart, and
    without autocast the norms and softmax are bf16 too (measured 0.9e-2 to 2.3e-2 over three
    rollouts; the float32 gradient 1.1e-2 to 2.8e-2 away). The float32 gradient must be over
    100x the same-forward distance: the update computed in bf16."""
    from trainer import precision
    from trainer.config import TrainConfig
    from trainer.dist import Dist
    from trainer.loop import make_optimizer
    from trainer.scorer import make_scorer
    from trainer.update import update

    _, tok, model = load_tiny()
    model.train()
    cfg = TrainConfig(group_size=4, max_new_tokens=8, micro_batch_size=16, temperature=1.0,
                      update_dtype="bfloat16", max_grad_norm=None, skip_zero_advantage=False,
                      threads=1)
    roll, adv = _one_batch(model, tok, cfg)
    same = _recomputed_grad(model, roll, adv, autocast=False, own=True, bf16_copy=True)
    hf = _recomputed_grad(model, roll, adv, autocast=False, own=False, bf16_copy=True)
    fp32 = _recomputed_grad(model, roll, adv, autocast=False, own=True)

    m = copy.deepcopy(model)
    opt = make_optimizer(m, cfg)
    cc = precision.compute_copy(m, m, "bfloat16", lambda c: make_scorer(c, cfg))
    st = update(make_scorer(m, cfg), opt, roll, adv, None, None, cfg, cfg.phase_at(0)[1],
                Dist(), noise=False, compute=cc)
    got = _grad(m)
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32
               for p in m.parameters())
    assert all(q.grad is None and q.dtype == torch.bfloat16 for _, q in cc.pairs)
    moments = [v for s in opt.state.values() for k, v in s.items() if k != "step"]
    assert moments and all(v.dtype == torch.float32 for v in moments)

    def off(want):
        return float((got - want).norm() / want.norm())

    assert off(same) < 1e-5, off(same)
    assert off(hf) < 5e-2, off(hf)
    assert off(fp32) > 100 * max(off(same), 1e-6), (off(fp32), off(same))
    assert st.kl_old_new == 0.0 and st.clip_low == st.clip_high == 0.0  # ratio exactly 1


def test_the_copy_is_recast_between_optimizer_steps_of_one_update(tmp_path):
    """Two minibatches on a bf16 copy: old log-probs from the copy before any step, so the
    first minibatch's ratio is exactly 1; the second reads the copy re-cast after the first
    step, so its ratio moves (kl_old_new non-zero). Without the re-cast it would read the
    unstepped copy: kl_old_new exactly 0. The lr is large enough for a step to survive
    bf16 rounding in the copy."""
    from trainer import precision
    from trainer.config import TrainConfig
    from trainer.dist import Dist
    from trainer.loop import make_optimizer
    from trainer.scorer import make_scorer
    from trainer.update import no_grad_logprobs, update

    _, tok, model = load_tiny()
    model.train()
    cfg = TrainConfig(group_size=4, max_new_tokens=8, micro_batch_size=8, temperature=1.0,
                      update_dtype="bfloat16", skip_zero_advantage=False, num_minibatches=2,
                      lr=1e-3, threads=1)
    roll, adv = _one_batch(model, tok, cfg)
    opt = make_optimizer(model, cfg)
    cc = precision.compute_copy(model, model, "bfloat16", lambda c: make_scorer(c, cfg))
    old, _ = no_grad_logprobs(cc.net, roll, cfg, False)
    before = [q.clone() for _, q in cc.pairs]
    st = update(make_scorer(model, cfg), opt, roll, adv, old, None, cfg, cfg.phase_at(0)[1],
                Dist(), noise=False, compute=cc)
    assert len(st.grad_norms) == 2
    assert st.kl_old_new != 0.0
    # re-cast once (after the first step), not after the last: the loop's sync does that
    stepped_once = any(not torch.equal(b, q)
                       for b, (_, q) in zip(before, cc.pairs, strict=True))
    assert stepped_once
    assert not all(torch.equal(q, p.to(torch.bfloat16)) for p, q in cc.pairs)


class _Forwards:
    """Every call of a twoclocks Scorer (the trainer's forward): its rows and whether it
    builds a graph, as a global forward hook sees them."""

    def __init__(self):
        self.calls: list[tuple[int, bool]] = []

    def __enter__(self):
        from trainer.scorer import Scorer

        def hook(module, args, _out):
            if isinstance(module, Scorer):
                self.calls.append((int(args[0].shape[0]), torch.is_grad_enabled()))

        self.handle = torch.nn.modules.module.register_module_forward_hook(hook)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def _entropy_truth(roll) -> float:
    """Token entropy of `roll` under the initial weights, by transformers' float32 forward."""
    _, _, model = load_tiny()
    with torch.no_grad():
        logits = full_row_logits(model, roll.input_ids, roll.attention_mask, roll.prompt_len)
    logp = torch.log_softmax(logits.float(), -1)
    ent = -(logp.exp() * logp).sum(-1)
    cm = roll.completion_mask.float()
    return float((ent * cm).sum() / cm.sum())


@pytest.mark.parametrize("update_dtype,tol", [(None, 1e-5), ("bfloat16", 5e-3)])
def test_the_entropy_comes_off_the_update_with_no_forward_of_its_own(tmp_path, update_dtype,
                                                                     tol):
    """bf16 rollouts, every row trained: every trainer forward of step 1 is the update's
    own, with a graph, one per micro-batch over the batch's rows, and the logged `entropy`
    equals an fp32 recomputation of the same rows. Tolerance: float32 rounding for a float32
    update; in bf16 a token's entropy moves by bf16 rounding of the logits (up to 0.04 here),
    their mean over the batch by 1e-4 to 1.2e-3 relative (five rollouts of 32 rows measured
    under autocast), inside 5e-3."""
    kept = KeptEngine()
    over = dict(rollout_dtype="bfloat16", skip_zero_advantage=False, kl_init_every=0,
                micro_batch_size=16, noise_every=0)
    if update_dtype:
        over["update_dtype"] = update_dtype
    with _Forwards() as seen:
        sink = train_small(tmp_path, "ent", make=kept, **over)
    roll = kept.rollouts[0]
    assert seen.calls == [(16, True), (16, True)]  # 32 rows, two micro-batches, no more
    truth = _entropy_truth(roll)
    assert sink.rows[1]["entropy"] == pytest.approx(truth, rel=tol)
    assert sink.rows[1]["approx_kl"] == 0.0 and sink.rows[1]["clip_frac"] == 0.0


def test_one_bf16_copy_samples_and_updates_so_skipped_rows_need_no_forward(tmp_path):
    """bf16 rollouts and a bf16 update share one bf16 copy: the sampler's numbers are the
    update forward's precision, so the zero-advantage rows the update skips take the
    sampler's entropy (the logged entropy still covers every row) and every trainer forward
    is the update's, with a graph, over exactly the rows with signal."""
    kept = KeptEngine()
    with _Forwards() as seen:
        sink = train_small(tmp_path, "skip", make=kept, rollout_dtype="bfloat16",
                      update_dtype="bfloat16", kl_init_every=0, micro_batch_size=32,
                      noise_every=0)
    assert seen.calls and all(grad for _, grad in seen.calls)
    zero = 32 - sink.rows[1]["zero_std_frac"] * 8 * 4  # rows of groups with some signal
    assert sum(n for n, _ in seen.calls) == zero < 32
    assert sink.rows[1]["entropy"] == pytest.approx(_entropy_truth(kept.rollouts[0]), rel=5e-3)
    assert sink.events == [
        "rollouts sample in bfloat16 (rollout_dtype = 'bfloat16'), the update computes in "
        "bfloat16 on a bfloat16 copy of the float32 weights (update_dtype = 'bfloat16'); "
        "tis_cap 2 (tis_cap unset, the sampler differs from the trainer: the default cap)"]


class _Cut(Exception):
    """Stops a training after a step, as a kill would."""


def test_a_bf16_update_run_resumes_exactly(tmp_path):
    """bf16 rollouts and a bf16 update (one bf16 copy for both), cut after step 3 (checkpoint
    at step 2) and resumed: the rows equal the uninterrupted run's, and the checkpoint holds
    float32 weights and AdamW moments (the copy is re-cast from them, not saved)."""
    from trainer import checkpoint
    from trainer.config import TrainConfig
    from trainer.loop import train

    over = dict(rollout_dtype="bfloat16", update_dtype="bfloat16", prompts_per_batch=4,
                sample_budget=64, checkpoint_every_steps=2, eval_every_samples=32, eval_size=16)
    whole = train_small(tmp_path, "whole", **over)

    def cut(progress):
        if progress.step == 3:
            raise _Cut

    sink = Collect()
    cfg = TrainConfig(**{**SMALL_RUN, **over})
    with pytest.raises(_Cut):
        train(cfg, sink, tmp_path / "cut", on_step=cut)
    main, _ = checkpoint.load(checkpoint.latest(tmp_path / "cut"), 0)
    assert all(t.dtype == torch.float32 for t in main["model"].values()
               if t.is_floating_point())
    moments = [v for s in main["optimizer"]["state"].values() for k, v in s.items()
               if k != "step"]
    assert moments and all(v.dtype == torch.float32 for v in moments)
    assert train(cfg, sink, tmp_path / "cut") == "completed"
    assert sorted(whole.rows) == [0, 1, 2, 3, 4]
    assert without_timings(sink.rows) == without_timings(whole.rows)
    assert not math.isnan(whole.rows[4]["eval_accuracy"])


def test_a_bf16_update_alone_keeps_the_samplers_entropy_and_corrects_the_gap(tmp_path):
    """update_dtype bfloat16 with the training model sampling in float32: the decode loop's
    entropy is the fp32 policy's own, so the skipped rows need no forward (every trainer
    forward is the update's, with a graph, over the rows with signal); the sampler is not the
    update's forward, so the gap is bf16's (far above fp32's < 1e-4, the defaults' own
    rounding) and TIS is on at its default cap."""
    with _Forwards() as seen:
        sink = train_small(tmp_path, "alone", update_dtype="bfloat16", kl_init_every=0,
                      micro_batch_size=32, noise_every=0)
    row = sink.rows[1]
    assert all(grad for _, grad in seen.calls)
    assert sum(n for n, _ in seen.calls) == 32 - row["zero_std_frac"] * 32
    assert 1e-4 < row["sampler_abs_logratio"] < 0.05
    assert abs(row["tis_weight_mean"] - 1) < 0.05
    assert sink.events == [
        "rollouts sample in float32 (rollout_dtype unset: the parameter dtype), the update "
        "computes in bfloat16 on a bfloat16 copy of the float32 weights (update_dtype = "
        "'bfloat16'); tis_cap 2 (tis_cap unset, the sampler differs from the trainer: the "
        "default cap)"]
