"""Data parallel through accelerate: 2 CPU processes (gloo; DDP, and FSDP2 selected by
accelerate's `--use_fsdp --fsdp_version 2`) train exactly what 1 does.

`ddp_driver.py` runs the real `train()` on the tiny model, alone and under `accelerate launch`
with 2 processes, on the same global batch each step (the prompts are one stream in any world
size; the driver samples each step's completions for the whole batch from one seed and hands
each rank its rows). Every metric of every step, and the final parameters, agree to 1e-5. The
gradient-noise terms keep their meaning: grad_sq_micro is ||g||^2 of the first micro-batch's own
mean loss (under DDP rank 0's; under FSDP, whose gradients are reduce-scattered after every
micro-batch, both ranks' first micro-batches together), grad_sq_full that of the whole batch,
each checked against a plain backward.
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

pytestmark = [pytest.mark.slow, pytest.mark.tiny_model]

DRIVER = Path(__file__).with_name("ddp_driver.py")
TIMING = {"time_gen_s", "time_reward_s", "time_update_s", "tokens_per_s"}


@pytest.fixture(scope="module")
def one_process(tiny_model, tmp_path_factory):
    """The single-process reference run per ppo_epochs, run once per module (and worker)."""
    runs: dict[int, dict] = {}

    def get(ppo_epochs: int) -> dict:
        if ppo_epochs not in runs:
            runs[ppo_epochs] = _run(tmp_path_factory.mktemp("one"), 1, ppo_epochs)
        return runs[ppo_epochs]

    return get


MODES = {"ddp": ["--multi_gpu"], "fsdp": ["--use_fsdp", "--fsdp_version", "2"]}


def _run(tmp_path: Path, world: int, ppo_epochs: int, mode: str = "ddp",
         extra: tuple[str, ...] = (), workdir: Path | None = None) -> dict:
    """The driver's JSON after a run with `world` processes (`mode`: accelerate's DDP or FSDP;
    `extra`: more driver arguments; `workdir`: the checkpoint directory, default a new one)."""
    tag = f"{world}-{ppo_epochs}-{mode}{'-'.join(Path(e).name for e in extra)}"
    out, work = tmp_path / f"o{tag}.json", workdir or tmp_path / f"w{tag}"
    cmd = [sys.executable, str(DRIVER), str(out), str(work), "--ppo-epochs", str(ppo_epochs),
           *extra]
    if world > 1:
        accelerate = shutil.which("accelerate", path=os.path.dirname(sys.executable))
        cmd = [accelerate, "launch", *MODES[mode], "--num_processes", str(world),
               "--num_machines", "1", "--main_process_port", str(free_port()),
               "--mixed_precision", "no", "--dynamo_backend", "no", *cmd[1:]]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def _close(a: float, b: float, tol: float = 1e-5) -> bool:
    return abs(a - b) <= tol * max(abs(a), abs(b), 1e-3)


# the first micro-batch whose gradient grad_sq_micro measures: rank 0's rows 0-7 alone and under
# DDP (no sync before the last micro-batch); under FSDP both ranks' first 8 rows (0-7, 16-23)
MICRO_ROWS = {"ddp": list(range(8)), "fsdp": list(range(8)) + list(range(16, 24))}
NOISE_MICRO = {"ddp": set(), "fsdp": {"grad_sq_micro", "grad_micro_size"}}  # differ by design


def _same_run(one: dict, two: dict, mode: str) -> None:
    """Every metric of every step and the final parameters agree between the two runs."""
    assert (one["world"], two["world"]) == (1, 2)
    assert one["status"] == two["status"] == "completed"
    assert one["first_rollout"] == two["first_rollout"]  # the same data
    assert sorted(one["rows"]) == sorted(two["rows"]) == ["1", "2", "3"]
    differs = NOISE_MICRO[mode]
    for step, row in one["rows"].items():
        assert set(row) == set(two["rows"][step])
        for key in set(row) - TIMING - differs:
            a, b = row[key], two["rows"][step][key]
            # the sampler's gap is float rounding itself (~1e-7): equal to rounding, absolutely
            same = abs(a - b) < 1e-6 if key.startswith("sampler_") else _close(a, b)
            assert same, (step, key, a, b)
        assert row["batch_samples"] == 32 and row["grad_full_size"] == 32
        assert row["grad_micro_size"] == 8
        assert two["rows"][step]["grad_micro_size"] == len(MICRO_ROWS[mode])
    assert one["rows"]["3"]["drift_abs"] > 0  # the model moved, identically in both
    assert _close(one["param_sum"], two["param_sum"]) and _close(one["param_sq"], two["param_sq"])


@pytest.mark.parametrize("ppo_epochs", [1, 2])
def test_two_processes_train_what_one_does(one_process, tmp_path, ppo_epochs):
    one, two = one_process(ppo_epochs), _run(tmp_path, 2, ppo_epochs)
    _same_run(one, two, "ddp")
    if ppo_epochs == 1:
        _check_noise_terms(one, MICRO_ROWS["ddp"])


@pytest.mark.parametrize("ppo_epochs", [1, 2])
def test_fsdp_two_processes_train_what_one_does(one_process, tmp_path, ppo_epochs):
    """FSDP2 on 2 CPU processes: each rank holds half of every parameter and AdamW moment,
    yet every metric, the checkpointed (gathered) parameters and the noise terms' meaning
    match one process."""
    one, two = one_process(ppo_epochs), _run(tmp_path, 2, ppo_epochs, "fsdp")
    assert two["sharded"] and 0.4 < two["local_fraction"] < 0.6  # rank 0 holds about half
    assert two["engine_unsharded"] and not one["sharded"] and one["local_fraction"] == 1.0
    # the frozen reference (kl_init every step at two updates per batch) is sharded as well
    assert two["sharded_models"] == (2 if ppo_epochs == 2 else 1)
    _same_run(one, two, "fsdp")
    if ppo_epochs == 1:
        _check_noise_terms(two, MICRO_ROWS["fsdp"])


def test_fsdp_shards_untied_embeddings_and_head_as_units_of_their_own(tiny_model, tmp_path):
    """An untied model (the tiny one with its LM head made a separate copy of the embeddings):
    FSDP makes the input embeddings and the LM head units of their own; 2 sharded processes
    still train what 1 does."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    untied = tmp_path / "untied"
    model.save_pretrained(untied)
    AutoTokenizer.from_pretrained(str(tiny_model)).save_pretrained(untied)
    extra = ("--model", str(untied))
    one, two = _run(tmp_path, 1, 1, extra=extra), _run(tmp_path, 2, 1, "fsdp", extra=extra)
    assert two["units"] == 4 + 2 + 1 and one["units"] == 0  # layers, embeddings, head, root
    _same_run(one, two, "fsdp")


def test_fsdp_checkpoint_resumes_exactly_in_any_world(one_process, tmp_path):
    """A sharded run checkpointed after 2 steps (full tensors, the single-process layout)
    resumes under FSDP and in one process; each third step equals the uninterrupted run's."""
    one = one_process(1)
    half = _run(tmp_path, 2, 1, "fsdp", extra=("--budget", "64"))
    assert sorted(half["rows"]) == ["1", "2"]
    for mode, world in (("fsdp", 2), ("ddp", 1)):
        work = tmp_path / f"resume-{mode}"
        shutil.copytree(tmp_path / "w2-1-fsdp--budget-64", work)
        rest = _run(tmp_path, world, 1, mode, extra=("--budget", "96", "--first-call", "2"),
                    workdir=work)
        assert sorted(rest["rows"]) == ["3"], mode
        for key in set(one["rows"]["3"]) - TIMING - NOISE_MICRO[mode]:
            a, b = one["rows"]["3"][key], rest["rows"]["3"][key]
            assert _close(a, b), (mode, key, a, b)
        assert _close(one["param_sum"], rest["param_sum"]), mode
        assert _close(one["param_sq"], rest["param_sq"]), mode


def _check_noise_terms(run: dict, micro_rows: list[int]) -> None:
    """Step 1's grad_sq_micro / grad_sq_full against one plain backward each, on the initial
    model: the first micro-batch's rows over their own normaliser, and all 32."""
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
    for rows, key in ((torch.tensor(micro_rows), "grad_sq_micro"),
                      (torch.arange(32), "grad_sq_full")):
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


def test_fsdp_version_1_is_refused_in_one_line(tiny_model, tmp_path):
    """accelerate's FSDP1 is not supported (the trainer shards with FSDP2): one line naming
    the setting and what to pass instead, and no store written."""
    accelerate = shutil.which("accelerate", path=os.path.dirname(sys.executable))
    (tmp_path / "t.toml").write_text("prompts_per_batch = 8\ngroup_size = 4\nthreads = 1\n")
    db = tmp_path / "s.db"
    proc = subprocess.run(
        [accelerate, "launch", "--use_fsdp", "--fsdp_version", "1", "--num_processes", "2",
         "--num_machines", "1", "--main_process_port", str(free_port()), "--mixed_precision",
         "no", "--dynamo_backend", "no",
         os.path.join(os.path.dirname(sys.executable), "twoclocks"), "train",
         str(tmp_path / "t.toml"), "--db", f"sqlite:///{db}", "--workdir", str(tmp_path / "w")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert lines and all("FSDP_VERSION" in ln and "--fsdp_version 2" in ln for ln in lines)
    # (accelerate's launcher prints its own traceback of the failed child; ours is one line)
    assert "internal error" not in proc.stderr
    assert not any(ln.startswith("[rank") and "Traceback" in ln for ln in proc.stderr.splitlines())
    assert not db.exists()
