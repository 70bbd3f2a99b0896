"""`compare` and `analyze` read one clock function: the same run gets the same clocks from both;
`compare` refuses a run that is not a schedule run of the sweep's setting."""

from __future__ import annotations

import re

import pytest

from tests.integration.simsweep import LR0, G, make_sweep
from twoclocks_cli.clocks import AnalysisOptions, analyze_sweep
from twoclocks_cli.clocks.compare import compare_schedule
from twoclocks_cli.core.errors import AnalysisError
from twoclocks_cli.store import Store

SIM = {"log_every": 4, "flat_dims": 32, "checkpoint_every": 5000}
BUDGET = 12_000


def test_compare_and_analyze_give_the_same_clocks_for_the_same_run(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    make_sweep(store, "const", [1, 4], 2, BUDGET, SIM, tmp_path / "c")
    phases = [
        {"until_samples": 3000, "prompts_per_batch": 1, "lr": LR0 * (G / 32) ** 0.5},
        {"prompts_per_batch": 4, "lr": LR0 * (4 * G / 32) ** 0.5},
    ]
    (sched,) = make_sweep(store, "sched", [1], 1, BUDGET, SIM, tmp_path / "s", phases=phases)
    opts = dict(target="0.6", drift_threshold=2.0, bootstrap=50, theory=False)
    analysis = analyze_sweep(store, "const", AnalysisOptions(**opts))
    cmp = compare_schedule(store, "const", sched, analysis)["schedule"]
    alone = analyze_sweep(store, "sched", AnalysisOptions(**opts)).to_json()["runs"][0]
    for clock in ("progress", "failure"):
        assert cmp[clock]["samples"] == alone[clock]["samples"], clock
        assert cmp[clock]["rule"] == alone[clock]["rule"]
    assert cmp["failure"]["rule"] == "drift"
    # the verdict a person reads writes the same clocks as counts: 12,345, never 1.234e+04
    verdict = " ".join(compare_schedule(store, "const", sched, analysis)["verdict"])
    assert f"failed at {round(cmp['failure']['samples']):,} samples (drift)" in verdict, verdict
    assert "e+0" not in verdict, verdict
    assert not re.search(r"\d{4}", verdict), verdict  # from 1,000 up, thousands separators
    large = next(r for r in analysis.batches if r.batch_samples == max(b.batch_samples
                                                                       for b in analysis.batches))
    assert f"vs {round(large.progress.median):,} for the largest batch" in verdict, verdict

    const_run = analysis.runs[0].run_id
    with pytest.raises(AnalysisError, match="constant-batch run, not a schedule"):
        compare_schedule(store, "const", const_run, analysis)
    other = make_sweep(store, "other", [1], 1, BUDGET, {**SIM, "sigma": 2.0}, tmp_path / "o",
                       phases=phases)[0]
    with pytest.raises(AnalysisError, match="not trained with sweep 'const'"):
        compare_schedule(store, "const", other, analysis)
    store.close()
