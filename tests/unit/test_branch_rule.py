"""The controller's branch rule: decisions from branch measurements against hand computation,
and on the real sim backend every branch sample charged to the run's clock."""

from __future__ import annotations

import math

import pytest

from trainer.adaptive.config import AdaptiveConfig
from trainer.ports import BranchResult
from twoclocks_cli.adaptive.controller import Controller
from twoclocks_cli.core.errors import ConfigError

G = 4


def _ctl(**kw) -> Controller:
    cfg = AdaptiveConfig(**{"batch_max": 16, "adapt_every": 100, "rule": "branch",
                            "branch_samples": 30, **kw})
    return Controller(cfg, G, run_prompts=1, run_lr=0.01)


def _brancher(gains: dict, drifts: dict, calls: list):
    """Branch measurements given per batch (prompts): what a backend would have measured."""
    def run(tried, each):
        calls.append((list(tried), each))
        return [BranchResult(p, float(each), gains[p], drifts[p]) for p in tried]
    return run


def _decide(ctl, samples, brancher, drift=0.0):
    return ctl.observe(1, samples, {"drift_rel": drift}, brancher)


@pytest.mark.parametrize("hi_gain, grows", [(0.0901, True), (0.0899, False), (0.2, True)])
def test_it_grows_when_twice_the_batch_keeps_grow_ratio_of_the_gain(hi_gain, grows):
    calls = []
    ctl = _ctl(grow_ratio=0.9)
    d = _decide(ctl, 100, _brancher({1: 0.1, 2: hi_gain}, {1: 0.0, 2: 0.0}, calls))
    # branch_samples 30 rounded up to whole steps of 2B = 8 samples: 32
    assert calls == [([1, 2], 32)]
    assert d.prompts == (2 if grows else 1)
    assert ctl.lr == pytest.approx(0.01 * math.sqrt(d.prompts))
    assert d.signals["branch_gain_ratio"] == pytest.approx(hi_gain / 0.1)


def test_no_gain_at_b_grows_only_when_2b_gains_more():
    calls = []
    assert _decide(_ctl(), 100, _brancher({1: 0.0, 2: 0.01}, {1: 0, 2: 0}, calls)).prompts == 2
    assert _decide(_ctl(), 100, _brancher({1: -0.01, 2: -0.02}, {1: 0, 2: 0}, calls)).prompts == 1


@pytest.mark.parametrize("gains, kept", [({1: 0.1, 2: math.nan}, 1), ({1: math.nan, 2: -0.3}, 2)])
def test_a_diverged_branch_loses_whatever_the_other_gained(gains, kept):
    """A diverged branch reports a NaN gain and drift; the other batch is kept, and the failure
    guard does not read the NaN drift as a reason to jump."""
    calls = []
    drifts = {p: (math.nan if math.isnan(g) else 0.5) for p, g in gains.items()}
    ctl = _ctl(drift_threshold=0.01, guard_warmup=0)
    d = _decide(ctl, 100, _brancher(gains, drifts, calls), drift=0.001)
    assert d.prompts == kept and ctl.state.mode == "progress"
    bad = 2 if kept == 1 else 1
    assert d.reason.endswith(f"the branch at {bad} prompts diverged: {kept} kept")


def test_the_batch_holds_and_the_decisions_back_off():
    calls = []
    ctl = _ctl(max_backoff=2)
    b = _brancher({1: 0.1, 2: 0.01}, {1: 0, 2: 0}, calls)
    seen = []
    for samples in range(100, 3000, 4):
        if _decide(ctl, samples, b) is not None:
            seen.append(samples)
    # kept each time: the next decision 100, 200, 400, 400, ... samples after the last
    assert seen[:5] == [100, 300, 700, 1100, 1500]


def test_at_batch_max_nothing_is_branched():
    calls = []
    ctl = _ctl(batch_min=16, batch_max=16)
    d = _decide(ctl, 100, _brancher({}, {}, calls))
    assert calls == [] and d.prompts == 16 and "nothing to branch" in d.reason


def test_without_budget_for_the_branches_the_batch_is_kept():
    ctl = _ctl()
    d = _decide(ctl, 100, lambda tried, each: None)
    assert d.prompts == 1 and "no budget left" in d.reason


def test_a_backend_that_cannot_branch_is_one_error():
    with pytest.raises(ConfigError, match="rule = \"branch\" needs a backend that branches"):
        _decide(_ctl(), 100, None)


def test_the_failure_clock_jumps_to_the_smallest_batch_projected_safe():
    """drift 1.0 now, threshold 2 (safety 0.8: limit 1.6), lookahead 1000 samples. The branches
    (32 samples each) end at drift^2 1.32 (B) and 1.16 (2B): drift^2 per sample 0.01 and 0.005,
    slope -1. Projected at B: sqrt(1.32 + 10) = 3.36 >= 1.6, so grow for failure: at 4 prompts
    the rate is 0.0025 (1.16 + 2.5 = 3.66), at 8 0.00125 (1.16 + 1.25 = 2.41 < 2.56): 8."""
    calls = []
    ctl = _ctl(drift_threshold=2.0, lookahead=1000, guard_warmup=0)
    ctl.state.drift = 1.0
    d = _decide(ctl, 100, _brancher({1: 0.1, 2: 0.1}, {1: math.sqrt(1.32), 2: math.sqrt(1.16)},
                                     calls), drift=1.0)
    assert d.signals["branch_drift_slope"] == pytest.approx(-1.0)
    assert d.signals["drift_projected"] == pytest.approx(math.sqrt(11.32))
    assert d.prompts == 8 and ctl.state.mode == "progress"
    assert "the smallest projected below it" in d.reason


def test_a_drift_that_does_not_fall_with_the_batch_leaves_the_choice_to_progress():
    """Same drift, but both branches drift alike (slope 0): a larger batch would not help."""
    calls = []
    ctl = _ctl(drift_threshold=2.0, lookahead=1000, guard_warmup=0)
    ctl.state.drift = 1.0
    d = _decide(ctl, 100, _brancher({1: 0.1, 2: 0.05}, {1: math.sqrt(1.32), 2: math.sqrt(1.32)},
                                     calls), drift=1.0)
    assert d.prompts == 1 and "keep" in d.reason


def test_the_grpo_trainer_takes_the_branch_rule():
    from trainer.config import TrainConfig

    cfg = TrainConfig.from_dict({"batch_schedule": "adaptive",
                                 "adaptive": {"batch_max": 8, "rule": "branch"}})
    assert cfg.adaptive.rule == "branch"


def test_every_branch_sample_is_charged_to_the_sim_runs_clock(tmp_path):
    """The real sim backend and store, a metric row at every step (the adopted branch's steps
    are the run's own rows): between two rows the samples grow by the later row's batch,
    except right after a decision that branched, where they also grow by the other branch's
    samples (charged before the adopted branch's steps); the decision's
    adaptive_branch_samples says how many (two branches of equal samples)."""
    from twoclocks_cli.backends import run_cell
    from twoclocks_cli.store import Run, RunStatus, Store

    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    cell = {"prompts_per_batch": 1, "group_size": G, "lr": 0.005, "seed": 3,
            "sample_budget": 4000, "batch_schedule": "adaptive", "sim": {"log_every": 1},
            "adaptive": {"batch_max": 8, "adapt_every": 256, "rule": "branch",
                         "branch_samples": 40}}
    with store.session() as s:
        r = Run(cell_id="c", name="r", backend="sim", config=cell)
        s.add(r)
        s.flush()
        rid = r.id
    store.set_status(rid, RunStatus.running)
    assert run_cell(store, rid, tmp_path / "w") == RunStatus.completed
    batch = store.load_metric([rid], "batch_samples")[rid]
    spent = store.load_metric([rid], "adaptive_branch_samples")[rid]
    nxt = store.load_metric([rid], "adaptive_next_prompts")[rid]
    at = dict(zip(spent.steps.tolist(), spent.values.tolist(), strict=True))
    chosen = dict(zip(nxt.steps.tolist(), nxt.values.tolist(), strict=True))
    steps, samples, b = batch.steps.tolist(), batch.samples.tolist(), batch.values.tolist()
    assert len(at) >= 2
    assert steps == list(range(1, len(steps) + 1))  # every step is a row, none skipped
    for i in range(len(steps) - 1):
        gap = samples[i + 1] - samples[i]
        charged = at[steps[i]] / 2 if steps[i] in at else 0.0
        assert gap == charged + b[i + 1], (steps[i], gap, charged, b[i + 1])
        if steps[i] in at:
            assert b[i + 1] == chosen[steps[i]] * G
    # branches of 40 samples rounded up to whole steps of 2B: 8 at 4 -> 8, 16 at 8 -> 16
    assert set(at.values()) <= {2 * 40.0, 2 * 48.0}
