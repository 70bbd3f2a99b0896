"""The decision's stability against resampling truths computed by hand."""

import numpy as np
import pytest

from twoclocks_cli.clocks.critical import Estimate
from twoclocks_cli.clocks.options import AnalysisOptions
from twoclocks_cli.clocks.perbatch import batch_rows
from twoclocks_cli.clocks.result import (
    Analysis,
    Critical,
    Invariance,
    Recommended,
    RunRow,
    Target,
)
from twoclocks_cli.clocks.runclock import Clock
from twoclocks_cli.clocks.stability import SETTLED, measure
from twoclocks_cli.core.errors import AnalysisError

BUDGET = 40_000.0


def _row(i, batch, progress, failure):
    """A run at `batch` samples (G = 8) with the given clocks (None: censored at the budget)."""
    def clock(x):
        return Clock(x, x is None, censored_at=BUDGET if x is None else None)

    return RunRow(run_id=i, batch_samples=batch, batch_prompts=batch // 8, group_size=8,
                  lr=1e-4 * (batch / 128) ** 0.5, clip_low=0.2, clip_high=0.2, seed=i,
                  status="completed", points=40, first_samples=batch, last_samples=BUDGET,
                  progress=clock(progress), failure=clock(failure))


def _analysis(rows):
    opts = AnalysisOptions()
    return Analysis(sweep="s", metric="eval_accuracy", target=Target("frac:0.5", 0.5), runs=rows,
                    batches=batch_rows(rows, np.random.default_rng(0), opts),
                    critical=Critical(empirical=Estimate("empirical", None),
                                      power=Estimate("power", None),
                                      mccandlish=Estimate("mccandlish", None),
                                      recommended=Recommended(source=None, b_crit=None)),
                    invariance=Invariance(), options=opts)


def _clear_sweep():
    """E(B) = 4,000 (1 + B/1,000) exactly, 1% seed noise: B_crit inside the grid (~1,000); 128
    takes the fewest samples and fails at 15k in every seed, 2,048 at 30-31k: a switch
    128 -> 2,048 in every resample, 128's median seed collapsing."""
    rows, i = [], 0
    for b, fail in ((128, 15e3), (512, 20e3), (2048, 30e3)):
        for k in range(4):
            rows.append(_row(i, b, 4000 * (1 + b / 1000) * (1 + 0.01 * k), fail * (1 + 0.01 * k)))
            i += 1
    return rows


def test_a_clear_sweep_is_settled_in_every_resample():
    st = measure(_analysis(_clear_sweep()), reps=200)
    assert st.settled and st.verdict.startswith("settled")
    assert st.b_crit["kind"] == "point" and st.b_crit["share"] == 1.0
    assert 512 < st.b_crit["where"][0] <= st.b_crit["where"][1] < 2048
    assert st.schedule["shape"] == "128 -> 2,048 (its median seed collapses)"
    assert st.schedule["share"] == 1.0 and st.schedule["main"] == st.schedule["shape"]
    assert st.schedule["switch_share"] == 1.0
    assert all(c["share"] == 1.0 and c["settled"] for c in st.collapses.values())
    assert st.needs == []


@pytest.mark.slow
def test_the_collapse_share_of_a_half_failing_batch_matches_the_hand_computation():
    """2 of 4 seeds at B_small = 128 fail. A resample's median of 4 is censored when >= 2 of its
    4 draws are, so its median seed fails with probability (1/2)^4 + 4 (1/2)^4 = 5/16 = 0.3125.
    Over 1,000 resamples (SE 0.015): within 0.045. Whether B_small's median seed collapses is
    part of the decision: not settled, and more seeds at 128 is what would settle it."""
    rows = _clear_sweep()
    for r in rows:
        if r.batch_samples == 128 and r.seed % 2:
            r.failure = Clock(None, True, censored_at=BUDGET)
    st = measure(_analysis(rows), reps=1000)
    share = st.collapses["128"]["share"]
    assert abs(share - 5 / 16) < 0.045, share
    assert not st.collapses["128"]["settled"]
    assert 1 - SETTLED < share < SETTLED
    assert not st.settled and st.verdict.startswith("NOT settled")
    assert any(n["batch"] == 128 and n["what"] == "more seeds" for n in st.needs), st.needs
    # the decision flips with it: 128's median seed collapses in about 5/16 of the resamples
    shares = st.schedule["shares"]
    assert abs(shares.get("128 -> 2,048 (its median seed collapses)", 0) - 5 / 16) < 0.045


def test_resampling_is_reproducible_and_bounded():
    a = _analysis(_clear_sweep())
    assert measure(a, reps=50, seed=3).to_json() == measure(a, reps=50, seed=3).to_json()
    with pytest.raises(AnalysisError, match="--stability 0"):
        measure(a, reps=0)


def test_suggest_lists_the_cells_an_unsettled_decision_names():
    from twoclocks_cli.suggest import plan_suggestions

    rows = _clear_sweep()
    for r in rows:
        if r.batch_samples == 128 and r.seed % 2:
            r.failure = Clock(None, True, censored_at=BUDGET)
    a = _analysis(rows)
    a.critical.recommended = Recommended(source="empirical", b_crit=1000.0, why="t")
    a.stability = measure(a, reps=200).to_json()
    doc = plan_suggestions(a, sweep_budget=int(BUDGET))
    settle = [s for s in doc["suggestions"] if s["kind"] == "settle"]
    assert settle and all(s["why"].startswith("to settle the decision") for s in settle)
    # 128 flips: more seeds there (suggested once, by whichever rule named it first), new ones
    at128 = [s for s in doc["suggestions"] if s["batch_samples"] == 128]
    assert len(at128) == 1 and len(at128[0]["seeds"]) == 2, doc["suggestions"]
    assert set(at128[0]["seeds"]).isdisjoint(range(4))
    assert any(n.startswith("decision NOT settled") for n in doc["notes"])
    a.stability = measure(_analysis(_clear_sweep()), reps=50).to_json()
    assert not [s for s in plan_suggestions(a, sweep_budget=int(BUDGET))["suggestions"]
                if s["kind"] == "settle"]
