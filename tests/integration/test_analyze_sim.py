"""The analysis against the theory model's ground truth, on sweeps run by the sim backend.

Sweeps: sqrt lr scaling, batches 4..64 samples (16x), 3 seeds, 30k samples each. `capped` has a
per-step displacement cap of 0.05 (sim.cap), `free` none. Model defaults otherwise.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.integration.simsweep import B0, LR0, G, make_sweep
from twoclocks_cli.clocks import AnalysisOptions, analyze_sweep, make_schedule
from twoclocks_cli.store import Store
from twoclocks_cli.theory import ModelConfig, predict_critical_batch

PROMPTS = [1, 2, 4, 8, 16]
BUDGET = 30_000
SIM = {"log_every": 4, "eval_every": 1, "checkpoint_every": 2000}
CAP = 0.05
TARGET = 0.9
OPTS = dict(
    target=str(TARGET), drift_threshold=ModelConfig().drift_threshold, theory=False, bootstrap=300
)

pytestmark = [pytest.mark.one_worker, pytest.mark.slow]


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    root = tmp_path_factory.mktemp("simsweeps")
    store = Store.open(f"sqlite:///{root / 'store.db'}")
    make_sweep(store, "free", PROMPTS, 3, BUDGET, SIM, root / "free")
    make_sweep(store, "capped", PROMPTS, 3, BUDGET, {**SIM, "cap": CAP}, root / "capped")
    yield store, root
    store.close()


def _by_batch(result, key):
    return {b["batch_samples"]: b[key]["median"] for b in result["batches"]}


def test_fitted_critical_batch_matches_dense_simulation_truth(sweeps):
    """Truth = McCandlish's B_crit = E_min / S_min of the model, from dense simulation.

    E_min: median samples-to-target (noise-free progress p = 1 - L/L0 reaching 0.9) over 32 seeds
    at B = 1 (the small-batch limit); S_min: steps-to-target at B = 1e10 (noise gone, the cap
    binding every step: the large-batch limit). Both under the sweep's own sqrt rule and cap.
    The analysis sees only the stored, noisy binomial reward curves of 3 seeds x 5 batches.
    """
    store, _ = sweeps
    result = analyze_sweep(store, "capped", AnalysisOptions(**OPTS)).to_json()
    fit = result["critical_batch"]["mccandlish"]
    truth = predict_critical_batch(ModelConfig(), LR0, B0, TARGET, 0.5, CAP, seeds=32)
    assert truth["mechanism"].startswith("step cap")
    assert fit["b_crit"] is not None
    assert abs(fit["b_crit"] / truth["b_crit"] - 1) <= 0.20, (fit, truth)


def test_failure_clock_is_invariant_without_cap(sweeps):
    store, _ = sweeps
    result = analyze_sweep(store, "free", AnalysisOptions(**OPTS)).to_json()
    inv = result["failure_invariance"]
    assert inv["n"] == 15, inv  # every run failed within the budget
    assert abs(inv["slope"]) < 0.15, inv
    rules = {r["failure"]["rule"] for r in result["runs"]}
    assert rules == {"drift"}


def test_cap_delays_failure_of_the_largest_batch(sweeps):
    store, _ = sweeps
    result = analyze_sweep(store, "capped", AnalysisOptions(**OPTS)).to_json()
    fail = _by_batch(result, "failure")
    small, large = fail[min(fail)], fail[max(fail)]
    assert small is not None and large is not None, fail
    assert large >= 1.3 * small, fail


def test_drop_rule_alone_sees_the_collapse(sweeps):
    store, _ = sweeps
    opts = {**OPTS, "drift_threshold": None}
    result = analyze_sweep(store, "free", AnalysisOptions(**opts)).to_json()
    drift = analyze_sweep(store, "free", AnalysisOptions(**OPTS)).to_json()
    for r, d in zip(result["runs"], drift["runs"], strict=True):
        assert r["failure"]["rule"] == "drop"
        assert d["failure"]["samples"] < r["failure"]["samples"] < d["failure"]["samples"] + 4000


def test_schedule_beats_largest_batch_and_fails_no_earlier_than_smallest(sweeps):
    store, root = sweeps
    capped = analyze_sweep(store, "capped", AnalysisOptions(**OPTS))
    analysis = capped.to_json()
    plan = make_schedule(capped, budget=BUDGET)
    assert len(plan["phases"]) == 2 and plan["b_large"] > plan["b_small"], plan
    phases = [dict(p) for p in plan["phases"]]
    make_sweep(
        store,
        "scheduled",
        [phases[0]["prompts_per_batch"]],
        3,
        BUDGET,
        {**SIM, "cap": CAP},
        root / "scheduled",
        phases=phases,
    )
    sched = analyze_sweep(store, "scheduled", AnalysisOptions(**OPTS)).to_json()
    prog = _by_batch(analysis, "progress")
    fail = _by_batch(analysis, "failure")
    s_prog = sched["batches"][0]["progress"]["median"]
    s_fail = sched["batches"][0]["failure"]["median"]
    assert s_prog is not None and s_prog < prog[max(prog)], (s_prog, prog)
    assert s_fail is None or s_fail >= fail[min(fail)], (s_fail, fail)
    # the runs really switched batch at until_samples
    b = store.load_metric([r.id for r in store.list_runs("scheduled")], "batch_samples")
    series = next(iter(b.values()))
    assert set(np.unique(series.values)) == {
        phases[0]["prompts_per_batch"] * G,
        phases[1]["prompts_per_batch"] * G,
    }


def test_recommended_b_crit_of_the_free_sweep_matches_the_theory(sweeps):
    """Without a cap (Adam, sign-like past the noise scale) E(B) is not linear in B: the
    recommended model-free estimate, read off the stored noisy eval curves, is within 25% of
    the dense simulation's E(B_crit) = 2 E_min; the linear McCandlish fit is reported beside."""
    store, _ = sweeps
    result = analyze_sweep(store, "free", AnalysisOptions(**OPTS)).to_json()
    rec = result["critical_batch"]["recommended"]
    truth = predict_critical_batch(ModelConfig(), LR0, B0, TARGET, 0.5, None, seeds=64)
    assert rec["source"] == "empirical" and rec["bound"] is None, rec
    assert abs(rec["b_crit"] / truth["b_crit"] - 1) <= 0.25, (rec, truth["b_crit"])
    assert rec["low"] <= truth["b_crit"] <= (rec["high"] or float("inf")), (rec, truth)


@pytest.mark.parametrize("sweep", ["free", "capped"])
def test_the_schedule_is_the_brute_force_optimum_on_the_theory_model(sweeps, sweep):
    """On the theory model's own clocks, the recommended plan is what a brute-force search over
    (B_small, switch point, B_large) picks by the documented rule."""
    from tests.support.plans import brute_force
    from twoclocks_cli.clocks import plan as planner
    from twoclocks_cli.clocks.schedule import _grid, batch_clocks

    store, _ = sweeps
    a = analyze_sweep(store, sweep, AnalysisOptions(**OPTS))
    plan = make_schedule(a, budget=BUDGET)
    by, _, reached = _grid(a)
    clocks = batch_clocks(a, by, reached, None)
    least, small, mine, key = brute_force(clocks, 0.8, BUDGET, "samples", False)
    assert plan["b_small"] == small
    assert plan["objectives"]["samples"]["samples"] == pytest.approx(least, rel=0.005)
    top = [p for p in mine if p[key] <= least * 1.005]
    latest = max(p[3] for p in top)
    one = [p for p in top if p[2] is None and p[3] * (1 + planner.TOL) >= latest]
    end = plan["phases"][-1]["until_samples"]
    if one:  # a switch must buy more than TOL of training
        assert len(plan["phases"]) == 1 and end == round(one[0][3])
    else:
        assert len(plan["phases"]) == 2 and end >= latest * 0.99 - 1


@pytest.mark.parametrize("sweep", ["free", "capped"])
def test_the_schedule_stops_before_the_drift_threshold_it_predicts(sweeps, sweep):
    """The theory model collapses where the drift crosses its threshold (the truth, read by the
    drift rule at that very threshold). Trained as `schedule-config` trains it, to where its last
    phase ends, the schedule's runs on 20 fresh seeds do not collapse (the end rests on a
    per-run lower bound of the failure clock, not on the median's); a one-phase schedule run on
    to the budget does (the schedule stops for a reason)."""
    store, root = sweeps
    plan = make_schedule(analyze_sweep(store, sweep, AnalysisOptions(**OPTS)), budget=BUDGET)
    phases = [dict(p) for p in plan["phases"]]
    end = phases[-1]["until_samples"]
    assert plan["stop_before_samples"] is not None and end == round(plan["stop_before_samples"])
    assert end < BUDGET
    sim = {**SIM, "cap": CAP} if sweep == "capped" else SIM
    first = phases[0]["prompts_per_batch"]
    name = f"stopped-{sweep}"
    make_sweep(store, name, [first], 20, end, sim, root / name, phases=phases, seed0=100)
    stopped = analyze_sweep(store, name, AnalysisOptions(**OPTS))
    assert sum(r.failure.samples is not None for r in stopped.runs) == 0, plan["rationale"]
    if len(phases) > 1:
        return  # the large phase's bound is conservative: its runs go on past the budget
    name = f"overrun-{sweep}"
    make_sweep(store, name, [first], 8, BUDGET, sim, root / name, phases=phases, seed0=100)
    overrun = analyze_sweep(store, name, AnalysisOptions(**OPTS))
    assert sum(r.failure.samples is not None for r in overrun.runs) >= 6
