"""`analyze --cost` and `schedule --objective time|cost --cost` through the real CLI: the clocks in
time in `--json`, the objective stated, and bad cost files refused in one line, store untouched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.simsweep import make_sweep
from tests.support.cli import assert_one_line_error, twoclocks
from twoclocks_cli.store import Store

pytestmark = [pytest.mark.one_worker, pytest.mark.subprocess]

SIM = {"log_every": 4, "eval_every": 1, "checkpoint_every": 2000, "cap": 0.05}
GPU = str(Path(__file__).resolve().parents[2] / "examples" / "gpu-cost.toml")


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    root = tmp_path_factory.mktemp("costcli")
    url = f"sqlite:///{root / 'store.db'}"
    store = Store.open(url)
    make_sweep(store, "sim", [1, 4, 16], 2, 12_000, SIM, root / "work")
    store.close()
    return url, root / "store.db"


def test_analyze_json_carries_time_and_cost_clocks(db):
    url, _ = db
    proc = twoclocks("analyze", "--db", url, "--cost", GPU, "--stability", "0", "--no-theory",
                     "--bootstrap", "200", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)["time"]
    assert doc["source"] == "cost file" and doc["price_per_hour"] == 20.0
    for b in doc["batches"]:
        sps = 20.0 / b["batch_samples"] + 0.05 + 0.03
        assert b["throughput"]["seconds_per_sample"] == pytest.approx(sps)
    seconds = {b["batch_samples"]: b["progress"]["seconds"] for b in doc["batches"]
               if b["progress"]["seconds"] is not None}
    assert doc["b_crit_time"] == min(seconds, key=seconds.get)
    shown = twoclocks("analyze", "--db", url, "--cost", GPU, "--stability", "0", "--no-theory",
                      "--bootstrap", "200")
    assert shown.returncode == 0, shown.stderr
    assert "B_crit in time:" in shown.stdout and "cost to target" in shown.stdout


def test_schedule_states_its_objective(db):
    url, _ = db
    plain = json.loads(twoclocks("schedule", "--db", url, "--stability", "0", "--json").stdout)
    assert plain["objective"] == "samples"
    proc = twoclocks("schedule", "--db", url, "--objective", "cost", "--cost", GPU,
                     "--stability", "20", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["objective"] == "cost"
    assert out["b_small"] == out["objectives"]["cost"]["batch"]
    assert set(out["objectives"]) == {"samples", "time", "cost"}
    assert any(line.startswith("samples would pick") for line in out["rationale"])


BAD = {
    "negative.toml": ("step_overhead_s = -1\n", "step_overhead_s = -1", ">= 0"),
    "unknown.toml": ("gpu_hours = 3\n", "unknown key 'gpu_hours'", "allowed are"),
    "text.toml": ('gen_s_per_sample = "fast"\n', "gen_s_per_sample", "number"),
    "zero-price.toml": ("price_per_hour = 0\n", "price_per_hour = 0", "> 0"),
    "empty.toml": ("", "no key given", "price_per_hour"),
    "broken.toml": ("step_overhead_s = \n", "not valid TOML", ""),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_cost_file_is_one_line_and_the_store_unchanged(db, tmp_path, name):
    url, path = db
    text, *needles = BAD[name]
    bad = tmp_path / name
    bad.write_text(text)
    before = path.read_bytes()
    for cmd in (["analyze"], ["schedule", "--objective", "time"]):
        proc = twoclocks(*cmd, "--db", url, "--cost", str(bad))
        assert_one_line_error(proc, str(bad), *[n for n in needles if n])
    assert path.read_bytes() == before


def test_objectives_refused_without_what_they_need(db, tmp_path):
    url, path = db
    before = path.read_bytes()
    assert_one_line_error(twoclocks("schedule", "--db", url, "--objective", "hours"),
                          "--objective 'hours'", "samples, time, cost")
    timing_only = tmp_path / "timing.toml"
    timing_only.write_text("step_overhead_s = 5\n")
    assert_one_line_error(twoclocks("schedule", "--db", url, "--objective", "cost", "--cost",
                                    str(timing_only)), "price_per_hour")
    assert_one_line_error(twoclocks("analyze", "--db", url, "--cost", str(tmp_path / "no.toml")),
                          "cost file not found")
    assert path.read_bytes() == before
    # the sim runs logged no time_*: time needs a cost file (said once the data is read)
    assert_one_line_error(twoclocks("schedule", "--db", url, "--objective", "time",
                                    "--stability", "0"), "--cost FILE")
