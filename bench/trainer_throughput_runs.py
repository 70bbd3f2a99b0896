"""One timed training for bench/trainer_throughput.py, in a process of its own: this project's
GRPO loop (`ours`) or TRL's GRPOTrainer (`trl`), with the seconds of each step's parts.

    python bench/trainer_throughput_runs.py ours|trl '<settings as JSON>'

Prints one line `RESULT {...}`: samples/s over the steps after the first; per rollout batch
(one generation of P x G samples, `updates` optimizer steps) the seconds of generation, scoring
(no-grad log-probs of the old/reference policy), update (forward + backward + optimizer), reward,
weight sync (ours: the rollout copy's refresh), step metrics (ours: the loop's step_metrics,
parameter drift included; TRL's metrics fall in its other parts) and the wall time between
batch ends; the mean reward and share of zero-advantage groups; the mean completion length; the
process's peak RSS (VmHWM). Both trainers run in a fresh process each, so each starts cold and
its peak RSS is its own (the reward pool's forked workers are processes of their own, not
counted).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path


class Parts:
    """Seconds spent in named parts since the last `take`."""

    def __init__(self):
        self.acc: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.acc[name] = self.acc.get(name, 0.0) + seconds

    @contextmanager
    def part(self, name: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t)

    def wrap(self, name: str, fn):
        """`fn`, its time added to `name`."""

        def timed(*args, **kwargs):
            with self.part(name):
                return fn(*args, **kwargs)

        return timed

    def take(self) -> dict[str, float]:
        out, self.acc = self.acc, {}
        return out


def peak_rss_mib() -> float:
    """This process's peak resident set (VmHWM) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def result(rows: list[dict], samples_per_row: int, extra: dict) -> dict:
    """The rate and per-batch rows over batches 2..N (batch 1 warms up), plus `extra`."""
    timed = rows[1:]
    wall = rows[-1]["t"] - rows[0]["t"]
    for prev, row in zip(rows, rows[1:], strict=False):
        row["wall"] = row["t"] - prev["t"]
    steps = [{k: v for k, v in r.items() if k != "t"} for r in timed]
    return {"samples_per_s": samples_per_row * len(timed) / wall, "steps": steps,
            "peak_rss_mib": peak_rss_mib(), **extra}


class _Sink:
    """Metric sink keeping each step's generation and reward seconds and its reward figures."""

    def __init__(self):
        self.last: dict = {}

    def log(self, step, samples, values):
        self.last = values

    def flush(self):
        pass

    def event(self, message):  # the run's notes (precision chosen, no learning signal)
        pass


def run_ours(s: dict) -> dict:
    """trainer.loop.train at `s`, its update, scoring and weight sync timed by wrapping the
    loop's own functions (the loop logs generation and reward itself: time_gen_s, time_reward_s;
    its time_update_s spans scoring + update + sync)."""
    from trainer import loop
    from trainer.config import TrainConfig

    parts = Parts()
    loop.update = parts.wrap("update", loop.update)
    loop._logprobs_before_update = parts.wrap("score", loop._logprobs_before_update)
    loop._sync_engine = parts.wrap("sync", loop._sync_engine)
    loop.step_metrics = parts.wrap("metrics", loop.step_metrics)  # incl. parameter drift
    cfg = TrainConfig(
        model=s["model"], prompts_per_batch=s["P"], group_size=s["G"],
        max_new_tokens=s["new_tokens"], lr=s["lr"], temperature=s["temperature"],
        reward=s["reward"], **{f"arith_{k}": v for k, v in s["task"].items()},
        sample_budget=s["samples"], eval_every_samples=0, checkpoint_every_steps=0,
        kl_init_every=1 if s["all_metrics"] else 0,
        noise_every=1 if s["all_metrics"] else 0,  # TRL measures no gradient noise
        threads=s["threads"], seed=0, prompt_template=s["template"] or None,
        skip_zero_advantage=s["skip"], ppo_epochs=s["updates"], hf_decoder=s["decoder"],
        dtype=s["dtype"], rollout_dtype=s["rollout_dtype"], update_dtype=s["update_dtype"],
        micro_batch_size=s["P"] * s["G"],  # TRL's per_device_train_batch_size: one pass
    )
    sink, rows = _Sink(), []

    def on_step(progress):
        v = sink.last
        rows.append({"t": time.perf_counter(), "gen": v["time_gen_s"],
                     "reward": v["time_reward_s"], **parts.take(),
                     "reward_mean": v["reward_mean"], "zero_frac": v["zero_std_frac"],
                     "resp_len": v["resp_len_mean"]})

    with tempfile.TemporaryDirectory() as work:
        loop.train(cfg, sink, Path(work), on_step=on_step)
    return result(rows, s["P"] * s["G"], {})


def run_trl(s: dict) -> dict:
    """TRL's GRPOTrainer at the same settings, its parts timed by a subclass and a callback."""
    import numpy as np
    import pyarrow as pa
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from trainer.data import ArithmeticTask, Problem, render_prompt
    from trainer.rewards import load_reward

    P, G, updates = s["P"], s["G"], s["updates"]
    torch.set_num_threads(s["threads"])
    tok = AutoTokenizer.from_pretrained(s["model"], padding_side="left")
    dtype = getattr(torch, s["dtype"])
    model = AutoModelForCausalLM.from_pretrained(s["model"], dtype=dtype)
    problems = ArithmeticTask(**s["task"]).sample(np.random.default_rng(0), s["samples"] // G)
    template = s["template"]

    def prompt(p):
        return template.format(question=p.question) if template else render_prompt(p, tok)

    rows = [{"prompt": prompt(p), "answer": p.answer} for p in problems]
    # an explicit fingerprint: datasets 5.2 cannot hash a pyarrow 26 table
    ds = Dataset(pa.Table.from_pylist(rows), fingerprint="bench")
    reward = load_reward(s["reward"])

    parts, out_rows, stats = Parts(), [], {}

    def correctness(prompts, completions, answer, **kw):
        r = reward(list(completions), [Problem("", a) for a in answer])
        groups = [r[i:i + G] for i in range(0, len(r), G)]
        stats["reward_mean"] = sum(r) / len(r)
        stats["zero_frac"] = sum(max(g) == min(g) for g in groups) / len(groups)
        return r

    prepared = [0.0]

    class Timed(GRPOTrainer):
        """GRPOTrainer with its generation, rewards and no-grad log-probs timed."""

        def _generate(self, prompts):
            with parts.part("gen"):
                out = super()._generate(prompts)
            stats["resp_len"] = sum(map(len, out[1])) / len(out[1])  # completion token ids
            return out

        def _calculate_rewards(self, *args, **kwargs):
            with parts.part("reward"):
                return super()._calculate_rewards(*args, **kwargs)

        def _get_per_token_logps_and_entropies(self, *args, **kwargs):
            if torch.is_grad_enabled():  # the loss's own forward: part of the update
                return super()._get_per_token_logps_and_entropies(*args, **kwargs)
            with parts.part("score"):
                return super()._get_per_token_logps_and_entropies(*args, **kwargs)

        def _prepare_inputs(self, generation_batch):
            inputs = super()._prepare_inputs(generation_batch)
            prepared[0] = time.perf_counter()  # the update runs from here to the optimizer step
            return inputs

    class Clock(TrainerCallback):
        def on_optimizer_step(self, args, state, control, **kw):
            parts.add("update", time.perf_counter() - prepared[0])

        def on_step_end(self, args, state, control, **kw):
            if state.global_step % updates == 0:  # one generation's last optimizer step
                out_rows.append({"t": time.perf_counter(), **parts.take(), **stats})

    args = GRPOConfig(
        output_dir=s["out"], per_device_train_batch_size=P * G, gradient_accumulation_steps=1,
        num_generations=G, steps_per_generation=1, num_iterations=updates,
        max_completion_length=s["new_tokens"], temperature=s["temperature"], top_p=1.0, top_k=0,
        learning_rate=s["lr"], lr_scheduler_type="constant", warmup_steps=0, beta=0.0,
        loss_type="dapo", scale_rewards="group", fp16=False,
        bf16=s["dtype"] == "bfloat16" or s["update_dtype"] == "bfloat16",
        gradient_checkpointing=False, use_cpu=True, max_steps=s["samples"] // (P * G) * updates,
        logging_steps=1, save_strategy="no", report_to=[], seed=0, disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Timed(model=model, reward_funcs=correctness, args=args, train_dataset=ds,
                    processing_class=tok, callbacks=[Clock()])
    trainer.train()
    reward.close()
    params = {str(p.dtype).removeprefix("torch.") for p in model.parameters()}
    return result(out_rows, P * G, {"param_dtypes": sorted(params),
                                    "autocast": "bf16" if args.bf16 else "none"})


def main() -> None:
    kind, settings = sys.argv[1], json.loads(sys.argv[2])
    with tempfile.TemporaryDirectory() as out:
        settings["out"] = out
        res = run_ours(settings) if kind == "ours" else run_trl(settings)
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
