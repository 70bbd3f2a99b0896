"""Edge cases of the clocks through the real CLI, on stores filled by `ingest --format csv`.

Each synthetic curve is written as a CSV (step, samples, reward_mean) in the shape a logger
writes it, imported with the real importer, analysed with `twoclocks analyze --json`; the
expected numbers are computed by hand from the curve the test wrote.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.support.cli import assert_one_line_error, twoclocks

pytestmark = pytest.mark.subprocess


def _csv(path, batch, values):
    lines = ["step,samples,reward_mean"]
    for i, v in enumerate(values):
        lines.append(f"{i},{i * batch},{v:.6g}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _ingest(tmp_path, url, sweep, batch, values, seed, lr=None, group=4):
    path = _csv(tmp_path / f"{sweep}-{batch}-{seed}-{lr}.csv", batch, values)
    lr = lr if lr is not None else 1e-3 * np.sqrt(batch / 8)
    proc = twoclocks("ingest", str(path), "-f", "csv", "--sweep", sweep, "--batch-prompts",
                     str(batch // group), "--group-size", str(group), "--lr", f"{lr:.6g}",
                     "--seed", str(seed), "--db", url)
    assert proc.returncode == 0, proc.stderr


def _analyze(url, sweep, *extra):
    """`analyze --save --json` (saved: a later `schedule` uses these options)."""
    proc = twoclocks("analyze", sweep, "--db", url, "--json", "--save", "--bootstrap", "100",
                     *extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _rise(n, tau_samples, batch, top=0.8):
    x = np.arange(n) * batch
    return top * (1 - np.exp(-x / tau_samples))


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{tmp_path / 'store.db'}"


def test_a_run_starting_above_the_target_is_flagged_not_a_crossing(tmp_path, url):
    for b in (8, 16):
        for seed in (0, 1):
            _ingest(tmp_path, url, "above", b, 0.9 + 0.001 * seed + 0.0 * np.arange(40), seed)
    _ingest(tmp_path, url, "above", 32, _rise(60, 400, 32), 0)
    a = _analyze(url, "above", "--target", "0.5")
    started = [r for r in a["runs"] if r["started_above"]]
    assert len(started) == 4 and all(r["progress"]["samples"] is None for r in started)
    assert all("started at or above" in r["progress"]["reason"] for r in started)
    assert any("started at or above the target" in w for w in a["warnings"])
    # no zero clocks enter E(B): the fit sees one batch, no crash, no B_crit of 0
    rec = a["critical_batch"]["recommended"]
    assert rec["b_crit"] is None or rec["b_crit"] > 0
    table = twoclocks("analyze", "above", "--db", url, "--target", "0.5", "--bootstrap", "50")
    assert table.returncode == 0 and "Traceback" not in table.stderr, table.stderr
    proc = twoclocks("schedule", "above", "--db", url, "--reanalyze")
    assert proc.returncode in (0, 2) and "Traceback" not in proc.stderr, proc.stderr


def test_a_collapse_before_the_target_is_said_so(tmp_path, url):
    """Rises to 0.45, falls (drop fires), recovers past the 0.5 target later: by default a dip
    (the progress clock is the later crossing); with --no-dips a collapse before the target."""
    b = 8
    x = np.arange(80)
    values = np.where(x < 20, 0.45 * x / 20, np.where(x < 35, 0.1, 0.1 + 0.7 * (x - 35) / 45))
    _ingest(tmp_path, url, "collapse", b, values, 0)
    _ingest(tmp_path, url, "collapse", 16, _rise(80, 300, 16), 0)
    a = _analyze(url, "collapse", "--target", "0.5", "--smoothing", "none")
    run = next(r for r in a["runs"] if r["batch_samples"] == b)
    assert run["failure"]["samples"] is None and len(run["failure"]["dips"]) == 1
    dip = run["failure"]["dips"][0]
    # hand: peak 0.45 x 19/20 = 0.4275 (x = 19), allowance 0.3 x 0.4275 = 0.128, the first point
    # below the floor x = 20; back above 0.4275 - 0.5 x 0.128 = 0.3634 where
    # 0.1 + 0.7 (x - 35)/45 >= 0.3634: x = 51.9, the point x = 52
    assert dip["at"] == 20 * b and dip["recovered_at"] == 52 * b, dip
    assert dip["peak"] == pytest.approx(0.4275)
    # crossing 0.5: 0.1 + 0.7 (x - 35) / 45 = 0.5 at x = 60.71, on the chord between the points
    # x = 60 (0.489) and x = 61 (0.504) that bracket it (no longer held at x = 61)
    assert run["progress"]["samples"] == pytest.approx((35 + 0.4 * 45 / 0.7) * b)
    batch = next(x for x in a["batches"] if x["batch_samples"] == b)
    assert batch["failure"]["n_dips"] == 1 and batch["failure"]["n_failed"] == 0
    a = _analyze(url, "collapse", "--target", "0.5", "--smoothing", "none", "--no-dips")
    run = next(r for r in a["runs"] if r["batch_samples"] == b)
    assert run["failure"]["rule"] == "drop"
    n_fail = run["failure"]["samples"]
    assert run["progress"]["samples"] is None and run["progress"]["censored"]
    assert f"collapsed at {n_fail:,.0f} samples" in run["progress"]["reason"]
    assert run["progress"]["censored_at"] == n_fail  # not "censored at the last sample"
    batch = next(x for x in a["batches"] if x["batch_samples"] == b)
    assert "collapsed before the target" in batch["progress"]["note"]


def test_smoothing_never_places_a_crossing_outside_its_bracket(tmp_path, url):
    """Raw 0 at 0, B, 2B samples, then 1: the centred average crosses 0.3 at 1.33 B, before any
    observed point reaches it; the crossing is the chord between the observed points that
    bracket it (0 at 2B, 1 at 3B): 2.3 B, neither earlier nor held at 3B."""
    values = [0, 0, 0, 1, 1, 1, 1, 1, 1, 1]
    for b in (512, 1024):
        _ingest(tmp_path, url, "lookahead", b, values, 0)
    a = _analyze(url, "lookahead", "--target", "0.3")
    for r in a["runs"]:
        b = r["batch_samples"]
        assert 2 * b < r["progress"]["samples"] < 3 * b, r["progress"]
        assert r["progress"]["samples"] == pytest.approx(2.3 * b), r["progress"]


def test_failures_at_eval_resolution_are_flagged_and_left_out_of_the_slope(tmp_path, url):
    x = np.arange(40)
    for b in (8, 16, 32):
        for seed in (0, 1):
            drop = np.where(x < 1, 0.5, 0.1)  # falls at the second logged point
            _ingest(tmp_path, url, "early", b, drop, seed)
    a = _analyze(url, "early", "--target", "0.9", "--smoothing", "none")
    assert all(r["failure"]["at_eval_resolution"] for r in a["runs"])
    assert a["failure_invariance"]["verdict"].startswith("inconclusive")


def test_runs_with_different_lrs_at_one_batch_are_never_pooled_as_seeds(tmp_path, url):
    for seed, lr in enumerate((0.0141, 0.141)):
        for b in (8, 16):
            _ingest(tmp_path, url, "mixed", b, _rise(40, 300 + seed, b), seed,
                    lr=lr * np.sqrt(b / 8))
    proc = twoclocks("analyze", "mixed", "--db", url, "--json")
    assert_one_line_error(proc, "different learning rates", "B=8", "0.0141", "0.141")


def test_the_schedule_never_picks_a_censored_batch(tmp_path, url):
    """The demo's failure case: E(B) falls with B, the smallest batch never reaches the target."""
    for seed in (0, 1, 2):
        _ingest(tmp_path, url, "falling", 8, _rise(100, 4000, 8, top=0.45), seed)  # censored
        _ingest(tmp_path, url, "falling", 16, _rise(100, 900, 16), seed)
        _ingest(tmp_path, url, "falling", 32, _rise(100, 700, 32), seed)
    a = _analyze(url, "falling", "--target", "0.5", "--smoothing", "none")
    rec = a["critical_batch"]["recommended"]
    assert rec["bound"] == "lower" and rec["b_crit"] == 32, rec
    proc = twoclocks("schedule", "falling", "--db", url, "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["b_small"] == 32  # the most sample-efficient batch, never the censored 8
    assert all(p["prompts_per_batch"] != 2 for p in plan["phases"])
    assert plan["predicted"]["progress_samples"] is not None
    # the clock it predicts is the measured median at B=32 (hand: 0.8 (1 - e^(-x/700)) = 0.5)
    want = -700 * np.log(1 - 0.5 / 0.8)
    assert abs(plan["predicted"]["progress_samples"] - want) <= 32, (plan["predicted"], want)


def test_the_invariance_verdict_needs_the_interval_inside_the_margin(tmp_path, url):
    """Failure clocks scattered over 4x at each batch: the slope interval is wide."""
    rng = np.random.default_rng(0)
    for b in (8, 16):
        for seed in range(3):
            at = int(rng.uniform(20, 80))
            x = np.arange(100)
            values = np.where(x < at, 0.6 * x / at, 0.05)
            _ingest(tmp_path, url, "wide", b, values, seed)
    a = _analyze(url, "wide", "--target", "0.9", "--smoothing", "none")
    inv = a["failure_invariance"]
    assert inv["low"] is not None and inv["high"] - inv["low"] > 0.5, inv
    assert inv["verdict"].startswith("inconclusive"), inv


def test_an_eval_set_too_small_for_the_target_gap_is_said_so(tmp_path, url):
    """eval_accuracy 0.30 -> 0.34 on 256 problems: SE ~0.029 against a gap of ~0.02."""
    for b in (8, 16):
        lines = ["step,samples,eval_accuracy,eval_n"]
        for i in range(30):
            lines.append(f"{i},{i * b},{0.30 + 0.04 * i / 29:.4f},256")
        path = tmp_path / f"eval-{b}.csv"
        path.write_text("\n".join(lines) + "\n")
        proc = twoclocks("ingest", str(path), "-f", "csv", "--sweep", "evalnoise",
                         "--batch-prompts", str(b // 4), "--group-size", "4", "--lr", "0.001",
                         "--seed", "0", "--db", url)
        assert proc.returncode == 0, proc.stderr
    a = _analyze(url, "evalnoise")
    assert any("eval set of 256 problems" in w and "eval noise level" in w
               for w in a["warnings"]), a["warnings"]


def test_analyze_and_schedule_say_how_settled_their_decision_is(tmp_path, url):
    """Three batches, three seeds each, every seed alike: the decision holds in every resample
    (analyze's --json and the schedule's first line say so); a bad --stability is one line."""
    for b in (8, 32, 128):
        for seed in range(3):
            x = np.arange(100)
            # progress ~ 300 samples per unit of batch, slower per sample past 32
            tau = 60 * (1 + b / 32) / b
            values = 0.8 * (1 - np.exp(-x / tau)) * (1 + 0.001 * seed)
            _ingest(tmp_path, url, "settled", b, values, seed)
    a = _analyze(url, "settled", "--target", "0.5", "--smoothing", "none")
    st = a["stability"]
    assert st["resamples"] == 200 and st["settled"], st
    assert st["b_crit"]["share"] == 1.0 and st["schedule"]["share"] == 1.0
    assert st["collapses"] == {k: {"share": 0.0, "settled": True} for k in ("8", "32", "128")}
    proc = twoclocks("schedule", "settled", "--db", url)
    assert proc.returncode == 0, proc.stderr
    # 8 takes the fewest samples (E = 60 (1 + B/32) x ln(0.8/0.3): 73.6, 117.7, 294 samples)
    assert proc.stdout.splitlines()[0].startswith("decision settled: schedule 8 in 100%")
    plan = json.loads(twoclocks("schedule", "settled", "--db", url, "--json").stdout)
    assert plan["settled"] is True and plan["stability"]["schedule"]["shape"] == "8"
    for cmd in ("analyze", "schedule"):
        proc = twoclocks(cmd, "settled", "--db", url, "--stability", "-1")
        assert_one_line_error(proc, "--stability -1", "between 0 and 100,000")


def test_an_unsettled_decision_says_so_first_with_what_would_settle_it(tmp_path, url):
    """B_small = 8 (the fewest samples) collapses in 2 of its 4 seeds: whether its median seed
    collapses flips between seed resamples (it does in 5/16 of them), so the schedule's first
    line says NOT settled and names more seeds at 8; --json carries the same."""
    for b in (8, 32, 128):
        for seed in range(4):
            x = np.arange(100)
            tau = 60 * (1 + b / 32) / b
            values = 0.8 * (1 - np.exp(-x / tau)) * (1 + 0.001 * seed)
            if b == 8 and seed % 2:
                values[60:] = 0.0  # collapses and stays down
            _ingest(tmp_path, url, "unsettled", b, values, seed)
    _analyze(url, "unsettled", "--target", "0.5", "--smoothing", "none")
    proc = twoclocks("schedule", "unsettled", "--db", url)
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("decision NOT settled: schedule 8"), first
    assert "would settle it: more seeds at B=8" in first, first
    plan = json.loads(twoclocks("schedule", "unsettled", "--db", url, "--json").stdout)
    st = plan["stability"]
    assert plan["settled"] is False and st["settled"] is False
    assert abs(st["collapses"]["8"]["share"] - 5 / 16) < 0.1, st["collapses"]
    assert any(n["batch"] == 8 and n["what"] == "more seeds" for n in st["needs"]), st["needs"]
