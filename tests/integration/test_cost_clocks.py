"""The clocks in time and cost, on sweeps run by the sim backend (the theory model).

A known cost function (a fixed overhead per step plus a cost per sample) turns the sample clocks
into hours: the time-optimal batch the analysis finds is checked against a brute-force search
over the sweep's batches and against a dense simulation of the model; the throughput measured
from logged `time_*` metrics against a recomputation from the values written.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.integration.simsweep import B0, LR0, make_sweep
from twoclocks_cli.clocks import AnalysisOptions, analyze_sweep, make_schedule
from twoclocks_cli.clocks.cost import CostFile
from twoclocks_cli.store import Store
from twoclocks_cli.theory import ModelConfig
from twoclocks_cli.theory.closed_form import scaled_lr
from twoclocks_cli.theory.sweep import simulate_sweep

PROMPTS = [1, 2, 4, 8, 16, 32]  # batches 4..128 samples
BUDGET = 30_000
CAP = 0.05
SIM = {"log_every": 4, "eval_every": 1, "checkpoint_every": 2000, "cap": CAP}
TARGET = 0.9
OPTS = dict(target=str(TARGET), drift_threshold=ModelConfig().drift_threshold, theory=False,
            bootstrap=300)
# E(B) of the capped model grows like E_min (1 + B / ~35) (B_crit ~35: the samples objective
# takes B = 32); with a 0.2 s overhead per step and 0.03 s per sample, time-to-target
# (1 + B/35)(0.2/B + 0.03) is least near B = 16: inside the grid, and another pick
OVERHEAD, GEN, UPDATE, PRICE = 0.2, 0.01, 0.02, 3.0

pytestmark = pytest.mark.one_worker


def seconds_per_sample(b: float) -> float:
    """The test's own statement of the cost function (not the library's)."""
    return OVERHEAD / b + GEN + UPDATE


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("cost")
    st = Store.open(f"sqlite:///{root / 'store.db'}")
    make_sweep(st, "capped", PROMPTS, 2, BUDGET, SIM, root / "capped")
    yield st
    st.close()


@pytest.fixture(scope="module")
def costed(store):
    cost = CostFile(step_overhead_s=OVERHEAD, gen_s_per_sample=GEN, update_s_per_sample=UPDATE,
                    price_per_hour=PRICE)
    return analyze_sweep(store, "capped", AnalysisOptions(**OPTS), cost)


def test_time_optimal_batch_is_the_brute_force_one(costed):
    """B_crit in time = the batch of least median samples-to-target x seconds per sample,
    searched by brute force over the sweep's batches; `schedule --objective time` starts
    there, `--objective samples` is the schedule it always was."""
    a = costed
    times = {b.batch_samples: b.progress.median * seconds_per_sample(b.batch_samples)
             for b in a.batches if b.progress.median is not None}
    brute = min(times, key=times.get)
    assert a.time.source == "cost file"
    assert a.time.b_crit_time == brute
    assert a.time.b_crit_time_bound is None  # interior: the grid brackets it
    timed = make_schedule(a, objective="time")
    assert timed["objective"] == "time" and timed["b_small"] == brute
    plain, samples = make_schedule(a), make_schedule(a, objective="samples")
    assert samples == plain and plain["objective"] == "samples"
    assert plain["b_small"] != brute  # the two objectives disagree on this sweep
    # every objective's pick and what it costs in the others, against the chosen one
    lines = [x for x in timed["rationale"] if " would pick " in x]
    assert [x.split()[0] for x in lines] == ["samples", "time", "cost"]
    ratio = plain["objectives"]["samples"]["samples"] / timed["objectives"]["time"]["samples"]
    assert f"{ratio:.2f}x the samples" in lines[0]


def test_time_optimal_batch_matches_a_dense_simulation(costed):
    """The analysis, from 2 noisy seeds x 6 batches, lands within one grid step (2x) of the
    time-optimal batch of the model itself: a dense log grid of 21 batches x 16 seeds."""
    dense = np.geomspace(4, 128, 21)
    res = simulate_sweep(ModelConfig(), dense, scaled_lr(LR0, B0, dense, 0.5), 16, 4 * BUDGET,
                         TARGET, cap=CAP, seed=7, stop_at_target=True)
    bs, med = res.median_by_batch("n_prog")
    hours = med * np.array([seconds_per_sample(b) for b in bs])
    truth = float(bs[int(np.nanargmin(hours))])
    assert 8 < truth < 128  # interior, so the check is not one of the grid's ends
    assert abs(np.log2(costed.time.b_crit_time / truth)) <= 1, (costed.time.b_crit_time, truth)


def test_time_and_cost_clocks_carry_the_sample_intervals(costed):
    """Seconds = samples x seconds per sample, interval ends too; cost = hours x price; a
    censored failure clock stays a bound."""
    for b in costed.batches:
        tb = costed.time.at(b.batch_samples)
        sps = seconds_per_sample(b.batch_samples)
        assert tb.throughput.seconds_per_sample == pytest.approx(sps)
        for clock, spent in ((b.progress, tb.progress), (b.failure, tb.failure)):
            if clock.median is None:
                assert spent.seconds is None
                if clock.lower_bound is not None:
                    assert spent.lower_bound == pytest.approx(clock.lower_bound * sps)
                continue
            assert spent.seconds == pytest.approx(clock.median * sps)
            assert spent.cost == pytest.approx(clock.median * sps * PRICE / 3600)
            if clock.low is not None:
                assert spent.low == pytest.approx(clock.low * sps)
                assert spent.cost_low == pytest.approx(clock.low * sps * PRICE / 3600)
    doc = costed.to_json()["time"]
    assert doc["cost_file"]["step_overhead_s"] == OVERHEAD
    assert doc["b_crit_time"] == costed.time.b_crit_time


def _log_timings(store, sweep: str, rng) -> dict[float, list[np.ndarray]]:
    """time_* metrics at every logged step of each run, as a trainer logs them (one step's
    seconds each): generation growing with the batch, a fixed update overhead, noise, and a
    NaN now and then (that step is not counted). Returns the per-sample seconds expected per
    batch, computed here from the values written."""
    runs = store.list_runs(sweep)
    series = store.load_metric([r.id for r in runs], "reward_mean")
    expected: dict[float, list[np.ndarray]] = {}
    for r in runs:
        s = series[r.id]
        b = float(r.batch_samples)
        gen = 0.002 * b * (1 + 0.3 * rng.random(s.steps.size))
        reward = np.full(s.steps.size, 0.01)
        update = 0.5 + 0.001 * b * (1 + 0.3 * rng.random(s.steps.size))
        gen[::7] = np.nan
        with store.metric_writer(r.id) as w:
            for i, (step, samples) in enumerate(zip(s.steps, s.samples, strict=True)):
                w.log(int(step), int(samples), {"time_gen_s": float(gen[i]),
                                                "time_reward_s": float(reward[i]),
                                                "time_update_s": float(update[i])})
        total = gen + reward + update
        expected.setdefault(b, []).append(total[np.isfinite(total)] / b)
    return expected


def test_measured_throughput_is_the_median_of_the_logged_timings(tmp_path):
    """Throughput per batch from the runs' time_* metrics: the median seconds per sample over
    every logged step at that batch (independently recomputed here), an interval around it,
    and B_crit in time from those numbers."""
    st = Store.open(f"sqlite:///{tmp_path / 'store.db'}")
    make_sweep(st, "timed", [1, 4, 16], 2, 12_000, SIM, tmp_path / "w")
    expected = _log_timings(st, "timed", np.random.default_rng(3))
    a = analyze_sweep(st, "timed", AnalysisOptions(**OPTS))
    assert a.time.source == "measured" and a.time.price_per_hour is None
    for b in a.batches:
        tb = a.time.at(b.batch_samples)
        pooled = np.concatenate(expected[b.batch_samples])
        assert tb.throughput.steps == pooled.size
        assert tb.throughput.seconds_per_sample == pytest.approx(float(np.median(pooled)))
        assert tb.throughput.low <= tb.throughput.seconds_per_sample <= tb.throughput.high
        if b.progress.median is not None:
            assert tb.progress.seconds == pytest.approx(
                b.progress.median * float(np.median(pooled)))
    times = {b.batch_samples: a.time.at(b.batch_samples).progress.seconds for b in a.batches
             if b.progress.median is not None}
    assert a.time.b_crit_time == min(times, key=times.get)
    # a price-only cost file prices the measured throughput; the cost objective then runs
    priced = analyze_sweep(st, "timed", AnalysisOptions(**OPTS), CostFile(price_per_hour=2.0))
    assert priced.time.source == "measured" and priced.time.price_per_hour == 2.0
    plan = make_schedule(priced, objective="cost")
    assert plan["objective"] == "cost"
    assert plan["b_small"] == min(times, key=times.get)  # a constant price: time's pick
    st.close()
