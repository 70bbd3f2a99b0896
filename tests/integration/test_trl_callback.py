"""`TwoClocksCallback` on a real TRL GRPOTrainer (the tiny model, real math-verify rewards, CPU):
every log of the trainer lands in the store under the importer's names, at the samples the
trainer's own counters give, the run goes running -> completed (or failed when training raises),
and an attached rerun stores each step once. The truth is the trainer's own `log_history`."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="the trl extra is not installed")
pytestmark = [pytest.mark.slow, pytest.mark.tiny_model]

SCRIPT = r"""
import json, sys
import numpy as np, pyarrow as pa, torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer
from trainer.data import ArithmeticTask, Problem, render_prompt
from trainer.rewards import MathVerifyReward
from trainer.tiny import ensure_tiny_model
from twoclocks_cli.integrations.trl import TwoClocksCallback

db, out, name, per_device, accum, iters, steps, fail_at = sys.argv[1:9]
per_device, accum, iters, steps, fail_at = map(int, (per_device, accum, iters, steps, fail_at))
torch.set_num_threads(1)
path = ensure_tiny_model(0)
tok = AutoTokenizer.from_pretrained(path, padding_side="left")
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
task = ArithmeticTask()
def rows(n, seed):
    return [{"prompt": render_prompt(p, tok), "answer": p.answer}
            for p in task.sample(np.random.default_rng(seed), n)]
train = Dataset(pa.Table.from_pylist(rows(256, 0)), fingerprint="train")
held = Dataset(pa.Table.from_pylist(rows(16, 1)), fingerprint="held")
reward = MathVerifyReward()
calls = [0]
def correctness(prompts, completions, answer, **kw):
    calls[0] += 1
    if fail_at and calls[0] >= fail_at:
        raise RuntimeError("reward server went away")
    return reward(list(completions), [Problem("", a) for a in answer])
args = GRPOConfig(
    output_dir=out, run_name=name, per_device_train_batch_size=per_device,
    gradient_accumulation_steps=accum, num_generations=4, num_iterations=iters,
    max_completion_length=12, learning_rate=1e-4, temperature=1.0, lr_scheduler_type="constant",
    beta=0.0,
    bf16=False, fp16=False, gradient_checkpointing=False, use_cpu=True, max_steps=steps,
    logging_steps=1, eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=16,
    save_strategy="no", report_to=[], seed=0, disable_tqdm=True, dataloader_num_workers=0)
trainer = GRPOTrainer(model=model, reward_funcs=correctness, args=args, train_dataset=train,
                      eval_dataset=held, processing_class=tok)
cb = TwoClocksCallback(db=db, sweep="trl-live", name=name)
trainer.add_callback(cb)
try:
    trainer.train()
finally:
    with open(out + "/history.json", "w") as fh:
        json.dump({"history": trainer.state.log_history, "run_id": cb.run_id}, fh)
    reward.close()
"""


def _run(tmp_path: Path, name: str, per_device=8, accum=1, iters=1, steps=4, fail_at=0):
    out = tmp_path / name
    out.mkdir()
    db = tmp_path / "s.db"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, f"sqlite:///{db}", str(out), name, str(per_device),
         str(accum), str(iters), str(steps), str(fail_at)],
        capture_output=True, text=True, timeout=900, env=env)
    hist = json.loads((out / "history.json").read_text())
    return proc, hist, db


def _metrics(db: Path, run_id: int) -> dict:
    with sqlite3.connect(db) as con:
        rows = con.execute("select step, samples, key, value from metrics where run_id=?",
                           (run_id,)).fetchall()
    return {(step, key): (samples, value) for step, samples, key, value in rows}


def _run_row(db: Path, run_id: int):
    with sqlite3.connect(db) as con:
        return con.execute("select status, batch_samples, batch_prompts, group_size, lr, seed "
                           "from runs where id=?", (run_id,)).fetchone()


def test_every_log_of_a_grpo_trainer_lands_at_the_trainers_own_samples(tmp_path):
    # 8 completions per device, 2 accumulation steps, 2 iterations per generation:
    # 8 x 1 x 2 / 2 = 8 fresh completions per optimizer step (2 prompts x 4 generations)
    proc, hist, db = _run(tmp_path, "ga2-mu2", per_device=8, accum=2, iters=2, steps=4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id = hist["run_id"]
    assert _run_row(db, run_id) == ("completed", 8, 2, 4, 1e-4, 0)
    got = _metrics(db, run_id)
    train = [h for h in hist["history"] if "loss" in h]
    evals = [h for h in hist["history"] if "eval_reward" in h]
    assert [h["step"] for h in train] == [1, 2, 3, 4] and len(evals) == 2
    for h in train:  # every optimizer step's log, at the trainer's own samples
        step = h["step"]
        assert got[(step, "loss")] == (8 * step, pytest.approx(h["loss"]))
        assert got[(step, "lr")][1] == pytest.approx(h["learning_rate"])
    # with 2 iterations per generation TRL reports rollout metrics on generation steps only
    rollout = [h for h in train if "reward" in h]
    assert [h["step"] for h in rollout] == [1, 3]
    assert any(h["reward"] > 0 for h in rollout + evals)  # a test of numbers, not of zeros
    for h in rollout:  # the trainer's own numbers, under the importer's names
        step = h["step"]
        assert got[(step, "reward_mean")] == (8 * step, pytest.approx(h["reward"]))
        assert got[(step, "accuracy")][1] == pytest.approx(h["rewards/correctness/mean"])
        assert got[(step, "resp_len_mean")][1] == pytest.approx(h["completions/mean_length"])
    for h in evals:
        assert got[(h["step"], "eval_accuracy")][1] == pytest.approx(
            h["eval_rewards/correctness/mean"])
    # the importer reads the same numbers from the trainer's own trainer_state.json layout
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"log_history": hist["history"], "train_batch_size": 8}))
    from twoclocks_cli.ingest import IngestOptions, parse_file

    log = parse_file(state, IngestOptions(fmt="trl"))
    for (step, key), (_, value) in got.items():
        assert log.steps[step][key] == pytest.approx(value), (step, key)


def test_a_failing_trainer_marks_the_run_failed_and_a_rerun_attaches(tmp_path):
    proc, hist, db = _run(tmp_path, "boom", per_device=8, steps=4, fail_at=3)
    assert proc.returncode != 0 and "reward server went away" in proc.stderr
    run_id = hist["run_id"]
    assert _run_row(db, run_id)[0] == "failed"
    before = _metrics(db, run_id)
    assert {s for s, _ in before} == {1, 2}  # the steps logged before the reward call failed
    # the job is requeued under the same name: the same run, each step stored once
    (tmp_path / "boom").rename(tmp_path / "boom-1")
    proc, hist2, db = _run(tmp_path, "boom", per_device=8, steps=4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert hist2["run_id"] == run_id and _run_row(db, run_id)[0] == "completed"
    with sqlite3.connect(db) as con:
        dup = con.execute("select count(*) from (select step, key, count(*) c from metrics "
                          "where run_id=? group by step, key having c > 1)", (run_id,)).fetchone()
    assert dup == (0,)
    assert {s for s, _ in _metrics(db, run_id)} == {1, 2, 3, 4}
