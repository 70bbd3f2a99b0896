"""The schedule rule against known truths: E_min and B_crit on U-shaped, monotone and flat E(B),
B_small under the samples objective, the whole plan against a brute-force search, failure
bounds by hand, and rationale lines whose numbers agree with the numbers printed beside them."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy.stats import t as student_t

from tests.support.plans import brute_force
from twoclocks_cli.clocks import plan as planner
from twoclocks_cli.clocks.options import AnalysisOptions
from twoclocks_cli.clocks.perbatch import batch_rows, critical_estimates, progress_by_batch
from twoclocks_cli.clocks.result import Analysis, Invariance, RunRow, Target
from twoclocks_cli.clocks.runclock import Clock
from twoclocks_cli.clocks.schedule import make_schedule

BUDGET = 40_000.0
SEEDS = (0.97, 0.99, 1.01, 1.03)  # per-seed factors: medians are the truth


def _row(i, batch, progress, failure):
    """A run at `batch` samples (G = 8) with the given clocks (None: censored at the budget)."""
    def clock(x):
        return Clock(x, x is None, censored_at=BUDGET if x is None else None)

    return RunRow(run_id=i, batch_samples=batch, batch_prompts=int(batch // 8), group_size=8,
                  lr=1e-4 * (batch / 128) ** 0.5, clip_low=0.2, clip_high=0.2, seed=i,
                  status="completed", points=40, first_samples=batch, last_samples=BUDGET,
                  progress=clock(progress), failure=clock(failure))


def _analysis(truth: dict[float, tuple[float | None, float | None]], factors=SEEDS) -> Analysis:
    """An analysis of runs whose clocks are `truth` {batch: (progress, failure)} times each
    seed's factor, its B_crit estimated as `analyze` estimates it."""
    rows, i = [], 0
    for b, (prog, fail) in truth.items():
        for f in factors:
            rows.append(_row(i, b, None if prog is None else prog * f,
                             None if fail is None else fail * f))
            i += 1
    opts = AnalysisOptions(bootstrap=200)
    rng = np.random.default_rng(0)
    batches = batch_rows(rows, rng, opts)
    crit = critical_estimates(progress_by_batch(rows, batches), rows, None, rng, 200)
    return Analysis(sweep="s", metric="eval_accuracy", target=Target("frac:0.5", 0.5), runs=rows,
                    batches=batches, critical=crit, invariance=Invariance(), options=opts)


def _u(b):
    """A U-shaped E(B): 3,000 (512/B + B/512), least at 512 (6,000); 2 E_min at B = 1,911."""
    return 3000 * (512 / b + b / 512)


U_TRUTH = 512 * (2 + math.sqrt(3))  # 1/x + x = 4


@pytest.mark.parametrize("grid", [[128, 512, 2048], [128, 256, 512, 1024, 2048]])
def test_a_u_shaped_e_takes_e_min_at_its_measured_minimum(grid):
    a = _analysis({b: (_u(b), None) for b in grid})
    rec = a.critical.recommended
    assert rec.e_min_at == 512 and rec.slower == [b for b in grid if b < 512]
    assert rec.e_min == pytest.approx(_u(512), rel=0.01)
    assert rec.bound is None and abs(rec.b_crit / U_TRUTH - 1) < 0.10, rec
    plan = make_schedule(a)
    assert plan["b_small"] == 512, plan["rationale"]
    assert any("slower under this lr rule" in line for line in plan["rationale"])


def test_a_monotone_e_extrapolates_e_min_below_the_grid_near_the_truth():
    """McCandlish's E = E_min (1 + B / B_crit), E_min = 4,000, B_crit = 600, grid 128-2,048:
    E_min lies below the grid; the point estimate of E_min and B_crit within 10% and 20%."""
    grid = [128, 256, 512, 1024, 2048]
    a = _analysis({b: (4000 * (1 + b / 600), None) for b in grid})
    rec = a.critical.recommended
    assert rec.e_min_at is None and rec.slower == []
    assert abs(rec.e_min / 4000 - 1) < 0.10, rec
    assert abs(rec.b_crit / 600 - 1) < 0.20, rec
    assert make_schedule(a)["b_small"] == 128  # 256 takes 1.18x the samples


def test_a_flat_e_is_a_lower_bound_and_takes_the_largest_batch():
    grid = [128, 512, 2048]
    a = _analysis({b: (5000 * (1 + 0.02 * k), None) for k, b in enumerate(grid)})
    rec = a.critical.recommended
    assert rec.bound == "lower" and rec.b_crit == 2048
    plan = make_schedule(a)
    assert plan["b_small"] == 2048 and len(plan["phases"]) == 1
    assert any("within 10% of the fewest samples" in line for line in plan["rationale"])


def _printed_clocks(rationale: list[str]) -> dict[float, float]:
    line = next(x for x in rationale if x.startswith("median samples to the target: "))
    pairs = line.split(": ", 1)[1].split("; ")
    return {float(b): float(v.replace(",", "")) for b, v in (p.split(": ") for p in pairs)}


def _num(text: str) -> float:
    return float(text.replace(",", ""))


@pytest.mark.parametrize("truth", [
    {b: (_u(b), None) for b in (128, 512, 2048)},
    {b: (4000 * (1 + b / 600), None) for b in (128, 256, 512, 1024, 2048)},
    {b: (5000 * (1 + 0.02 * k), None) for k, b in enumerate((128, 512, 2048))},
    {128: (9000, 14_000), 512: (5300, 16_000), 2048: (30_000, None)},
])
def test_the_b_small_line_agrees_with_the_clocks_printed_beside_it(truth):
    plan = make_schedule(_analysis(truth))
    printed = _printed_clocks(plan["rationale"])
    assert printed[plan["b_small"]] == pytest.approx(plan["objectives"]["samples"]["samples"],
                                                     abs=0.5)
    line = next(x for x in plan["rationale"] if x.startswith("B_small = "))
    b = float(re.match(r"B_small = ([\d.]+):", line).group(1))
    assert b == plan["b_small"]
    fewest = min(printed.values())
    m = re.search(r"the fewest samples to the target \(([\d,]+) samples", line)
    if m:
        assert _num(m.group(1)) == round(printed[b]) == round(fewest)
        return
    m = re.search(r": ([\d,]+) samples to the target, within 10% of the fewest samples "
                  r"\(([\d,]+) samples at B=([\d.]+), ([\d.]+)x\)", line)
    assert m, line
    mine, least, at, ratio = _num(m.group(1)), _num(m.group(2)), float(m.group(3)), \
        float(m.group(4))
    assert mine == round(printed[b]) and least == round(printed[at]) == round(fewest)
    assert printed[b] <= 1.1 * fewest and b > at
    assert ratio == pytest.approx(printed[b] / fewest, abs=0.005)


def test_the_failure_bound_of_a_single_run_by_hand():
    f = [10_000.0, 12_000.0, 14_000.0]
    spread, dof = planner.pooled_log_spread({64: f})
    lf = np.log(f)
    assert dof == 2 and spread == pytest.approx(np.std(lf, ddof=1))
    bound, how, one = planner.failure_bound(f, spread, dof)
    want = math.exp(lf.mean() - student_t.ppf(0.95, 2) * spread * math.sqrt(4 / 3))
    assert bound == pytest.approx(want) and not one and "per-run lower bound" in how
    # one failed seed and no spread to borrow: that seed's clock, stricter safety
    assert planner.failure_bound([9000.0], None, 0) == (9000.0, pytest.approx(
        "the one failed seed's clock 9,000"), True)


def test_a_switch_by_hand_to_the_latest_failing_larger_batch():
    """B_small = 32 (1,050 samples, within 10% of 16's 1,000); 128 fails latest. The switch comes
    once 32's median run reached the target (1,050), and the last phase ends where the failure
    fraction reaches 0.8: 1,050 / F(32) + (end - 1,050) / F(128) = 0.8, F the per-run bounds."""
    truth = {16: (1000, 20e3), 32: (1050, 21e3), 64: (1500, 26e3), 128: (2500, 30e3)}
    a = _analysis(truth)
    plan = make_schedule(a)
    spread = float(np.std(np.log(SEEDS), ddof=1))  # the same in every batch: pooled, 12 dof

    def bound(f, dof=12):
        return f * math.exp(np.log(SEEDS).mean()
                            - student_t.ppf(0.95, dof) * spread * math.sqrt(1 + 1 / 4))

    f32, f128 = bound(21e3), bound(30e3)
    assert plan["b_small"] == 32 and plan["b_large"] == 128
    assert plan["n_switch"] == 1050
    end = 1050 + (0.8 - 1050 / f32) * f128
    assert plan["phases"][1]["until_samples"] == round(end) == plan["stop_before_samples"]
    assert plan["predicted"]["failure_samples"] == pytest.approx(1050 + (1 - 1050 / 21e3) * 30e3)
    # larger batches fail earlier: one phase, ended at 0.8 x its own per-run bound
    b = _analysis({16: (1000, 30e3), 32: (1050, 20e3), 64: (1500, 10e3)})
    plan = make_schedule(b)
    assert len(plan["phases"]) == 1 and plan["n_switch"] is None
    assert plan["phases"][0]["until_samples"] == round(0.8 * bound(20e3, dof=9))
    # no seed failed: one phase to the budget, no stop
    c = _analysis({16: (1000, None), 32: (1050, None)})
    plan = make_schedule(c)
    assert len(plan["phases"]) == 1 and plan["stop_before_samples"] is None
    assert plan["phases"][0]["until_samples"] == BUDGET


def test_hold_switches_after_the_target_at_the_small_phases_lr():
    truth = {16: (1000, 20e3), 32: (1050, 21e3), 64: (1500, 26e3), 128: (2500, 30e3)}
    a = _analysis(truth)
    swept, held = make_schedule(a), make_schedule(a, large_lr="hold")
    lr = {b: 1e-4 * (b / 128) ** 0.5 for b in truth}
    assert [p["lr"] for p in swept["phases"]] == [pytest.approx(lr[32]), pytest.approx(lr[128])]
    assert [p["lr"] for p in held["phases"]] == [pytest.approx(lr[32]), pytest.approx(lr[32])]
    assert held["n_switch"] >= 1050


# -- the whole plan against a brute-force search ----------------------------------------------


@pytest.mark.parametrize("case", range(40))
@pytest.mark.parametrize("objective", ["samples", "time"])
def test_the_plan_matches_a_brute_force_search(case, objective):
    rng = np.random.default_rng(case)
    batches = sorted(rng.choice([64, 128, 256, 512, 1024, 2048, 4096], rng.integers(2, 6),
                                replace=False).tolist())
    clocks = []
    for b in batches:
        fail = None if rng.random() < 0.25 else float(rng.uniform(5e3, 60e3))
        clocks.append(planner.BatchClocks(
            batch=float(b), progress=float(rng.uniform(2e3, 30e3)), fail=fail,
            one_seed=bool(rng.random() < 0.2), seconds_per_sample=float(0.5 / b ** 0.5 + 1e-4),
            reach=None if fail is not None else float(rng.uniform(10e3, 60e3))))
    budget, safety = float(rng.uniform(20e3, 80e3)), 0.8
    after = bool(rng.random() < 0.3)
    got = planner.choose(planner.candidates(clocks, safety, budget, after), objective)
    want = brute_force(clocks, safety, budget, objective, after)
    if got is None or want is None:
        assert got is None and want is None, (got, want)
        return
    least, small, mine, key = want
    assert got.b_small == small
    assert got.value(objective) == pytest.approx(least, rel=0.005)
    # of that batch's least-clock plans, one phase when its end is within TOL of the latest
    # (the grid's rounding allowed), else the latest end
    top = [p for p in mine if p[key] <= least * (1 + 0.005)]
    latest = max(p[3] for p in top)
    one = [p for p in top if p[2] is None and p[3] * (1 + planner.TOL) >= latest * 0.999]
    if one and got.phases == 1:
        assert got.end == pytest.approx(one[0][3])
    else:
        assert not one or one[0][3] * (1 + planner.TOL) < latest * 1.001
        assert got.end >= latest * (1 - 0.01)


def test_a_switch_after_the_target_stays_after_it_in_whole_samples():
    p = planner.Plan(512.0, 2048.0, 7947.4, 18264.3, True, 7947.4, None, None, 0.8)
    assert planner.rounded(p).n_switch == 7948 and planner.rounded(p).end == 18264
    before = planner.Plan(512.0, 2048.0, 5000.6, 18264.3, True, 9000.0, None, None, 0.8)
    assert planner.rounded(before).n_switch == 5001
