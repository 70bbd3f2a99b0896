"""Trainer throughput: samples/s of twoclocks' GRPO loop vs TRL's GRPOTrainer, same run, same setup.

Both train `builtin:tiny-arith` on the synthetic task with G=8, 16 prompts per batch (128
samples, all in one forward/backward: our micro_batch_size = TRL's per_device_train_batch_size
= 128), 12 new tokens, fp32, lr 1e-4, token-mean loss, the same reward (strict format policy +
math-verify pool), no KL, no eval, no gradient checkpointing, for ~2k samples, and one update per
batch or, with `--updates 2`, two (our ppo_epochs = 2; TRL's num_iterations = 2, which reuses
each generation for two optimizer steps). Throughput is generated samples per second over the
steps after the first (warm-up excluded). The headline does TRL's work: no KL-to-init metric and
no gradient-noise terms (kl_init_every = noise_every = 0; TRL computes neither); a second run of
ours with both at every step shows what they cost.
TRL is not a dependency: it runs in a subprocess when `trl` (and `datasets`) import, from the
environment or from `--trl-path DIR` (e.g. `pip install --target DIR --no-deps trl datasets
pandas pyarrow dill multiprocess xxhash`). Target: ours / TRL >= 1.5.

`--few-shot` puts the same two worked examples in front of every question for both trainers
(prompts of ~50 tokens instead of 6, as chat templates and few-shot prompts make them): the
share of the work a prompt has, which this trainer runs once per group, grows with its length.
The tiny model was never trained on such prompts and answers none of them right, so every group
has zero advantage; this trainer's skipping of such samples is switched off in this mode, so the
ratio shows the prompt sharing alone (both trainers do the full forward/backward).

`--smollm2` runs both on SmolLM2-135M-Instruct (`builtin:smollm2-135m`) with
`examples/smollm2-train.toml`'s task: its chat-template prompt, the final-answer reward, T = 0.7,
4 prompts x 8 samples, 24 new tokens, lr 1e-5 (default 192 samples: 6 steps, 2..6 timed).
Target there: ours / TRL >= 2.

    python bench/trainer_throughput.py [--samples 2048] [--trl-path DIR] [--threads 2] [--repeats 3]
                                       [--few-shot] [--updates 1|2] [--hf-decoder auto|generate]
                                       [--smollm2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

P, G, NEW_TOKENS, LR = 16, 8, 12, 1e-4
TEMPERATURE, REWARD = 1.0, "math-verify"
TASK: dict = {}  # the arithmetic task's options (ArithmeticTask's keyword arguments)
FEW_SHOT = "Answer in \\boxed{{}}.\n12+30=\\boxed{{42}}\n75-9=\\boxed{{66}}\n{question}="


class _Times:
    """Metric sink keeping each step's generation / reward / update seconds."""

    KEYS = ("time_gen_s", "time_reward_s", "time_update_s")

    def __init__(self):
        self.rows: list[dict] = []

    def log(self, step, samples, values):
        if step > 1:  # warm-up excluded, as for the rate
            self.rows.append({k: values[k] for k in self.KEYS if k in values})

    def flush(self):
        pass

    def event(self, message):  # a warning of the run (e.g. no learning signal): not timed
        pass

    def medians_ms(self) -> dict[str, float]:
        import statistics

        return {k: round(1000 * statistics.median(r[k] for r in self.rows), 1)
                for k in self.KEYS}


def ours(model: str, samples: int, threads: int, all_metrics: bool, template: str | None,
         updates: int, decoder: str = "auto", few_shot: bool = False,
         ) -> tuple[float, dict[str, float]]:
    """(samples/s of trainer.loop.train over steps 2..N, median step times in ms)."""
    from trainer.config import TrainConfig
    from trainer.loop import train
    from trainer.rewards import _parse

    # every run starts with math-verify's parse cache cold, as TRL's fresh process does: this
    # process runs ours several times over the same problems, and the reward pool's workers
    # fork from it
    _parse.cache_clear()

    cfg = TrainConfig(
        model=model,
        prompts_per_batch=P,
        group_size=G,
        max_new_tokens=NEW_TOKENS,
        lr=LR,
        temperature=TEMPERATURE,
        reward=REWARD,
        **{f"arith_{k}": v for k, v in TASK.items()},
        sample_budget=samples,
        eval_every_samples=0,
        checkpoint_every_steps=0,
        kl_init_every=1 if all_metrics else 0,
        noise_every=1 if all_metrics else 0,  # TRL measures no gradient noise
        threads=threads,
        seed=0,
        prompt_template=template,
        skip_zero_advantage=not few_shot,  # see --few-shot in the docstring
        ppo_epochs=updates,
        hf_decoder=decoder,
        micro_batch_size=P * G,  # TRL's per_device_train_batch_size: the whole batch per pass
    )
    marks: list[tuple[float, int]] = []
    times = _Times()
    with tempfile.TemporaryDirectory() as work:
        train(
            cfg, times, Path(work),
            on_step=lambda p: marks.append((time.perf_counter(), p.samples)),
        )
    (t0, s0), (t1, s1) = marks[0], marks[-1]
    return round((s1 - s0) / (t1 - t0), 3), times.medians_ms()


TRL_SCRIPT = r"""
import json, sys, time
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
import numpy as np
from trainer.data import ArithmeticTask, render_prompt
from trainer.rewards import load_reward
from trainer.data import Problem

path, samples, threads, P, G, NEW, LR, out, template, updates, T, spec, task = sys.argv[1:14]
samples, threads, P, G, NEW, LR = int(samples), int(threads), int(P), int(G), int(NEW), float(LR)
updates, T = int(updates), float(T)
torch.set_num_threads(threads)
tok = AutoTokenizer.from_pretrained(path, padding_side="left")
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
problems = ArithmeticTask(**json.loads(task)).sample(np.random.default_rng(0), samples // G)
import pyarrow as pa
def prompt(p):
    return template.format(question=p.question) if template else render_prompt(p, tok)
rows = [{"prompt": prompt(p), "answer": p.answer} for p in problems]
# an explicit fingerprint: datasets 5.2 cannot hash a pyarrow 26 table
ds = Dataset(pa.Table.from_pylist(rows), fingerprint="bench")
reward = load_reward(spec)

def correctness(prompts, completions, answer, **kw):
    return reward(list(completions), [Problem("", a) for a in answer])

marks = []
class Clock(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        marks.append((time.perf_counter(), state.global_step))

args = GRPOConfig(
    output_dir=out, per_device_train_batch_size=P * G, gradient_accumulation_steps=1,
    num_generations=G, steps_per_generation=1, num_iterations=updates, max_completion_length=NEW,
    temperature=T, top_p=1.0, top_k=0, learning_rate=LR, lr_scheduler_type="constant",
    warmup_steps=0, beta=0.0, loss_type="dapo", scale_rewards="group", bf16=False, fp16=False,
    gradient_checkpointing=False, use_cpu=True, max_steps=samples // (P * G) * updates,
    logging_steps=1,
    save_strategy="no", report_to=[], seed=0, disable_tqdm=True, dataloader_num_workers=0,
)
trainer = GRPOTrainer(model=model, reward_funcs=correctness, args=args, train_dataset=ds,
                      processing_class=tok, callbacks=[Clock()])
trainer.train()
reward.close()
# from the end of the first generation's last update; each generation of P * G samples feeds
# `updates` optimizer steps
(t0, s0), (t1, s1) = marks[updates - 1], marks[-1]
print("RESULT " + json.dumps({"samples_per_s": (s1 - s0) * P * G / updates / (t1 - t0)}))
"""


def trl(
    model_dir: str, samples: int, threads: int, trl_path: str | None, template: str | None,
    updates: int,
) -> float | None:
    """samples/s of TRL's GRPOTrainer in a subprocess, or None when trl does not import."""
    env = dict(os.environ)
    if trl_path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [trl_path, env.get("PYTHONPATH")]))
    probe = subprocess.run(
        [sys.executable, "-c", "import trl, datasets"], env=env, capture_output=True
    )
    if probe.returncode:
        return None
    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                TRL_SCRIPT,
                model_dir,
                str(samples),
                str(threads),
                str(P),
                str(G),
                str(NEW_TOKENS),
                str(LR),
                out,
                template or "",
                str(updates),
                str(TEMPERATURE),
                REWARD,
                json.dumps(TASK),
            ],
            env=env,
            capture_output=True,
            text=True,
        )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return round(json.loads(line[7:])["samples_per_s"], 3)
    sys.stderr.write(proc.stderr[-3000:])
    raise SystemExit("TRL run failed (stderr above)")


def smollm2_setting(a) -> None:
    """Switch the module's settings to SmolLM2 on the shipped example's task."""
    import tomllib

    from trainer.smollm2 import SMOLLM2_ID
    from trainer.tiny import resolve_model_path

    global P, NEW_TOKENS, LR, TEMPERATURE, REWARD, TASK
    example = tomllib.loads((Path(__file__).resolve().parents[1] / "examples" /
                             "smollm2-train.toml").read_text())
    P, NEW_TOKENS, LR = example["prompts_per_batch"], example["max_new_tokens"], 1e-5
    TEMPERATURE, REWARD = example["temperature"], example["reward"]
    TASK = {"max_value": example["arith_max_value"], "ops": example["arith_ops"]}
    assert example["group_size"] == G
    a.model, a.template = str(resolve_model_path(SMOLLM2_ID)), example["prompt_template"]
    if a.samples == 2048:  # the tiny model's default: a minute a step here
        a.samples = 6 * P * G


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="Alternating runs of each trainer.")
    ap.add_argument("--trl-path", default=None, help="Directory holding trl and datasets.")
    ap.add_argument("--model", default="builtin:tiny-arith", help="Model id or directory.")
    ap.add_argument("--few-shot", action="store_true", help="Two worked examples per prompt.")
    ap.add_argument("--updates", type=int, choices=(1, 2), default=1,
                    help="Optimizer steps per rollout batch (ppo_epochs / num_iterations).")
    ap.add_argument("--hf-decoder", choices=("auto", "generate"), default="auto",
                    help="Our HF engine's sampler: its own decode loop, or transformers generate.")
    ap.add_argument("--smollm2", action="store_true",
                    help="SmolLM2-135M-Instruct on examples/smollm2-train.toml's task.")
    a = ap.parse_args()
    a.template = None
    if a.smollm2:
        smollm2_setting(a)
    import statistics

    import torch

    torch.set_num_threads(a.threads)
    from trainer.tiny import TINY_MODEL_ID, ensure_tiny_model

    model_dir = str(ensure_tiny_model(progress=True) if a.model == TINY_MODEL_ID else a.model)
    template = FEW_SHOT if a.few_shot else a.template
    if a.few_shot:
        print(f"prompts: few-shot template {template!r}")
    # alternate the two trainers, so a change in machine load hits both alike; report medians
    mine, theirs, breakdowns = [], [], []
    for _ in range(a.repeats):
        rate, step_ms = ours(model_dir, a.samples, a.threads, False, template, a.updates,
                             a.hf_decoder, a.few_shot)
        mine.append(rate)
        breakdowns.append(step_ms)
        t = trl(model_dir, a.samples, a.threads, a.trl_path, template, a.updates)
        if t is not None:
            theirs.append(t)
    full, _ = ours(model_dir, a.samples, a.threads, True, template, a.updates, a.hf_decoder,
                   a.few_shot)
    print(f"updates per batch: {a.updates}; our sampler: {a.hf_decoder}")
    med = {k: statistics.median(b[k] for b in breakdowns) for k in breakdowns[0]}
    print("our step (median ms over steps 2..N and runs): generation {time_gen_s}, reward "
          "{time_reward_s}, update {time_update_s}".format(**med))
    m = statistics.median(mine)
    print(f"twoclocks GRPO (TRL's work: no KL-to-init, no noise terms): {m:8.2f} samples/s  "
          f"runs {mine}")
    print(f"twoclocks GRPO (every metric: kl_init, noise terms each step): {full:8.2f} samples/s")
    if not theirs:
        print("TRL GRPOTrainer: trl/datasets not importable (see --trl-path); no ratio")
        return
    t = statistics.median(theirs)
    print(f"TRL GRPOTrainer:                                   {t:8.2f} samples/s  runs {theirs}")
    target = 2.0 if a.smollm2 else 1.5
    print(f"ratio ours/TRL: {m / t:.2f}x (every metric: {full / t:.2f}x; target >= {target}x)")


if __name__ == "__main__":
    main()
