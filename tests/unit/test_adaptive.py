"""The adaptive controller alone: decisions against hand computation, exact state round trip,
one-line config errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from trainer.adaptive.config import AdaptiveConfig
from twoclocks_cli.adaptive.controller import Controller, calibration_of, schedule_of
from twoclocks_cli.clocks.result import Analysis
from twoclocks_cli.core.errors import ConfigError

G = 4


def _signals(b_noise: float, drift: float, batch: int) -> dict:
    """Exact two-batch terms of a gradient with |G|^2 = 1 and tr(S) = b_noise (no sampling)."""
    b = batch // 4
    return {"grad_sq_micro": 1 + b_noise / b, "grad_sq_full": 1 + b_noise / batch,
            "grad_micro_size": b, "grad_full_size": batch, "drift_rel": drift}


def _ctl(**kw) -> Controller:
    cfg = AdaptiveConfig(**{"batch_max": 64, "adapt_every": 100, **kw})
    return Controller(cfg, G, run_prompts=4, run_lr=0.01)


def _first_decisions(ctl: Controller, n: int, drift) -> list:
    """Step `ctl` at its own batch, with B_noise 4 and drift_rel = drift(samples), until it has
    taken `n` decisions."""
    out, samples, step = [], 0, 0
    while len(out) < n:
        step += 1
        samples += ctl.batch
        d = ctl.observe(step, samples, _signals(4.0, drift(samples), ctl.batch))
        if d is not None:
            out.append(d)
    return out


def test_progress_phase_follows_kappa_times_the_noise_scale_within_the_change_bound():
    ctl = _ctl(kappa=0.5, noise_ema=1.0, batch_min=2, max_change=2.0)
    assert ctl.prompts == 2 and ctl.lr == pytest.approx(0.01 * math.sqrt(2 / 4))
    # B_noise 400 samples -> 0.5 x 400 / 4 = 50 prompts, but x2 per decision: 2 -> 4 -> 8
    seen, samples, step = [], 0, 0
    while len(seen) < 3:
        step += 1
        samples += ctl.batch
        d = ctl.observe(step, samples, _signals(400.0, 0.0, ctl.batch))
        if d is not None:
            seen.append(d)
    assert [d.prompts for d in seen] == [4, 8, 16]
    assert seen[0].signals["b_noise"] == pytest.approx(400.0)
    assert "0.5 x B_noise 400 = 200 samples = 50 prompts" in seen[0].reason
    assert seen[-1].lr == pytest.approx(0.01 * math.sqrt(16 / 4))
    # a small noise scale brings it down (B_noise 24 -> 0.5 x 24 / 4 = 3 prompts; 16/2 = 8 first)
    d = None
    while d is None:
        step += 1
        samples += ctl.batch
        d = ctl.observe(step, samples, _signals(24.0, 0.0, ctl.batch))
    assert d.prompts == 8


def test_the_guard_fires_on_the_projected_drift_and_holds_batch_max():
    ctl = _ctl(kappa=0.01, noise_ema=1.0, drift_threshold=1.0, safety=0.8, lookahead=100)
    # drift^2 grows 0.0025 per sample: from 0 at sample 0, 0.5 at 100 (0.25 = d^2 at 100 samples)
    out = _first_decisions(ctl, 3, lambda samples: math.sqrt(0.0025 * samples))
    # first decision at 100: d^2 = 0.25, rate 0.0025 -> sqrt(0.25 + 0.25) = 0.707 < 0.8
    assert out[0].mode == "progress" and out[0].signals["drift_projected"] == pytest.approx(
        math.sqrt(0.5), rel=1e-6)
    # at 200: sqrt(0.5 + 0.25) = 0.866 >= 0.8: batch_max, and kept whatever the noise says
    assert out[1].mode == "guard" and out[1].prompts == 64 and "failure guard" in out[1].reason
    assert out[2].mode == "guard" and out[2].prompts == 64


@pytest.mark.parametrize("warmup", [0, 1, 2])
def test_the_guard_does_not_fire_during_its_warm_up(warmup):
    """A drift already past the limit at the first decision: the guard fires at decision
    warmup + 1, the decisions before it stay in the progress phase and say why."""
    ctl = _ctl(kappa=0.01, noise_ema=1.0, drift_threshold=1.0, lookahead=100,
               guard_warmup=warmup)
    out = _first_decisions(ctl, 3, lambda samples: 0.9 + 1e-4 * samples)
    assert [d.mode for d in out] == ["progress"] * warmup + ["guard"] * (3 - warmup)
    assert all("guard warm-up" in d.reason for d in out[:warmup])
    assert out[warmup].prompts == 64


def test_rule_guard_holds_the_start_below_b_crit_and_the_guard_keeps_its_lr():
    """start b_crit: 4 x 2^k prompts x G=4 samples at most B_crit 70 -> 16 prompts (64 samples;
    32 prompts would be 128). The batch holds until the guard (same drift as the guard test:
    fires at the second decision), which jumps to batch_max at the starting batch's lr."""
    cfg = AdaptiveConfig(batch_min=4, batch_max=64, adapt_every=100, rule="guard",
                         start="b_crit", grow_lr="hold", from_sweep="s", drift_threshold=1.0,
                         safety=0.8, lookahead=100)
    ctl = Controller(cfg, G, run_prompts=4, run_lr=0.01, calibration={"b_crit": 70.0})
    lr16 = 0.01 * math.sqrt(16 / 4)
    assert ctl.prompts == 16 and ctl.lr == pytest.approx(lr16)
    out = _first_decisions(ctl, 3, lambda samples: math.sqrt(0.0025 * samples))
    assert out[0].prompts == 16 and "rule guard: the batch holds" in out[0].reason
    assert out[0].signals["sweep_b_crit"] == 70.0 and "sweep_b_crit" not in out[1].signals
    assert [d.prompts for d in out[1:]] == [64, 64] and out[1].mode == "guard"
    assert [d.lr for d in out] == pytest.approx([lr16] * 3)
    # under the scaling rule the same jump takes lr(64) = 0.01 x sqrt(64 / 4)
    scaled = Controller(cfg.model_copy(update={"grow_lr": "scaled"}), G, 4, 0.01,
                        calibration={"b_crit": 70.0})
    assert scaled.lr_at(64) == pytest.approx(0.04) and ctl.lr_at(64) == pytest.approx(lr16)
    assert ctl.lr_at(8) == pytest.approx(0.01 * math.sqrt(8 / 4))  # below the start: the rule


def test_the_trajectory_reads_a_guard_decision_as_the_sweeps_b_crit():
    """The report's local B_crit at a guard-rule decision is the sweep's, logged with it; at a
    decision of the failure guard there is none (and it says why)."""
    from twoclocks_cli.adaptive.trajectory import _local

    cols = {"adaptive_branch_gain_ratio": {}, "adaptive_sweep_b_crit": {4: 966.0}}
    assert _local(cols, 4, 512.0, "guard") == (966.0, "the sweep's B_crit (rule guard holds "
                                                      "the batch below it)")
    est, why = _local(cols, 8, 2048.0, "guard")
    assert est is None and "no estimate" in why


def test_start_best_starts_at_the_sweeps_fastest_batch_not_its_b_crit():
    cfg = AdaptiveConfig(batch_min=4, batch_max=64, start="best", from_sweep="s")
    ctl = Controller(cfg, G, run_prompts=4, run_lr=0.01,
                     calibration={"best_batch": 32.0, "b_crit": 1e9})
    assert ctl.prompts == 8 and ctl.state.start_prompts == 8  # 8 prompts x G = 32 samples


@pytest.mark.parametrize("b_crit, prompts", [(None, 4), (10.0, 4), (16.0, 4), (32.0, 8),
                                              (1e9, 64)])
def test_start_b_crit_is_the_largest_doubling_at_or_below_it(b_crit, prompts):
    from twoclocks_cli.adaptive.controller import start_batch

    cfg = AdaptiveConfig(batch_min=4, batch_max=64, start="b_crit", from_sweep="s")
    assert start_batch(cfg, G, b_crit) == prompts


def test_state_round_trip_gives_the_same_decisions():
    rng = np.random.default_rng(0)
    stream = [(float(rng.uniform(10, 500)), float(i) * 1e-3) for i in range(400)]

    def run(split=None):
        ctl = _ctl(kappa=0.3, drift_threshold=5.0)
        out, samples = [], 0
        for i, (bn, dr) in enumerate(stream):
            if split is not None and i == split:  # checkpoint and restore (through JSON)
                ctl = Controller(ctl.cfg, G, 4, 0.01, state=json.loads(json.dumps(ctl.to_dict())))
            samples += ctl.batch
            d = ctl.observe(i + 1, samples, _signals(bn, dr, ctl.batch))
            out.append((ctl.prompts, ctl.lr, None if d is None else d.reason))
        return out

    assert run() == run(split=137)


@pytest.mark.parametrize("table, needle", [
    ({"batch_max": 8, "kapa": 1}, "adaptive.kapa"),
    ({"batch_max": 0}, "adaptive.batch_max = 0"),
    ({"batch_max": 4, "batch_min": 8}, "batch_min (8) > batch_max (4)"),
    ({"batch_max": 8, "noise": "l2"}, "adaptive.noise = 'l2'"),
    ({"batch_max": 8, "guard_warmup": -1}, "adaptive.guard_warmup = -1"),
    ({"batch_max": 8, "rule": "probe"}, "adaptive.rule = 'probe'"),
    ({"batch_max": 8, "rule": "branch", "grow_ratio": 0}, "adaptive.grow_ratio = 0"),
    ({"batch_max": 8, "rule": "branch", "branch_samples": 0}, "adaptive.branch_samples = 0"),
    ({"batch_max": 8, "start": "b_crit"}, "start = \"b_crit\" needs from_sweep"),
    ({"batch_max": 8, "grow_lr": "sqrt"}, "adaptive.grow_lr = 'sqrt'"),
    ({}, "adaptive.batch_max"),
])
def test_config_errors_are_one_line(table, needle):
    with pytest.raises(ConfigError) as err:
        schedule_of({"batch_schedule": "adaptive", "adaptive": table})
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_schedule_keys():
    assert schedule_of({"prompts_per_batch": 2}) is None
    with pytest.raises(ConfigError, match="batch_schedule = 'ramp'"):
        schedule_of({"batch_schedule": "ramp"})
    with pytest.raises(ConfigError, match="both set"):
        schedule_of({"batch_schedule": "adaptive", "adaptive": {"batch_max": 2},
                     "phases": [{"prompts_per_batch": 1}]})


def test_calibration_reads_the_analysis():
    result = {"critical_batch": {"recommended": {"b_crit": 30.0},
                                 "noise_scale": {"value": 120.0}},
              "runs": [{"run_id": 1, "failure": {"samples": 50}},
                       {"run_id": 2, "failure": {"samples": None}},
                       {"run_id": 3, "failure": {"samples": 20}}]}
    drifts = {1: ([10, 50, 60], [0.1, 1.3, 1.4]), 3: ([10, 20], [0.2, 1.2])}
    cal = calibration_of(Analysis.from_json(result), AdaptiveConfig(batch_max=4, from_sweep="s"),
                         drifts.get)
    assert cal["kappa"] == pytest.approx(0.25) and cal["drift_threshold"] == pytest.approx(1.2)
    assert cal["best_batch"] is None  # no batches in this analysis


def test_calibration_names_the_batch_fastest_to_the_target():
    """best_batch: the batch with the smallest median progress clock; a batch whose median
    seed never reached the target (median None) is not a candidate."""
    agg = {"n": 2, "n_censored": 0, "low": None, "high": None, "lower_bound": None, "note": ""}
    batches = [{"batch_samples": b, "progress": {**agg, "median": m}}
               for b, m in ((128.0, 9170.0), (512.0, 5260.0), (2048.0, None))]
    cal = calibration_of(Analysis.from_json({"batches": batches, "runs": []}),
                         AdaptiveConfig(batch_max=4, from_sweep="s"), {}.get)
    assert cal["best_batch"] == 512.0


def test_calibration_takes_the_noise_scale_of_the_smallest_batch():
    """kappa divides by the median noise scale of the smallest batch's runs (their EMA has
    forgotten the start of training), not the analysis's median over every run."""
    runs = [{"run_id": i, "batch_samples": b, "noise_scale": v, "failure": {"samples": None}}
            for i, (b, v) in enumerate([(8, 300.0), (8, 200.0), (8, math.nan), (4, None),
                                        (64, 50.0), (64, 60.0), (16, 100.0)])]
    result = {"critical_batch": {"recommended": {"b_crit": 50.0},
                                 "noise_scale": {"value": 80.0}}, "runs": runs}
    cal = calibration_of(Analysis.from_json(result), AdaptiveConfig(batch_max=4, from_sweep="s"),
                         {}.get)
    assert cal["kappa"] == pytest.approx(50.0 / 250.0)
    assert "2 runs at the smallest batch (8 samples)" in cal["kappa_why"]
    assert "drift_threshold" not in cal and "no guard" in cal["drift_why"]


@pytest.mark.parametrize("rule", ["noise", "branch"])
def test_a_sim_adaptive_run_resumes_exactly_after_a_crash(tmp_path, monkeypatch, rule):
    """The real sim backend and store: a run stopped mid-way (an exception out of the writer at
    its first step from 300, after the checkpoint at 250) and rerun gives every row and
    decision event of an uninterrupted run (with rule "branch", its branches too)."""
    import sqlalchemy as sa

    from twoclocks_cli.backends import run_cell
    from twoclocks_cli.store import Run, RunStatus, Store

    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    cell = {"prompts_per_batch": 1, "group_size": 4, "lr": 0.005, "seed": 1,
            "sample_budget": 3000, "batch_schedule": "adaptive",
            "sim": {"checkpoint_every": 50, "flat_dims": 32},
            "adaptive": {"batch_max": 8, "adapt_every": 200, "kappa": 0.3,
                         "drift_threshold": 0.9, "lookahead": 200, "rule": rule,
                         "branch_samples": 32}}
    ids = []
    with store.session() as s:
        for i in range(2):
            r = Run(cell_id=f"c{i}", name=f"r{i}", backend="sim", config=cell)
            s.add(r)
            s.flush()
            ids.append(r.id)
    for rid in ids:
        store.set_status(rid, RunStatus.running)
    run_cell(store, ids[0], tmp_path / "a")

    from twoclocks_cli.store.writer import MetricWriter

    real = MetricWriter.log

    def crash(self, step, samples, values):
        if step >= 300:  # a branch's steps are not logged: the first logged step from 300
            raise RuntimeError("crash")
        real(self, step, samples, values)

    with monkeypatch.context() as m:  # a crash at step 300, between checkpoints
        m.setattr(MetricWriter, "log", crash)
        with pytest.raises(RuntimeError):
            run_cell(store, ids[1], tmp_path / "b")
    assert (store.max_step(ids[1]) or 0) < 300
    run_cell(store, ids[1], tmp_path / "b")

    def rows(rid):
        with store.engine.connect() as c:
            return {(s, k): (n, v) for s, k, n, v in c.execute(sa.text(
                "SELECT step, key, samples, value FROM metrics WHERE run_id = :r"), {"r": rid})}

    a, b = rows(ids[0]), rows(ids[1])
    assert a == b and len({v for (s, k), (n, v) in a.items() if k == "batch_samples"}) > 1
    ev = [[e.message for e in store.events(rid) if (e.message or "").startswith("adaptive")]
          for rid in ids]
    assert ev[0] == ev[1]
    # one per decision; the branch rule backs off while the batch holds
    assert len(ev[0]) >= (3000 // 200 - 2 if rule == "noise" else 5)
    if rule == "branch":
        assert any("branches 1 and 2 prompts" in e for e in ev[0]), ev[0]


def test_the_tiny_adaptive_example_is_a_valid_train_config():
    from pathlib import Path

    from trainer.config import load_config

    path = Path(__file__).resolve().parents[2] / "examples" / "tiny-arith-adaptive.toml"
    cfg = load_config(path)
    assert cfg.batch_schedule == "adaptive" and cfg.adaptive.batch_max == 256
    with pytest.raises(ConfigError, match="noise = 'sign'"):
        from trainer.config import TrainConfig

        TrainConfig.from_dict({**cfg.model_dump(mode="json"),
                               "adaptive": {**cfg.adaptive.model_dump(), "noise": "sign"}})


def test_the_noise_rule_refuses_a_run_without_noise_terms():
    from pathlib import Path

    from trainer.config import TrainConfig, load_config

    path = Path(__file__).resolve().parents[2] / "examples" / "tiny-arith-adaptive.toml"
    cfg = load_config(path).model_dump(mode="json")
    cfg["adaptive"]["rule"] = "noise"
    with pytest.raises(ConfigError, match="noise_every must be at least 1") as info:
        TrainConfig.from_dict({**cfg, "noise_every": 0})
    assert "\n" not in str(info.value)
    assert TrainConfig.from_dict({**cfg, "noise_every": 3}).noise_every == 3  # sparser is fine
    # the branch rule reads no noise terms: a run with it may skip them
    branch = {**cfg, "noise_every": 0, "adaptive": {**cfg["adaptive"], "rule": "branch"}}
    assert TrainConfig.from_dict(branch).adaptive.rule == "branch"
