"""`compare` in time and cost through the real CLI: a schedule run of sim sweeps beside the
constant batches, its clocks in hours and money from a cost file or from the timings the runs
logged, each number recomputed here from the cost function or the logged timings; without
either, one note says what the time clock needs; a bad cost file is one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tests.integration.simsweep import LR0, G, make_sweep
from tests.support.cli import assert_one_line_error, twoclocks
from twoclocks_cli.core.numbers import num
from twoclocks_cli.store import Store

pytestmark = [pytest.mark.one_worker, pytest.mark.subprocess]

SIM = {"log_every": 4, "flat_dims": 32, "checkpoint_every": 5000}
BUDGET = 12_000
UNTIL = 402  # the switch: phase 0 steps on while below it, so it ends at the next whole step
GPU = str(Path(__file__).resolve().parents[2] / "examples" / "gpu-cost.toml")
ANALYZE = ("--target", "0.6", "--drift-threshold", "2", "--bootstrap", "200", "--no-theory",
           "--stability", "0")


def sps(batch: float) -> float:
    """examples/gpu-cost.toml's seconds per sample, written out here: 20 s per step + 0.08 s
    per sample."""
    return 20.0 / batch + 0.05 + 0.03


def _phases(prompts0: int) -> list[dict]:
    return [{"until_samples": UNTIL, "prompts_per_batch": prompts0,
             "lr": LR0 * (prompts0 * G / 32) ** 0.5},
            {"prompts_per_batch": 4, "lr": LR0 * (4 * G / 32) ** 0.5}]


def _build(root: Path) -> tuple[str, Path, dict]:
    """Constant batches of 4 and 16 samples (2 seeds), a schedule 4 -> 16 (on the grid) and
    one 8 -> 16 (its first batch off the grid)."""
    url = f"sqlite:///{root / 'store.db'}"
    store = Store.open(url)
    const = make_sweep(store, "const", [1, 4], 2, BUDGET, SIM, root / "c")
    (grid,) = make_sweep(store, "sched", [1], 1, BUDGET, SIM, root / "s", phases=_phases(1))
    (off,) = make_sweep(store, "sched8", [2], 1, BUDGET, SIM, root / "o", phases=_phases(2))
    store.close()
    return url, root / "store.db", {"const": const, "grid": grid, "off": off}


def _json(*args: str) -> dict:
    proc = twoclocks(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """Sim runs log no time_*: the stored analysis has no clocks in time."""
    url, path, ids = _build(tmp_path_factory.mktemp("plain"))
    _json("analyze", "const", "--db", url, "--save", *ANALYZE)
    return url, path, ids


def _switch(first_batch: float) -> float:
    """Where phase 0 hands over: the first whole step of `first_batch` at or past UNTIL."""
    return math.ceil(UNTIL / first_batch) * first_batch


def test_cost_file_gives_every_row_its_hours_and_money(plain):
    url, _, ids = plain
    doc = _json("compare", "const", "--run", str(ids["grid"]), "--db", url, "--cost", GPU)
    time = doc["time"]
    assert doc["time_note"] is None
    assert time["source"] == "cost file" and time["price_per_hour"] == 20.0
    clocks = {c["batch_samples"]: c for c in doc["constant"]}
    for b in time["batches"]:
        med = clocks[b["batch_samples"]]["progress"]["median"]
        assert b["progress"]["seconds"] == pytest.approx(med * sps(b["batch_samples"]))
        assert b["progress"]["cost"] == pytest.approx(med * sps(b["batch_samples"]) * 20 / 3600)
    # the schedule: its samples up to the switch at B=4, the rest at B=16
    s = doc["schedule"]
    switch = _switch(4)
    for clock in ("progress", "failure"):
        n = s[clock]["samples"]
        assert n is not None and n > switch, (clock, n)  # both fall in the second phase
        want = switch * sps(4) + (n - switch) * sps(16)
        got = time["schedule"][clock]
        assert got["seconds"] == pytest.approx(want)
        assert got["low"] == got["high"] == pytest.approx(want)  # an exact throughput
        assert got["cost"] == pytest.approx(want * 20 / 3600)
    # the static schedule's predicted clocks at its batches
    static = doc["static_schedule"]
    assert len(static["phases"]) == 1  # one phase at its B_small
    (b_small,) = static["batches"]
    pred = static["predicted"]
    assert time["static_schedule"]["progress"]["seconds"] == pytest.approx(
        pred["progress_samples"] * sps(b_small))
    # the table and the verdict say the same in hours
    text = twoclocks("compare", "const", "--run", str(ids["grid"]), "--db", url, "--cost", GPU,
                     env={"COLUMNS": "250"}).stdout
    hours = time["schedule"]["progress"]["seconds"] / 3600
    assert "time to target" in text and "cost to failure" in text
    assert f"{num(hours, 3)} h" in text
    small = time["batches"][0]["progress"]["seconds"]
    verdict = next(v for v in doc["verdict"] if v.startswith("time:"))
    assert f"{num(small / 3600, 3)} h for the smallest batch (B=4): " \
           f"{time['schedule']['progress']['seconds'] / small:.2f}x" in verdict
    assert "(cost file throughput)" in verdict


def test_cost_file_prices_a_batch_off_the_grid(plain):
    """A phase at a batch the sweep did not run is priced by the cost model at that batch."""
    url, _, ids = plain
    doc = _json("compare", "const", "--run", str(ids["off"]), "--db", url, "--cost", GPU)
    phases = doc["time"]["schedule"]["phases"]
    assert [p["batch_samples"] for p in phases] == [8, 16]
    assert phases[0]["throughput"]["seconds_per_sample"] == pytest.approx(sps(8))
    n = doc["schedule"]["progress"]["samples"]
    switch = _switch(8)
    assert n > switch
    assert doc["time"]["schedule"]["progress"]["seconds"] == pytest.approx(
        switch * sps(8) + (n - switch) * sps(16))


def test_without_timings_the_note_is_said_once(plain, tmp_path):
    url, path, ids = plain
    before = path.read_bytes()
    doc = _json("compare", "const", "--run", str(ids["grid"]), "--db", url)
    assert doc["time"] is None
    assert "no run logged time_* metrics" in doc["time_note"]
    assert "--cost FILE" in doc["time_note"]
    assert not any(v.startswith("time:") for v in doc["verdict"])
    text = twoclocks("compare", "const", "--run", str(ids["grid"]), "--db", url,
                     env={"COLUMNS": "250"}).stdout
    assert text.count("no time or cost clock") == 1, text
    assert "time to target" not in text
    price_only = tmp_path / "price.toml"
    price_only.write_text("price_per_hour = 3.5\n")
    doc = _json("compare", "const", "--run", str(ids["grid"]), "--db", url, "--cost",
                str(price_only))
    assert doc["time"] is None and "gives a price but no timings" in doc["time_note"]
    assert path.read_bytes() == before


def test_a_price_reprices_an_analysis_saved_with_a_cost_file(tmp_path):
    """Saved with the GPU cost file, then compared with a file that gives only a price: the
    stored timings stay (a batch off the grid too), at the new price."""
    url, _, ids = _build(tmp_path)
    _json("analyze", "const", "--db", url, "--save", "--cost", GPU, *ANALYZE)
    price = tmp_path / "price.toml"
    price.write_text("price_per_hour = 7.0\n")
    doc = _json("compare", "const", "--run", str(ids["off"]), "--db", url, "--cost", str(price))
    time = doc["time"]
    assert time["source"] == "cost file" and time["price_per_hour"] == 7.0
    assert time["cost_file"]["step_overhead_s"] == 20.0
    n, switch = doc["schedule"]["progress"]["samples"], _switch(8)
    seconds = switch * sps(8) + (n - switch) * sps(16)
    assert time["schedule"]["progress"]["seconds"] == pytest.approx(seconds)
    assert time["schedule"]["progress"]["cost"] == pytest.approx(seconds * 7.0 / 3600)


def test_a_bad_cost_file_is_one_line_and_the_store_unchanged(plain, tmp_path):
    url, path, ids = plain
    before = path.read_bytes()
    bad = tmp_path / "bad.toml"
    bad.write_text("step_overhead_s = -1\n")
    run = ("compare", "const", "--run", str(ids["grid"]), "--db", url, "--cost")
    assert_one_line_error(twoclocks(*run, str(bad)), str(bad), "step_overhead_s = -1", ">= 0")
    assert_one_line_error(twoclocks(*run, str(tmp_path / "none.toml")), "cost file not found")
    assert path.read_bytes() == before


def _log_timings(url: str, run_ids: list[int], rng) -> dict[int, tuple]:
    """time_gen_s, time_reward_s and time_update_s at every logged step of each run, larger
    at a larger batch; {run: (samples, batch, seconds)} per step as written."""
    store = Store.open(url)
    out = {}
    for rid in run_ids:
        b = store.load_metric([rid], "batch_samples")[rid]
        gen = np.round(0.2 + 0.01 * b.values * (1 + 0.5 * rng.random(b.values.size)), 4)
        update = np.round(0.1 + 0.005 * b.values * (1 + 0.5 * rng.random(b.values.size)), 4)
        with store.metric_writer(rid) as w:
            for i, step in enumerate(b.steps.tolist()):
                w.log(int(step), int(b.samples[i]), {"time_gen_s": float(gen[i]),
                                                     "time_reward_s": 0.05,
                                                     "time_update_s": float(update[i])})
        out[rid] = (b.samples, b.values, gen + 0.05 + update)
    store.close()
    return out


@pytest.fixture(scope="module")
def timed(tmp_path_factory):
    """The same runs with timings logged after the analysis was saved, then saved again."""
    root = tmp_path_factory.mktemp("timed")
    url, path, ids = _build(root)
    _json("analyze", "const", "--db", url, "--save", *ANALYZE)
    stale = _json("compare", "const", "--run", str(ids["grid"]), "--db", url)
    logged = _log_timings(url, ids["const"] + [ids["grid"], ids["off"]],
                          np.random.default_rng(3))
    price = root / "price.toml"
    price.write_text("price_per_hour = 7.0\n")
    again = [_json("compare", "const", "--run", str(ids["grid"]), "--db", url, *cost)
             for cost in ((), ("--cost", str(price)))]
    _json("analyze", "const", "--db", url, "--save", *ANALYZE)
    return url, ids, logged, stale, again


def test_an_analysis_saved_before_the_timings_says_so(timed):
    url, ids, _, stale, again = timed
    assert stale["time"] is None and "no run logged time_* metrics" in stale["time_note"]
    for doc in again:  # a price alone does not change that: the throughput is missing
        assert doc["time"] is None and "analyze const --save` again" in doc["time_note"]
        assert "time_gen_s, time_reward_s, time_update_s" in doc["time_note"]


def test_measured_throughput_gives_the_schedule_its_hours(timed):
    url, ids, logged, _, _ = timed
    doc = _json("compare", "const", "--run", str(ids["grid"]), "--db", url)
    time = doc["time"]
    assert time["source"] == "measured"
    # seconds per sample at each batch: the median over every logged step of its runs
    median = {}
    for batch in (4, 16):
        per = np.concatenate([t / b for rid in ids["const"]
                              for _, b, t in [logged[rid]] if b[0] == batch])
        median[batch] = float(np.median(per))
    got = {b["batch_samples"]: b for b in time["batches"]}
    clocks = {c["batch_samples"]: c for c in doc["constant"]}
    for batch, m in median.items():
        tp = got[batch]["throughput"]
        assert tp["seconds_per_sample"] == pytest.approx(m)
        assert tp["low"] <= m <= tp["high"]
        assert got[batch]["progress"]["seconds"] == pytest.approx(
            clocks[batch]["progress"]["median"] * m)
    # the schedule at the constant runs' throughput, batch by batch (not its own timings)
    n = doc["schedule"]["progress"]["samples"]
    switch = _switch(4)
    sched = time["schedule"]["progress"]
    assert sched["seconds"] == pytest.approx(switch * median[4] + (n - switch) * median[16])
    low = switch * got[4]["throughput"]["low"] + (n - switch) * got[16]["throughput"]["low"]
    high = switch * got[4]["throughput"]["high"] + (n - switch) * got[16]["throughput"]["high"]
    assert sched["low"] == pytest.approx(low) and sched["high"] == pytest.approx(high)
    assert sched["low"] <= sched["seconds"] <= sched["high"]
    # beside it, what the run's own logged timings add up to by the target
    samples, _, seconds = logged[ids["grid"]]
    own = float(np.interp(n, samples, np.cumsum(seconds)))
    assert time["schedule"]["logged_seconds"]["progress"] == pytest.approx(own)
    verdict = next(v for v in doc["verdict"] if v.startswith("time:"))
    assert "(measured throughput)" in verdict
    assert f"its own logged time_* add up to {num(own / 3600, 3)} h" in verdict


def test_a_batch_off_the_grid_is_timed_from_the_run_itself(timed):
    url, ids, logged, _, _ = timed
    doc = _json("compare", "const", "--run", str(ids["off"]), "--db", url)
    first = doc["time"]["schedule"]["phases"][0]
    samples, batch, seconds = logged[ids["off"]]
    own = float(np.median((seconds / batch)[batch == 8]))
    assert first["batch_samples"] == 8
    assert first["throughput"]["source"] == "measured (this run)"
    assert first["throughput"]["seconds_per_sample"] == pytest.approx(own)
    assert first["throughput"]["steps"] == int((batch == 8).sum())


def test_a_price_only_file_prices_the_measured_throughput(timed, tmp_path):
    url, ids, _, _, _ = timed
    price = tmp_path / "price.toml"
    price.write_text("price_per_hour = 7.0\n")
    doc = _json("compare", "const", "--run", str(ids["grid"]), "--db", url, "--cost", str(price))
    time = doc["time"]
    assert time["source"] == "measured" and time["price_per_hour"] == 7.0
    for clock in (time["schedule"]["progress"], *[b["progress"] for b in time["batches"]]):
        assert clock["cost"] == pytest.approx(clock["seconds"] * 7.0 / 3600)


def test_the_report_sets_the_run_beside_the_constants_in_hours(timed, tmp_path):
    """`report --run`: the compared run's table gains the hours, compare's own numbers."""
    url, ids, _, _, _ = timed
    doc = _json("compare", "const", "--run", str(ids["grid"]), "--db", url)
    proc = twoclocks("report", "const", "--run", str(ids["grid"]), "--db", url, "-o",
                     str(tmp_path / "rep"))
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "rep" / "index.html").read_text()
    sched = doc["time"]["schedule"]["progress"]
    h = [x / 3600 for x in (sched["seconds"], sched["low"], sched["high"])]
    assert "<th>time to target</th>" in page
    assert f"{h[0]:.3g} h [{h[1]:.3g}–{h[2]:.3g}]" in page
    assert next(v for v in doc["verdict"] if v.startswith("time:")) in page
