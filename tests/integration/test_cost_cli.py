"""`analyze --cost` and `schedule --objective time|cost --cost` through the real CLI: the clocks in
time in `--json`, the objective stated, and bad cost files refused in one line, store untouched."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.integration.simsweep import make_sweep
from tests.support.cli import assert_one_line_error, twoclocks
from twoclocks_cli.core.numbers import num
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


def _verl_log(path: Path, prompts: int, rng) -> np.ndarray:
    """A verl console log at `prompts` x 8 samples per step with `timing_s/*` per step; returns
    the seconds per sample of each step, from the values as printed."""
    head = (f"+ python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo "
            f"data.train_batch_size={prompts} actor_rollout_ref.actor.optim.lr=1e-6 "
            "actor_rollout_ref.rollout.n=8 'trainer.logger=[\"console\"]'")
    lines, per_sample = [head], []
    b = prompts * 8
    for step in range(1, 41):
        reward = 0.1 + 0.8 * (1 - np.exp(-step * b / 3000))
        gen = round(5 + 0.01 * b * (1 + 0.2 * rng.random()), 4)
        update = round(3 + 0.02 * b * (1 + 0.2 * rng.random()), 4)
        lines.append(f"(TaskRunner pid=1) step:{step} - critic/score/mean:{reward:.4f} - "
                     f"timing_s/gen:{gen} - timing_s/reward:0.5 - timing_s/update_actor:{update}")
        per_sample.append((gen + 0.5 + update) / b)
    path.write_text("\n".join(lines) + "\n")
    return np.array(per_sample)


def test_imported_verl_timings_give_the_time_clocks(tmp_path):
    """verl's timing_s/gen, /reward, /update_actor imported as time_*: the seconds per sample
    per batch are the median of what the logs printed, recomputed here, and time-to-target is
    the sample clock times that."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    rng = np.random.default_rng(5)
    expected = {}
    for prompts in (16, 64):
        log = tmp_path / f"verl_p{prompts}.log"
        expected[prompts * 8] = _verl_log(log, prompts, rng)
        proc = twoclocks("ingest", str(log), "--sweep", "verl", "--db", url)
        assert proc.returncode == 0, proc.stderr
    proc = twoclocks("analyze", "verl", "--db", url, "--stability", "0", "--bootstrap", "200",
                     "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    time = doc["time"]
    assert time["source"] == "measured"
    clocks = {b["batch_samples"]: b["progress"]["median"] for b in doc["batches"]}
    for b in time["batches"]:
        want = expected[b["batch_samples"]]
        tp = b["throughput"]
        assert tp["steps"] == want.size
        assert tp["seconds_per_sample"] == pytest.approx(float(np.median(want)))
        assert tp["low"] <= tp["seconds_per_sample"] <= tp["high"]
        assert b["progress"]["seconds"] == pytest.approx(
            clocks[b["batch_samples"]] * float(np.median(want)))
    # the larger batch is twice as cheap per sample here and reaches the target sooner
    assert time["b_crit_time"] == 512 and time["b_crit_time_bound"] == "lower"
    # saved with a price, the report's table gives each batch's seconds per sample and cost
    # to the target with their intervals
    price = tmp_path / "price.toml"
    price.write_text("price_per_hour = 10.0\n")
    saved = twoclocks("analyze", "verl", "--db", url, "--stability", "0", "--bootstrap", "200",
                      "--cost", str(price), "--save", "--json")
    assert saved.returncode == 0, saved.stderr
    proc = twoclocks("report", "verl", "--db", url, "-o", str(tmp_path / "rep"))
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "rep" / "index.html").read_text()
    for b in json.loads(saved.stdout)["time"]["batches"]:
        tp, prog = b["throughput"], b["progress"]
        assert tp["seconds_per_sample"] == pytest.approx(float(np.median(
            expected[b["batch_samples"]])))
        assert prog["cost"] == pytest.approx(prog["seconds"] * 10.0 / 3600)
        assert f"{num(tp['seconds_per_sample'])} [{num(tp['low'])}–{num(tp['high'])}]" in page
        # one run per batch: its sample clock, so its cost, has no interval
        assert prog["cost_low"] is None and f">{num(prog['cost'])}<" in page


def test_report_shows_the_stored_time_clocks(db, tmp_path):
    """An analysis saved with --cost keeps its clocks in time; the report prints them."""
    url, _ = db
    saved = twoclocks("analyze", "--db", url, "--cost", GPU, "--save", "--stability", "0",
                      "--no-theory", "--bootstrap", "200", "--json")
    assert saved.returncode == 0, saved.stderr
    doc = json.loads(saved.stdout)
    b_time = doc["time"]["b_crit_time"]
    proc = twoclocks("report", "sim", "--db", url, "-o", str(tmp_path / "rep"))
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "rep" / "index.html").read_text()
    assert "Clocks in time (cost file throughput, 20 per hour)" in page
    assert f"B_crit in time: {b_time:g}" in page or f"B_crit in time: ≥ {b_time:g}" in page
    # per batch: the cost file's exact seconds per sample, and the cost to the target with the
    # interval of the two seeds' sample clocks
    clocks = {b["batch_samples"]: b["progress"] for b in doc["batches"]}
    spread = 0
    for b in doc["time"]["batches"]:
        sps = 20.0 / b["batch_samples"] + 0.08
        assert f"<td>{num(sps)}</td>" in page
        prog, samples = b["progress"], clocks[b["batch_samples"]]
        if samples["low"] is not None and samples["high"] not in (None, samples["low"]):
            spread += 1
            assert prog["cost_low"] == pytest.approx(samples["low"] * sps * 20 / 3600)
            assert f"{num(prog['cost'])} [{num(prog['cost_low'])}–{num(prog['cost_high'])}]" \
                in page
    assert spread  # some batch's seeds disagree: an interval was shown


def test_imported_trl_step_time_gives_the_throughput(tmp_path):
    """TRL logs seconds per step whole (`step_time`, stored as time_step_s): the throughput of
    a run without the time_* parts is its median over the steps, per sample."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    rng = np.random.default_rng(11)
    expected = {}
    for prompts in (4, 16):
        b = prompts * 8
        step_time = np.round(2.0 + 0.01 * b * (1 + 0.3 * rng.random(30)), 4)
        history = [{"step": s, "reward": round(0.1 + 0.8 * (1 - np.exp(-s * b / 1500)), 4),
                    "learning_rate": 1e-6, "step_time": float(step_time[s - 1])}
                   for s in range(1, 31)]
        # the whole run's seconds beside: the per-step times are finer and win
        history.append({"step": 30, "train_runtime": 999.0, "train_steps_per_second": 0.03})
        folder = tmp_path / f"trl{prompts}"
        folder.mkdir()
        (folder / "trainer_state.json").write_text(json.dumps(
            {"global_step": 30, "log_history": history}))
        proc = twoclocks("ingest", str(folder / "trainer_state.json"), "--sweep", "trl",
                         "--batch-prompts", str(prompts), "--group-size", "8", "--db", url)
        assert proc.returncode == 0, proc.stderr
        expected[b] = step_time / b
    proc = twoclocks("analyze", "trl", "--db", url, "--stability", "0", "--bootstrap", "200",
                     "--json")
    assert proc.returncode == 0, proc.stderr
    time = json.loads(proc.stdout)["time"]
    assert time["source"] == "measured"
    got = {b["batch_samples"]: b["throughput"] for b in time["batches"]}
    assert set(got) == set(expected)
    for b, want in expected.items():
        assert got[b]["steps"] == want.size
        assert got[b]["seconds_per_sample"] == pytest.approx(float(np.median(want)))


def _trl_state(prompts: int, seed: int, runtime: float, steps: int = 30) -> dict:
    """A trainer_state.json as TRL < 0.20 writes it (no step_time): per-step GRPO entries, an
    eval entry, and the Trainer's summary entry with the whole run's seconds."""
    b = prompts * 8
    history = []
    for s in range(1, steps + 1):
        acc = round(0.1 + 0.8 * (1 - np.exp(-s * b / 1500)) - 0.01 * seed, 4)
        history.append({"completion_length": 40.5, "epoch": round(s / 300, 4),
                        "grad_norm": 0.31, "kl": 0.0005 * s, "learning_rate": 1e-6,
                        "loss": 0.0005 * s, "reward": round(acc + 0.9, 4), "reward_std": 0.31,
                        "rewards/accuracy_reward": acc, "rewards/format_reward": 0.9,
                        "step": s})
        if s % 10 == 0:
            history.append({"epoch": round(s / 300, 4), "eval_loss": 0.01,
                            "eval_rewards/accuracy_reward": acc, "eval_runtime": 3.2,
                            "step": s})
    history.append({"epoch": round(steps / 300, 4), "step": steps, "total_flos": 0.0,
                    "train_loss": 0.007, "train_runtime": runtime,
                    "train_samples_per_second": round(steps * b / runtime, 3),
                    "train_steps_per_second": round(steps / runtime, 3)})
    return {"best_metric": None, "best_model_checkpoint": None, "epoch": steps / 300,
            "eval_steps": 10, "global_step": steps, "is_hyper_param_search": False,
            "is_local_process_zero": True, "is_world_process_zero": True,
            "log_history": history, "logging_steps": 1, "max_steps": steps,
            "num_input_tokens_seen": 0, "num_train_epochs": 1, "save_steps": 500,
            "total_flos": 0.0, "train_batch_size": 8, "trial_name": None, "trial_params": None}


def test_imported_trl_train_runtime_gives_the_throughput(tmp_path):
    """An older TRL run logs no seconds per step, only its whole `train_runtime` (and
    `train_steps_per_second`) at the end: its seconds per sample are runtime / steps / batch,
    the median over the runs at a batch, and the time-to-target the sample clock times that."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    runtime = {(4, 0): 812.3, (4, 1): 845.9, (16, 0): 1503.2, (16, 1): 1466.0}
    for (prompts, seed), seconds in runtime.items():
        folder = tmp_path / f"trl-p{prompts}-s{seed}"
        folder.mkdir()
        (folder / "trainer_state.json").write_text(json.dumps(
            _trl_state(prompts, seed, seconds), indent=2))
        proc = twoclocks("ingest", str(folder), "--sweep", "trl", "--batch-prompts",
                         str(prompts), "--group-size", "8", "--seed", str(seed), "--db", url)
        assert proc.returncode == 0, proc.stderr
    proc = twoclocks("analyze", "trl", "--db", url, "--metric", "accuracy", "--target", "0.4",
                     "--stability", "0", "--bootstrap", "200", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    time = doc["time"]
    assert time["source"] == "measured"
    clocks = {b["batch_samples"]: b["progress"]["median"] for b in doc["batches"]}
    got = {b["batch_samples"]: b for b in time["batches"]}
    assert set(got) == {32, 128}
    for prompts in (4, 16):
        b = prompts * 8
        # runtime / steps, not 1 / train_steps_per_second: the Trainer rounds that to three
        # decimals (0.02 steps/s for 1,466 s over 30 steps: 2% off)
        per_run = [runtime[prompts, seed] / 30 / b for seed in (0, 1)]
        tp = got[b]["throughput"]
        assert tp["steps"] == 2  # one mean step per run
        assert tp["seconds_per_sample"] == pytest.approx(float(np.median(per_run)))
        assert got[b]["progress"]["seconds"] == pytest.approx(
            clocks[b] * float(np.median(per_run)))
