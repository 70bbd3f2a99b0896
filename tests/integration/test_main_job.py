"""The main job end to end through the real CLI, shortened: sweep -> analyze -> schedule ->
schedule-config -> train the schedule -> compare. Checks content and schema, not phenomena.

Also: the example sweep configs plan, and the new commands' bad input is one line, exit 2.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from tests.support.cli import assert_one_line_error, twoclocks

pytestmark = pytest.mark.tiny_model

ROOT = Path(__file__).resolve().parents[2]

SWEEP = """
name = "mini"
backend = "grpo"
sample_budget = 1536
executor = "local"
workdir = "{workdir}"

[scaling]
reference_batch = 16
reference_lr = 3e-4
rule = "sqrt"

[grid]
batch = [2, 8]
group_size = 8
seeds = [0]

[trainer]
num_minibatches = 2
micro_batch_size = 4
eval_every_samples = 256
eval_size = 64
kl_init_every = 0
checkpoint_every_steps = 0
threads = 1

[local]
threads_per_job = 1
max_parallel = 2
"""


def _ok(proc):
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr
    return proc


def _on_its_cluster(tmp_path) -> tuple[Path, dict]:
    """The SLURM example as it plans where it runs: its data files exist and its reward module
    is on PYTHONPATH (both in tmp_path), and, where vLLM is not installed here, after plan has
    refused it by name, with the HF engine. Returns the config and the environment."""
    import importlib.util

    text = (ROOT / "examples" / "qwen2.5-math-1.5b-slurm.toml").read_text()
    rows = "".join(json.dumps({"problem": f"{i}+1", "answer": str(i + 1)}) + "\n"
                   for i in range(600))
    for name in ("train.jsonl", "test500.jsonl"):
        (tmp_path / name).write_text(rows)
        text = text.replace(f"/data/math/{name}", str(tmp_path / name))
    (tmp_path / "my_rewards.py").write_text("def math_boxed(completions, answers):\n"
                                            "    return [0.0 for _ in completions]\n")
    config = tmp_path / "qwen.toml"
    config.write_text(text)
    env = {"PYTHONPATH": str(tmp_path)}
    if importlib.util.find_spec("vllm") is None:
        assert_one_line_error(twoclocks("plan", str(config), env=env), "rollout_engine", "vllm")
        config.write_text(text.replace('rollout_engine = "vllm"', 'rollout_engine = "hf"'))
    return config, env


@pytest.mark.parametrize("example", ["tiny-arith-sweep.toml", "qwen2.5-math-1.5b-slurm.toml"])
def test_examples_plan(example, tmp_path):
    """Both shipped sweep configs plan: 16x batch range, sqrt lr, cells valid for the trainer."""
    from trainer.config import TrainConfig

    path, env = ROOT / "examples" / example, None
    if example.startswith("qwen"):
        path, env = _on_its_cluster(tmp_path)
    data = json.loads(_ok(twoclocks("plan", str(path), "--json", env=env)).stdout)
    cells = data["cells"]
    batches = sorted({c["batch_samples"] for c in cells})
    assert batches[-1] == 16 * batches[0]
    for c in cells:  # sqrt scaling: lr / sqrt(B) is one constant
        assert c["lr"] / c["batch_samples"] ** 0.5 == pytest.approx(
            cells[0]["lr"] / cells[0]["batch_samples"] ** 0.5, rel=1e-9)
        TrainConfig.from_dict(c["config"], source=example)


def test_bad_input_is_one_line(tmp_path):
    db = f"sqlite:///{tmp_path / 's.db'}"
    assert_one_line_error(twoclocks("compare", "nope", "--run", "1", "--db", db), "nope")
    bad = tmp_path / "phases.toml"
    bad.write_text("lr = 1\n")
    assert_one_line_error(
        twoclocks("schedule-config", "nope", str(bad), "--out", str(tmp_path / "t.toml"),
                  "--db", db), "phases")
    assert_one_line_error(
        twoclocks("schedule-config", "nope", str(tmp_path / "missing.toml"), "--out",
                  str(tmp_path / "t.toml"), "--db", db), "not found")
    assert not (tmp_path / "t.toml").exists()


@pytest.mark.slow
def test_main_job_end_to_end(tmp_path):
    from trainer.tiny import ensure_tiny_model

    ensure_tiny_model(0)  # built once into the user cache (shared with the trainer tests)
    db = f"sqlite:///{tmp_path / 'demo.db'}"
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(SWEEP.format(workdir=tmp_path / "runs"))

    _ok(twoclocks("sweep", str(cfg), "--db", db, "--wait", cwd=tmp_path, timeout=900))

    analysis = json.loads(_ok(twoclocks("analyze", "mini", "--db", db, "--json", "--save",
                                        "--plot", str(tmp_path / "clocks.png"))).stdout)
    assert analysis["metric"] == "eval_accuracy"
    assert [b["batch_samples"] for b in analysis["batches"]] == [16, 64]
    assert len(analysis["runs"]) == 2 and all(r["status"] == "completed" for r in analysis["runs"])
    assert (tmp_path / "clocks.png").stat().st_size > 0

    phases_file = tmp_path / "schedule.toml"
    proc = twoclocks("schedule", "mini", "--db", db, "--json", "--out", str(phases_file))
    if all(b["progress"]["median"] is None for b in analysis["batches"]):
        # 1,536 samples rarely teach the tiny model anything: the honest answer is no schedule
        # (never one that starts from a censored batch); the rest of the chain then runs a
        # two-phase list written by hand from the sweep's own cells
        assert_one_line_error(proc, "no batch size reached the target", "suggest")
        assert not phases_file.exists()
        lr = {r["batch_samples"]: r["lr"] for r in analysis["runs"]}
        sched = {"phases": [
            {"until_samples": 768, "prompts_per_batch": 2, "lr": lr[16]},
            {"until_samples": 1536, "prompts_per_batch": 8, "lr": lr[64]},
        ]}
        from twoclocks_cli.core.toml import dumps

        phases_file.write_text(dumps(sched))
    else:
        sched = json.loads(_ok(proc).stdout)
    assert sched["phases"] and tomllib.loads(phases_file.read_text())["phases"]

    train_cfg = tmp_path / "schedule-train.toml"
    doc = json.loads(_ok(twoclocks("schedule-config", "mini", str(phases_file), "--db", db,
                                   "--out", str(train_cfg), "--json")).stdout)
    written = tomllib.loads(train_cfg.read_text())
    assert doc["out"] == str(train_cfg.resolve()) and doc["phases"] == len(sched["phases"])
    assert doc["config"] == written and doc["sample_budget"] == written["sample_budget"]
    # the run stops where the schedule's last phase ends (the budget, or a predicted failure)
    assert written["sample_budget"] == sched["phases"][-1]["until_samples"] <= 1536
    assert written["num_minibatches"] == 2
    assert [p["prompts_per_batch"] for p in written["phases"]] == \
        [p["prompts_per_batch"] for p in sched["phases"]]

    workdir = tmp_path / "schedule-run"
    _ok(twoclocks("train", str(train_cfg), "--db", db, "--name", "mini-schedule",
                  "--workdir", str(workdir), cwd=tmp_path, timeout=900))
    run_id = json.loads((workdir / "run.json").read_text())["run_id"]

    out = json.loads(_ok(twoclocks("compare", "mini", "--run", str(run_id), "--db", db,
                                   "--json")).stdout)
    assert set(out) >= {"sweep", "metric", "target", "options", "constant", "schedule", "verdict"}
    assert out["target"]["value"] == analysis["target"]["value"]
    assert [c["batch_samples"] for c in out["constant"]] == [16, 64]
    s = out["schedule"]
    assert s["run_id"] == run_id and s["status"] == "completed"
    # the phases the run actually trained, read back from its per-step metrics
    assert [p["prompts_per_batch"] for p in s["phases"]] == \
        [p["prompts_per_batch"] for p in sched["phases"]]
    assert s["phases"][0]["from_samples"] == 0
    assert s["phases"][-1]["to_samples"] >= written["sample_budget"]
    assert sum(p["steps"] for p in s["phases"]) > 0
    for clock in (s["progress"], s["failure"]):
        assert (clock["samples"] is None) == clock["censored"]
    assert out["verdict"] and all(isinstance(v, str) for v in out["verdict"])
    table = _ok(twoclocks("compare", "mini", "--run", str(run_id), "--db", db)).stdout
    assert "schedule" in table and "constant" in table
    _check_time_from_logged_timings(out, db, run_id)


def _check_time_from_logged_timings(out: dict, db: str, run_id: int) -> None:
    """The trainer logs each step's seconds (time_gen_s + time_reward_s + time_update_s): the
    constant batches' seconds per sample are their median, and the schedule run's time to each
    clock walks its logged steps at its batch's rate, both recomputed here from the store."""
    import numpy as np

    from twoclocks_cli.store import Store

    time = out["time"]
    assert time is not None and time["source"] == "measured", out.get("time_note")
    store = Store.open(db)
    keys = ("time_gen_s", "time_reward_s", "time_update_s")

    def per_step(rid):
        parts = [store.load_metric([rid], k)[rid] for k in keys]
        batch = store.load_metric([rid], "batch_samples")[rid]
        assert all(np.array_equal(p.steps, batch.steps) for p in parts)
        return batch.samples, batch.values, sum(p.values for p in parts)

    rate = {}
    for row in time["batches"]:
        b = row["batch_samples"]
        runs = [r.id for r in store.list_runs("mini") if r.batch_samples == b
                and r.id != run_id and not (r.config or {}).get("phases")]
        per = np.concatenate([t / bs for _, bs, t in map(per_step, runs)])
        rate[b] = float(np.median(per))
        assert row["throughput"]["seconds_per_sample"] == pytest.approx(rate[b])
        assert row["throughput"]["steps"] == per.size
    samples, batch, seconds = per_step(run_id)

    def walk(n):
        """Seconds to `n` samples: each logged step's samples below n at its batch's rate."""
        start = samples - batch
        return sum(max(0.0, min(n, e) - s) * rate[b] for s, e, b in zip(start, samples, batch,
                                                                       strict=True))

    sched = out["schedule"]
    for clock in ("progress", "failure"):
        got = time["schedule"][clock]
        if sched[clock]["samples"] is not None:
            assert got["seconds"] == pytest.approx(walk(sched[clock]["samples"]))
            own = float(np.interp(sched[clock]["samples"], samples, np.cumsum(seconds)))
            assert time["schedule"]["logged_seconds"][clock] == pytest.approx(own)
        else:
            assert got["seconds"] is None and got["lower_bound"] is not None
            assert got["lower_bound"] <= walk(sched[clock]["censored_at"]) * (1 + 1e-9)
            if clock == "progress":
                assert any(v.startswith("time: the schedule did not reach the target; it "
                                        "trained >= ") for v in out["verdict"]), out["verdict"]
    store.close()


def test_train_config_toml_round_trips():
    """What schedule-config writes is read back by tomllib unchanged (floats, lists, phases)."""
    from twoclocks_cli.launch.schedule_run import to_toml

    cfg = {"model": 'a "quoted" \\ path', "lr": 1.5e-05, "threads": 1, "skip_zero_advantage": True,
           "arith_ops": ["+", "-"], "phases": [
               {"until_samples": 4096, "prompts_per_batch": 4, "lr": 1e-4, "clip_eps_low": 0.2},
               {"prompts_per_batch": 64, "lr": 4e-4}]}
    assert tomllib.loads(to_toml(cfg, ["header"])) == cfg


def test_phase_summary_reads_the_recorded_phases(sqlite_url):
    """Phases come back from the per-step metrics: boundaries, prompts, lr (as at the phase's
    last step: phase 0 is still warming up, 0.25e-4 .. 0.75e-4), step counts."""
    from twoclocks_cli.clocks.compare import phase_summary
    from twoclocks_cli.store import Store
    from twoclocks_cli.store.models import Run

    store = Store.open(sqlite_url)
    with store.session() as s:
        run = Run(cell_id="c", name="r", backend="grpo")
        s.add(run)
        s.flush()
        rid = run.id
    samples = 0
    with store.metric_writer(rid) as w:
        warm = [(0, 4, 0.25e-4), (0, 4, 0.5e-4), (0, 4, 0.75e-4)]
        for step, (phase, prompts, lr) in enumerate(warm + [(1, 16, 2e-4)] * 2):
            samples += prompts * 8
            w.log(step, samples, {"phase": phase, "prompts": prompts, "lr": lr,
                                  "batch_samples": prompts * 8})
    got = phase_summary(store, rid)
    assert got == [
        {"phase": 0, "from_samples": 0.0, "to_samples": 96.0, "steps": 3,
         "prompts_per_batch": 4, "batch_samples": 32.0, "lr": 0.75e-4},
        {"phase": 1, "from_samples": 96.0, "to_samples": 352.0, "steps": 2,
         "prompts_per_batch": 16, "batch_samples": 128.0, "lr": 2e-4},
    ]
