"""Data parallel through accelerate: 2 CPU processes (gloo, DDP) train exactly what 1 does.

`ddp_driver.py` runs the real `train()` on the tiny model, alone and under `accelerate launch`
with 2 processes, on the same global batch each step (the prompts are one stream in any world
size; the driver samples each step's completions for the whole batch from one seed and hands
each rank its rows). Every metric of every step, and the final parameters, agree to 1e-5. The
gradient-noise terms keep their meaning: grad_sq_micro is ||g||^2 of the first micro-batch's own
mean loss, grad_sq_full that of the whole batch (both ranks), checked against a plain backward.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.cli import free_port

pytestmark = pytest.mark.slow

DRIVER = Path(__file__).with_name("ddp_driver.py")
TIMING = {"time_gen_s", "time_reward_s", "time_update_s", "tokens_per_s"}


@pytest.fixture(scope="module")
def tiny_model():
    from trainer.tiny import ensure_tiny_model

    return ensure_tiny_model(0)


def _run(tmp_path: Path, world: int, ppo_epochs: int) -> dict:
    """The driver's JSON after a run with `world` processes."""
    out, work = tmp_path / f"o{world}-{ppo_epochs}.json", tmp_path / f"w{world}-{ppo_epochs}"
    cmd = [sys.executable, str(DRIVER), str(out), str(work), str(ppo_epochs)]
    if world > 1:
        accelerate = shutil.which("accelerate", path=os.path.dirname(sys.executable))
        cmd = [accelerate, "launch", "--multi_gpu", "--num_processes", str(world),
               "--num_machines", "1", "--main_process_port", str(free_port()),
               "--mixed_precision", "no", "--dynamo_backend", "no", *cmd[1:]]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def _close(a: float, b: float, tol: float = 1e-5) -> bool:
    return abs(a - b) <= tol * max(abs(a), abs(b), 1e-3)


@pytest.mark.parametrize("ppo_epochs", [1, 2])
def test_two_processes_train_what_one_does(tiny_model, tmp_path, ppo_epochs):
    one, two = _run(tmp_path, 1, ppo_epochs), _run(tmp_path, 2, ppo_epochs)
    assert (one["world"], two["world"]) == (1, 2)
    assert one["status"] == two["status"] == "completed"
    assert one["first_rollout"] == two["first_rollout"]  # the same data
    assert sorted(one["rows"]) == sorted(two["rows"]) == ["1", "2", "3"]
    for step, row in one["rows"].items():
        assert set(row) == set(two["rows"][step])
        for key in set(row) - TIMING:
            a, b = row[key], two["rows"][step][key]
            # the sampler's gap is float rounding itself (~1e-7): equal to rounding, absolutely
            same = abs(a - b) < 1e-6 if key.startswith("sampler_") else _close(a, b)
            assert same, (step, key, a, b)
        assert row["batch_samples"] == 32 and row["grad_full_size"] == 32
        assert row["grad_micro_size"] == 8
    assert one["rows"]["3"]["drift_abs"] > 0  # the model moved, identically in both
    assert _close(one["param_sum"], two["param_sum"]) and _close(one["param_sq"], two["param_sq"])
    if ppo_epochs == 1:
        _check_noise_terms(one)


def _check_noise_terms(run: dict) -> None:
    """Step 1's grad_sq_micro / grad_sq_full against one plain backward each, on the initial
    model: rows 0-7 (the first micro-batch, rank 0's) over their own normaliser, and all 32."""
    from trainer import grpo
    from trainer.logprobs import completion_logprobs
    from trainer.loop import load_data, load_model
    from trainer.rewards import load_reward
    from trainer.rollout import Rollout

    sys.path.insert(0, str(DRIVER.parent))
    from ddp_driver import config

    cfg = config(1)
    r = run["first_rollout"]
    roll = Rollout(torch.tensor(r["input_ids"]), torch.tensor(r["attention_mask"]),
                   torch.tensor(r["completion_mask"]), r["prompt_len"], r["texts"],
                   torch.zeros(len(r["texts"]), dtype=torch.bool))
    source, _ = load_data(cfg)
    problems = source.sample(np.random.default_rng([cfg.seed, 0]), cfg.prompts_per_batch)
    expanded = [p for p in problems for _ in range(cfg.group_size)]
    rewards = torch.tensor(load_reward(cfg.reward)(roll.texts, expanded), dtype=torch.float32)
    row = run["rows"]["1"]
    assert _close(float(rewards.mean()), row["reward_mean"])
    adv = grpo.group_advantages(rewards, cfg.group_size, cfg.advantage_scaling,
                                batch_std=float(rewards.double().std()))
    assert (adv != 0).any()  # a gradient to measure
    phase = cfg.phase_at(0)[1]
    for rows, key in ((torch.arange(8), "grad_sq_micro"), (torch.arange(32), "grad_sq_full")):
        _, _, model = load_model(cfg)
        part, m = roll.select(rows), roll.completion_mask[rows].float()
        logp, _ = completion_logprobs(model, part, cfg.temperature)
        tok_loss, _, _ = grpo.clipped_surrogate(logp, logp.detach(), adv[rows],
                                                phase.clip_eps_low, phase.clip_eps_high)
        grpo.aggregate(tok_loss, m, cfg.loss_agg, cfg.max_new_tokens,
                       grpo.normaliser(m, cfg.loss_agg)).backward()
        want = sum(float(p.grad.double().square().sum()) for p in model.parameters()
                   if p.grad is not None)
        assert want > 0 and _close(row[key], want), (key, row[key], want)
    assert row["grad_sq_micro"] != row["grad_sq_full"]


def test_fsdp_is_refused_in_one_line(tiny_model, tmp_path):
    """accelerate's FSDP (which also needs a GPU here) is not supported: one line, no store."""
    accelerate = shutil.which("accelerate", path=os.path.dirname(sys.executable))
    (tmp_path / "t.toml").write_text("prompts_per_batch = 8\ngroup_size = 4\nthreads = 1\n")
    db = tmp_path / "s.db"
    proc = subprocess.run(
        [accelerate, "launch", "--use_fsdp", "--num_processes", "2", "--num_machines", "1",
         "--main_process_port", str(free_port()), "--mixed_precision", "no",
         "--dynamo_backend", "no",
         os.path.join(os.path.dirname(sys.executable), "twoclocks"), "train",
         str(tmp_path / "t.toml"), "--db", f"sqlite:///{db}", "--workdir", str(tmp_path / "w")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert lines and all("ACCELERATE_USE_FSDP=true" in ln and "DDP only" in ln for ln in lines)
    assert "internal error" not in proc.stderr
    assert not db.exists()
