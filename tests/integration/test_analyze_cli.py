"""`twoclocks analyze / schedule / theory` end to end through the real CLI, and the edge cases."""

from __future__ import annotations

import csv
import json
import math
import tomllib

import numpy as np
import pytest

from tests.integration.simsweep import make_sweep
from tests.support.cli import assert_one_line_error, twoclocks
from twoclocks_cli.store import Run, Store, Sweep

pytestmark = [pytest.mark.one_worker, pytest.mark.subprocess]

SIM = {"log_every": 4, "eval_every": 1, "checkpoint_every": 1000, "cap": 0.05}


@pytest.fixture(scope="module")
def sim_db(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    url = f"sqlite:///{root / 'store.db'}"
    store = Store.open(url)
    make_sweep(store, "sim", [2, 4, 8], 2, 30_000, SIM, root / "work")
    store.close()
    return url, root


def _synthetic(store, name, batches, seeds=2, fn=None, status="completed", points=60):
    """Runs whose metric curve is fn(samples, batch, seed), logged by the real writer."""
    fn = fn or (lambda x, b, s: 1 - np.exp(-x / (1000 + 20 * b)))
    with store.session() as s:
        sw = Sweep(name=name, backend="grpo", config={})
        s.add(sw)
        s.flush()
        ids = []
        for b in batches:
            for seed in range(seeds):
                r = Run(
                    sweep_id=sw.id,
                    cell_id=f"{b}-{seed}",
                    name=f"{name}-{b}-{seed}",
                    backend="grpo",
                    batch_prompts=b // 8,
                    group_size=8,
                    batch_samples=b,
                    lr=1e-3,
                    clip_low=0.2,
                    clip_high=0.2,
                    seed=seed,
                    config={},
                    status=status,
                )
                s.add(r)
                s.flush()
                ids.append(r.id)
    for rid, (b, seed) in zip(ids, [(b, s) for b in batches for s in range(seeds)], strict=True):
        x = np.arange(1, points + 1) * b
        with store.metric_writer(rid) as w:
            for step, (xi, yi) in enumerate(zip(x, fn(x, b, seed), strict=True), start=1):
                w.log(step, int(xi), {"reward_mean": float(yi)})
    return ids


def test_analyze_json_csv_plot_and_stored(sim_db, tmp_path):
    url, _ = sim_db
    png, out_csv = tmp_path / "a.png", tmp_path / "a.csv"
    proc = twoclocks(
        "analyze",
        "sim",
        "--db",
        url,
        "--target",
        "0.9",
        "--drift-threshold",
        "6.5",
        "--json",
        "--csv",
        str(out_csv),
        "--plot",
        str(png),
        "--bootstrap",
        "200",
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) >= {
        "sweep",
        "options",
        "metric",
        "target",
        "runs",
        "batches",
        "critical_batch",
        "failure_invariance",
        "clipping",
        "warnings",
        "analysis_id",
    }
    assert data["options"]["drift_threshold"] == 6.5 and data["options"]["target"] == "0.9"
    assert data["options"]["window"] == 5 and data["options"]["drop_rho"] == 0.3
    assert data["metric"] == "eval_accuracy" and len(data["runs"]) == 6
    assert [b["batch_samples"] for b in data["batches"]] == [8, 16, 32]
    for b in data["batches"]:
        assert set(b["progress"]) >= {"median", "low", "high", "n", "n_censored", "note"}
    assert set(data["critical_batch"]) == {
        "empirical", "power", "mccandlish", "noise_scale", "sign_noise_scale", "theory",
        "recommended", "disagreements",
    }
    rec = data["critical_batch"]["recommended"]
    assert set(rec) >= {"b_crit", "low", "high", "bound", "source", "why"}
    assert data["critical_batch"]["theory"]["b_crit"] > 0
    assert data["critical_batch"]["noise_scale"]["b_simple"] > 0
    run = data["runs"][0]
    assert run["failure"]["rule"] == "drift" and run["progress"]["censored"] is False
    assert run["failure"]["drift"] >= 6.5  # the first drift logged past the threshold
    assert png.stat().st_size > 10_000
    rows = list(csv.DictReader(open(out_csv)))
    assert len(rows) == 6 and rows[0]["failure_rule"] == "drift"
    table = twoclocks("analyze", "--db", url, "--target", "0.9")  # the only sweep, rich table
    assert table.returncode == 0 and "B_crit" in table.stdout and "failure clock" in table.stdout


def test_schedule_reuses_stored_analysis_and_writes_toml(sim_db, tmp_path):
    url, _ = sim_db
    assert (
        twoclocks(
            "analyze", "sim", "--db", url, "--target", "0.9", "--drift-threshold", "6.5", "--json",
            "--save",
        ).returncode
        == 0
    )
    out = tmp_path / "phases.toml"
    proc = twoclocks("schedule", "sim", "--db", url, "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["analysis_options"]["target"] == "0.9"  # the stored analysis, not a fresh one
    assert isinstance(data["analysis_id"], int)
    phases = tomllib.loads(out.read_text())["phases"]
    assert phases == json.loads(
        json.dumps(
            [
                {k: (int(round(v)) if k == "until_samples" else v) for k, v in p.items()}
                for p in data["phases"]
            ]
        )
    )
    for p in phases:
        assert set(p) == {
            "until_samples",
            "prompts_per_batch",
            "lr",
            "clip_eps_low",
            "clip_eps_high",
        }
    text = twoclocks("schedule", "sim", "--db", url)
    assert text.returncode == 0 and "rationale" in text.stdout and "B_crit" in text.stdout
    bad = tmp_path / "bad.toml"
    assert_one_line_error(
        twoclocks("schedule", "sim", "--db", url, "--out", str(bad), "--large-lr", "keep"),
        "--large-lr 'keep'", "sweep, hold")
    assert not bad.exists()


def test_theory_command_with_simulation():
    proc = twoclocks(
        "theory",
        "--batches",
        "8,32",
        "--simulate",
        "--budget",
        "20000",
        "--cap",
        "0.05",
        "--lr-scan",
        "4",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["failure_exponent"] == 0.0 and data["critical_batch"]["b_crit"] > 0
    assert all("simulated_n_prog" in r and "failure_clock_predicted" in r for r in data["rows"])
    # a larger lr lets the cap bind at smaller batches: B_crit moves down with lr
    assert data["critical_batch_vs_lr"][0]["b_crit"] < data["critical_batch"]["b_crit"]
    table = twoclocks("theory", "--rule", "linear", "--set", 'optimizer="sgd"', "--cap", "0.05")
    assert table.returncode == 0 and "exponent" in table.stdout
    assert_one_line_error(twoclocks("theory", "--rule", "cubic"), "--rule")
    assert_one_line_error(twoclocks("theory", "--set", "nope=1"), "unknown key", "nope")


def test_edge_no_runs_unknown_sweep_unknown_metric(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    store = Store.open(url)
    assert_one_line_error(twoclocks("analyze", "--db", url), "no sweeps")
    with store.session() as s:
        s.add(Sweep(name="empty", backend="sim", config={}))
    assert_one_line_error(twoclocks("analyze", "empty", "--db", url), "no runs")
    assert_one_line_error(twoclocks("analyze", "nosuch", "--db", url), "nosuch", "empty")
    _synthetic(store, "syn", [8, 16])
    assert_one_line_error(
        twoclocks("analyze", "syn", "--db", url, "--metric", "acc"), "'acc'", "reward_mean"
    )
    assert_one_line_error(
        twoclocks("analyze", "syn", "--db", url, "--target", "frac:2"), "--target"
    )
    _synthetic(store, "falling", [8, 16], fn=lambda x, b, s: np.exp(-x / 500))
    proc = twoclocks("analyze", "falling", "--db", url, "--json")
    assert proc.returncode == 0, proc.stderr
    falling = json.loads(proc.stdout)
    assert any("never rose" in w for w in falling["warnings"])
    assert all(r["progress"]["censored"] for r in falling["runs"])


def test_edge_one_batch_partial_censored_nan(tmp_path):
    from twoclocks_cli.clocks import AnalysisOptions, analyze_sweep

    url = f"sqlite:///{tmp_path / 's.db'}"
    store = Store.open(url)
    _synthetic(store, "one", [16], seeds=3)
    one = analyze_sweep(store, "one", AnalysisOptions(target="0.5")).to_json()
    assert "no fit possible" in one["critical_batch"]["mccandlish"]["note"]
    assert one["failure_invariance"]["verdict"].startswith("no run failed")
    proc = twoclocks("schedule", "one", "--db", url)
    assert_one_line_error(proc, "no fit possible", "cannot schedule")

    _synthetic(store, "run", [16, 32], status="running")
    part = analyze_sweep(store, "run", AnalysisOptions(target="0.5")).to_json()
    assert all(r["partial"] for r in part["runs"])
    assert any("in progress" in w for w in part["warnings"])

    cens = analyze_sweep(store, "run", AnalysisOptions(target="0.9999")).to_json()
    assert all(r["progress"]["censored"] for r in cens["runs"])
    assert all(b["progress"]["median"] is None for b in cens["batches"])
    assert cens["batches"][0]["progress"]["lower_bound"] == 60 * 16
    assert any("every run is censored" in w for w in cens["warnings"])
    assert cens["critical_batch"]["mccandlish"]["b_crit"] is None
    nodrift = analyze_sweep(store, "run", AnalysisOptions(drift_threshold=1.0)).to_json()
    assert any("drift rule is on but no run logged 'drift_abs'" in w for w in nodrift["warnings"])

    def with_nan(x, b, s):
        y = 1 - np.exp(-x / 1000)
        y[::7] = np.nan
        return y

    _synthetic(store, "nan", [8, 16], fn=with_nan, points=200)
    nan = analyze_sweep(store, "nan", AnalysisOptions(target="0.5", smoothing="none")).to_json()
    assert any("NaN" in w for w in nan["warnings"])
    for r in nan["runs"]:  # crossing of the finite points, within one logging interval
        assert abs(r["progress"]["samples"] - 1000 * math.log(2)) <= r["batch_samples"] * 2
    json.dumps(nan, allow_nan=False)  # strict JSON: no NaN leaks out


def test_unsorted_logging_gives_the_same_clocks(tmp_path):
    from twoclocks_cli.clocks import AnalysisOptions, analyze_sweep

    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    ids = _synthetic(store, "sorted", [8], seeds=1)
    with store.session() as s:
        sw = Sweep(name="shuffled", backend="grpo", config={})
        s.add(sw)
        s.flush()
        r = Run(
            sweep_id=sw.id,
            cell_id="x",
            name="x",
            backend="grpo",
            batch_prompts=1,
            group_size=8,
            batch_samples=8,
            seed=0,
            config={},
            status="completed",
        )
        s.add(r)
        s.flush()
        rid = r.id
    src = store.load_metric(ids, "reward_mean")[ids[0]]
    order = np.random.default_rng(0).permutation(src.steps.size)
    with store.metric_writer(rid) as w:
        for i in order:
            w.log(int(src.steps[i]), int(src.samples[i]), {"reward_mean": 0.0})  # replayed later
        for i in order:
            w.log(int(src.steps[i]), int(src.samples[i]), {"reward_mean": float(src.values[i])})
    a = analyze_sweep(store, "sorted", AnalysisOptions(target="0.5")).to_json()
    b = analyze_sweep(store, "shuffled", AnalysisOptions(target="0.5")).to_json()
    assert a["runs"][0]["progress"]["samples"] == b["runs"][0]["progress"]["samples"]


def test_clipping_table_wider_clip_fails_earlier(tmp_path):
    """sim.cap_per_clip maps clip_eps to the per-step cap: a wider clip drifts faster."""
    from twoclocks_cli.clocks import AnalysisOptions, analyze_sweep

    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    sim = {"log_every": 4, "eval_every": 1, "cap_per_clip": 0.25}
    ids = make_sweep(store, "clip", [16], 1, 36_000, sim, tmp_path / "a", clip=(0.1, 0.1))
    with store.session() as s:  # a second clip setting in the same sweep
        for rid in ids:
            run = s.get(Run, rid)
            cell = {**run.config, "clip_eps_low": 0.3, "clip_eps_high": 0.3}
            s.add(
                Run(
                    sweep_id=run.sweep_id,
                    cell_id=run.cell_id + "-wide",
                    name=run.name + "w",
                    backend="sim",
                    batch_prompts=run.batch_prompts,
                    group_size=run.group_size,
                    batch_samples=run.batch_samples,
                    lr=run.lr,
                    clip_low=0.3,
                    clip_high=0.3,
                    seed=run.seed,
                    config=cell,
                    status="completed",
                )
            )
    from twoclocks_cli.backends import run_cell

    wide = [r.id for r in store.list_runs("clip") if r.clip_low == 0.3]
    for rid in wide:
        run_cell(store, rid, tmp_path / f"w{rid}")
    result = analyze_sweep(
        store, "clip", AnalysisOptions(target="0.9", drift_threshold=6.5, theory=False)
    ).to_json()
    table = {row["clip_low"]: row for row in result["clipping"]}
    assert set(table) == {0.1, 0.3}
    wide, narrow = table[0.3]["failure_median"], table[0.1]["failure_median"]
    assert wide is not None and (narrow is None or wide < narrow)  # None: never failed


def test_clocks_also_in_steps_prompts_and_seconds(tmp_path):
    from twoclocks_cli.clocks import AnalysisOptions, analyze_sweep

    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    (rid,) = _synthetic(store, "timed", [16], seeds=1, points=200)
    with store.metric_writer(rid) as w:
        for step in range(1, 201):
            w.log(step, step * 16, {"time_gen_s": 0.5, "time_update_s": 0.25})
    run = analyze_sweep(store, "timed", AnalysisOptions(target="0.5")).to_json()["runs"][0]
    prog = run["progress"]
    assert prog["steps"] == pytest.approx(prog["samples"] / 16)
    assert prog["prompts"] == pytest.approx(prog["samples"] / 8)
    assert prog["seconds"] == pytest.approx(0.75 * prog["samples"] / 16)


def test_analyze_and_store_on_both_backends(store):
    """The same synthetic sweep analysed on SQLite and PostgreSQL: known McCandlish B_crit."""
    from twoclocks_cli.clocks import AnalysisOptions, analyze_sweep

    def curve(x, b, seed):  # samples-to-0.5 = ln2 * 1000 * (1 + b/64): B_crit = 64
        return 1 - np.exp(-x / (1000 * (1 + b / 64)))

    _synthetic(store, "both", [16, 32, 64, 128, 256], seeds=2, fn=curve, points=400)
    result = analyze_sweep(store, "both", AnalysisOptions(target="0.5", smoothing="none"))
    fit = result.to_json()["critical_batch"]["mccandlish"]
    assert fit["b_crit"] == pytest.approx(64, rel=0.05)
    store.save_analysis("both", result.to_json())
    assert store.latest_analysis("both")["critical_batch"]["mccandlish"]["b_crit"] == fit["b_crit"]


def test_each_collapse_rule_fires_and_the_earliest_wins(tmp_path):
    from twoclocks_cli.clocks import AnalysisOptions, analyze_sweep

    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    (rid,) = _synthetic(store, "rules", [8], seeds=1, points=100)
    with store.metric_writer(rid) as w:
        for step in range(1, 101):
            w.log(
                step,
                step * 8,
                {
                    "entropy": 1.0 if step < 60 else 0.05,  # entropy collapse at step 60
                    "resp_len_mean": 20.0 if step < 40 else 300.0,  # length blow-up at step 40
                    "drift_abs": step * 0.1,  # crosses 7 at step 70
                    "nonfinite": 1.0 if step == 90 else 0.0,
                },
            )
    base = dict(target="0.5", drift_threshold=7.0, entropy_low=0.1)
    run = analyze_sweep(store, "rules", AnalysisOptions(**base)).to_json()["runs"][0]
    fired = run["failure"]["rules"]
    assert fired["entropy"] == 60 * 8 and fired["drift"] == 70 * 8 and fired["nonfinite"] == 720
    assert run["failure"]["rule"] == "entropy" and run["failure"]["samples"] == 480
    run = analyze_sweep(store, "rules", AnalysisOptions(**base, length_max=100)).to_json()
    assert run["runs"][0]["failure"]["rule"] == "length"
    assert run["options"]["length_max"] == 100


def test_drift_at_failure_per_run_and_per_batch_against_a_hand_computation(tmp_path):
    """Each failed run reports the drift last logged at or before its failure (drift logged at
    even steps only, so 'at or before' is exercised); each batch the median of its two seeds
    and, for two seeds, the interval [min, max] (bootstrap medians of two values)."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    store = Store.open(url)

    def rise_then_fall(x, b, seed):
        step = x / b
        return np.where(step <= 20, step / 20, 1 - (step - 20) * 0.05)

    ids = _synthetic(store, "drifty", [64, 256], seeds=2, fn=rise_then_fall)
    with store.session() as s:
        cells = {r.id: (r.batch_samples, r.seed) for r in s.query(Run).filter(Run.id.in_(ids))}
    for rid, (b, seed) in cells.items():
        with store.metric_writer(rid) as w:
            for step in range(2, 61, 2):
                w.log(step, step * b, {"drift_abs": step * b * 1e-4 * (1 + seed)})
    store.close()
    out_csv = tmp_path / "a.csv"
    proc = twoclocks("analyze", "drifty", "--db", url, "--target", "0.5", "--json",
                     "--csv", str(out_csv))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    expected: dict[int, list[float]] = {}
    odd = 0
    for run in data["runs"]:
        b, seed, fail = run["batch_samples"], run["seed"], run["failure"]["samples"]
        assert run["failure"]["rule"] == "drop" and fail is not None
        odd += int(fail // b) % 2  # a failure between two drift points
        last_even = int(fail // b) // 2 * 2
        want = last_even * b * 1e-4 * (1 + seed)
        assert run["failure"]["drift"] == pytest.approx(want, rel=1e-12)
        expected.setdefault(b, []).append(want)
    assert odd > 0
    for batch in data["batches"]:
        got = batch["failure"]["drift_at_failure"]
        pair = sorted(expected[batch["batch_samples"]])
        assert got["n"] == 2
        assert got["median"] == pytest.approx(sum(pair) / 2, rel=1e-12)
        assert (got["low"], got["high"]) == (pytest.approx(pair[0]), pytest.approx(pair[1]))
    rows = list(csv.DictReader(open(out_csv)))
    assert sorted(float(r["failure_drift"]) for r in rows) == pytest.approx(
        sorted(v for vs in expected.values() for v in vs))
    table = twoclocks("analyze", "drifty", "--db", url, "--target", "0.5")
    assert table.returncode == 0 and "drift_abs at failure" in table.stdout
