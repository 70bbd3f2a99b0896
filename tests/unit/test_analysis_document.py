"""The analysis document's shapes that differ from the result dataclasses' fields, written by
pydantic and read back: each against the shape written out here by hand."""

from __future__ import annotations

import json

from twoclocks_cli.clocks.critical import Estimate
from twoclocks_cli.clocks.result import (
    Analysis,
    BatchRow,
    Critical,
    Invariance,
    NoiseSummary,
    Recommended,
    RunRow,
    Theory,
)
from twoclocks_cli.clocks.stats import Aggregate


def _analysis() -> Analysis:
    return Analysis(
        sweep="s", metric="eval_accuracy",
        runs=[RunRow(run_id=1, batch_samples=64, points=0, status="failed", first_samples=3.0),
              RunRow(run_id=2, batch_samples=64.0, points=5, first_samples=3.0)],
        batches=[BatchRow(batch_samples=64, n_failed=1, n_dips=2, runs_with_dips=1,
                          failure=Aggregate(n=2, n_censored=1, median=None),
                          drift_at_failure=Aggregate(n=1, median=0.5))],
        critical=Critical(empirical=Estimate("empirical", 96, low=80, high=120),
                          noise_scale=NoiseSummary(None, low=1.0, n_runs=0, note="none"),
                          sign_noise_scale=NoiseSummary(40.0, 30.0, 50.0, 2, "x"),
                          theory=Theory.from_json({"b_crit": 90.0, "method": "m", "extra": [1]}),
                          recommended=Recommended.of(None, "no estimate")),
        invariance=Invariance(slope=0.1, n=3, verdict="v", margin=0.25),
    )


def test_the_shapes_that_are_not_the_fields():
    d = _analysis().to_json()
    unanalysed, analysed = d["runs"]
    assert list(unanalysed) == [  # an unanalysed run: identity, status, empty clocks
        "run_id", "name", "batch_samples", "batch_prompts", "group_size", "lr", "clip_low",
        "clip_high", "seed", "status", "partial", "in_family", "points", "last_samples",
        "progress", "failure", "noise_scale", "sign_noise_scale", "started_above"]
    assert "first_samples" in analysed and analysed["first_samples"] == 3.0
    failure = d["batches"][0]["failure"]
    assert list(failure)[-4:] == ["n_failed", "n_dips", "runs_with_dips", "drift_at_failure"]
    assert (failure["n_failed"], failure["n_dips"], failure["runs_with_dips"]) == (1, 2, 1)
    assert failure["drift_at_failure"]["median"] == 0.5
    assert "n_failed" not in d["batches"][0]
    crit = d["critical_batch"]
    assert crit["noise_scale"] == {"value": None, "n_runs": 0, "note": "none", "b_simple": None}
    assert crit["sign_noise_scale"] == {"value": 40.0, "low": 30.0, "high": 50.0, "n_runs": 2,
                                        "note": "x"}
    assert crit["theory"] == {"b_crit": 90.0, "method": "m", "extra": [1]}
    assert crit["recommended"] == {"b_crit": None, "low": None, "high": None, "bound": None,
                                   "source": None, "placement": None, "why": "no estimate"}
    assert list(crit) == ["empirical", "power", "mccandlish", "noise_scale", "sign_noise_scale",
                          "theory", "recommended", "disagreements"]
    assert d["failure_invariance"] == {"slope": 0.1, "low": None, "high": None, "n": 3,
                                       "verdict": "v", "margin": 0.25}
    assert list(d) == ["sweep", "options", "metric", "target", "units", "runs", "batches",
                       "critical_batch", "failure_invariance", "clipping", "warnings",
                       "stability", "time", "analysis_id"]


def test_the_document_reads_back_as_it_was_written():
    text = _analysis().dumps()
    back = Analysis.from_json(json.loads(text))
    assert back.dumps() == text
    assert '"batch_samples": 64,' in text and '"batch_samples": 64.0,' in text  # int and float
    assert back.runs[0].batch_samples == 64 and isinstance(back.runs[0].batch_samples, int)
    assert back.batches[0].n_failed == 1 and back.batches[0].drift_at_failure.median == 0.5
    assert back.critical.theory.b_crit == 90.0 and back.critical.theory.method == "m"
    assert back.critical.recommended.why == "no estimate"
    assert back.critical.empirical.low == 80
    noted = Invariance(note="2 runs left out")
    assert list(noted.to_json()) == ["slope", "low", "high", "n", "verdict", "note", "margin"]
