"""Trainer throughput: samples/s of twoclocks' GRPO loop vs TRL's GRPOTrainer, same run, same setup.

Both train `builtin:tiny-arith` on the synthetic task with G=8, 16 prompts per batch (128
samples, all in one forward/backward: our micro_batch_size = TRL's per_device_train_batch_size
= 128), 12 new tokens, fp32, lr 1e-4, token-mean loss, the same reward (strict format policy +
math-verify pool), no KL, no eval, no gradient checkpointing, for ~2k samples, and one update per
batch or, with `--updates 2`, two (our ppo_epochs = 2; TRL's num_iterations = 2, which reuses
each generation for two optimizer steps). Throughput is generated samples per second over the
batches after the first (warm-up excluded). The headline does TRL's work: no KL-to-init metric
and no gradient-noise terms (kl_init_every = noise_every = 0; TRL computes neither); one more run
of ours with both at every step shows what they cost (`--no-every-metric` leaves it out).
Every training runs in a fresh process of its own (bench/trainer_throughput_runs.py), the two
trainers alternating (ours, TRL, ours, TRL, ...; `--repeats`, 3 by default), so a change in the
machine's load hits both alike. Printed: each run's rate, then a markdown table (trainer, dtype,
new tokens, skip, samples/s median and min–max, generation and update s per batch, peak RSS of
the process, ratio ours/TRL: median and min–max over the alternating pairs), then each part of a
batch in seconds (generation; scoring: no-grad log-probs of the old/reference policy; update:
forward + backward + optimizer; reward; weight sync; step metrics; other: the rest of the wall
time between batch ends). Parts are means over batches 2..N of a run, then the median over
runs. TRL's parts come from a GRPOTrainer subclass timing `_generate`, `_calculate_rewards` and
its no-grad `_get_per_token_logps_and_entropies`, and a callback timing from the end of
`_prepare_inputs` to `on_optimizer_step` (update); ours from the loop's time_gen_s /
time_reward_s metrics and wrappers around its `_logprobs_before_update`, `update`,
`_sync_engine` and `step_metrics`.
TRL is not a dependency: it runs when `trl` (and `datasets`) import, from the environment or
from `--trl-path DIR` (e.g. `pip install --target DIR --no-deps trl datasets pandas pyarrow
dill multiprocess xxhash`). Target: ours / TRL >= 1.5.

Where the two do different work: this trainer leaves the forward/backward of zero-advantage
samples out (`skip_zero_advantage`; exact without KL), TRL trains every row: `--no-skip` runs
ours without skipping, `--both-skips` runs both settings of ours against the same TRL runs.
Our decode loop returns the sampler's log-probs, so on-policy no scoring forward runs; TRL needs
none either at one update per batch. Ours also measures parameter drift every step ("step metrics").

`--few-shot` puts the same two worked examples in front of every question for both trainers
(prompts of ~50 tokens instead of 6, as chat templates and few-shot prompts make them): the
share of the work a prompt has, which this trainer runs once per group, grows with its length.
The tiny model was never trained on such prompts and answers none of them right, so every group
has zero advantage; this trainer's skipping of such samples is switched off in this mode, so the
ratio shows the prompt sharing alone (both trainers do the full forward/backward).

`--smollm2` runs both on SmolLM2-135M-Instruct (`builtin:smollm2-135m`) with
`examples/smollm2-train.toml`'s task: its chat-template prompt, the final-answer reward (the
last number of the completion, at any length), T = 0.7, 4 prompts x 8 samples, lr 1e-5,
`--max-new-tokens` 24 (or 128; default 192 samples: 6 batches, 2..6 timed). Target there:
ours / TRL >= 2. `--dtype bfloat16` puts both trainers' parameters in bf16 (ours: dtype; TRL:
the model loaded in bf16 and `bf16=True`, which transformers accepts on CPU with use_cpu and
runs as CPU autocast; AdamW steps on the bf16 weights in both). `--update-dtype bfloat16` is
mixed precision in both: float32 weights and AdamW, the update's arithmetic in bf16 (ours:
update_dtype, on a bf16 copy of the weights; TRL: bf16=True, autocast on the float32 model).
`--rollout-dtype` is ours alone (TRL's transformers path samples with the training weights; ours
then applies its TIS cap, 2.0 by default). `--with-fp32` adds ours at the defaults (float32
throughout) to every repeat, alternating with the others, and prints ours at the asked
precision against it, pair by pair: the bf16 path's speed-up measured in one run.

Full size on 2 idle cores (~8 s per 32-sample batch for ours at 24 tokens; TRL 18 s in a
near-idle small run, 49 s in the docs' run): one repeat is ~1 min of ours and ~2-5 min of TRL
(model loading included), so the default 3 repeats plus the every-metric run take ~10-20 min;
`--both-skips` adds ~3 min. At 128 new tokens (mean completion ~25 tokens, the longest running
to the cap) a batch took ~4x its 24-token time for ours and ~1.5x for TRL (a small 1-thread run
at load 1-3 against the docs' idle 1-thread figures): allow ~40 min. bf16 runs shorter. Peak RSS
in the small runs (fp32, one 32-row pass): ours 4.2 GB at 24 tokens and 9.7 GB at 128, TRL
8.5 GB at 24 and 16.1 GB at 128 (once killed by the kernel's OOM killer beside other jobs on a
23 GB machine): give the 128-token run >= 18 GB free.
The four configurations the docs report:

    python bench/trainer_throughput.py --smollm2                          # fp32, 24 tokens
    python bench/trainer_throughput.py --smollm2 --max-new-tokens 128     # fp32, 128 tokens
    python bench/trainer_throughput.py --smollm2 --both-skips             # skip and no-skip
    python bench/trainer_throughput.py --smollm2 --dtype bfloat16         # bf16 both
    python bench/trainer_throughput.py --smollm2 --update-dtype bfloat16 --rollout-dtype bfloat16

    python bench/trainer_throughput.py [--samples 2048] [--trl-path DIR] [--threads 2]
        [--repeats 3] [--few-shot] [--updates 1|2] [--hf-decoder auto|generate] [--smollm2]
        [--max-new-tokens N] [--no-skip | --both-skips] [--dtype float32|bfloat16]
        [--rollout-dtype auto|float32|bfloat16|float16] [--update-dtype bfloat16]
        [--no-every-metric]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = Path(__file__).with_name("trainer_throughput_runs.py")
P, G, NEW_TOKENS, LR = 16, 8, 12, 1e-4
TEMPERATURE, REWARD = 1.0, "math-verify"
TASK: dict = {}  # the arithmetic task's options (ArithmeticTask's keyword arguments)
FEW_SHOT = "Answer in \\boxed{{}}.\n12+30=\\boxed{{42}}\n75-9=\\boxed{{66}}\n{question}="
# a batch's timed parts, in print order; "other" is what they leave of the batch's wall time
PARTS = ("gen", "score", "update", "reward", "sync", "metrics", "other")
PART_NAMES = ("generation", "scoring", "update", "reward", "weight sync", "step metrics", "other")


def settings(a, model_dir: str, template: str | None, skip: bool, all_metrics: bool) -> dict:
    """One run's settings, as the child process reads them."""
    return {"model": model_dir, "samples": a.samples, "threads": a.threads, "P": P, "G": G,
            "new_tokens": NEW_TOKENS, "lr": LR, "temperature": TEMPERATURE, "reward": REWARD,
            "task": TASK, "template": template or "", "updates": a.updates,
            "decoder": a.hf_decoder, "skip": skip, "all_metrics": all_metrics,
            "dtype": a.dtype, "rollout_dtype": a.rollout_dtype, "update_dtype": a.update_dtype}


def child_env(trl_path: str | None) -> dict:
    """The environment of the child processes: `trl_path` in front of PYTHONPATH."""
    env = dict(os.environ)
    if trl_path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [trl_path, env.get("PYTHONPATH")]))
    return env


def trl_importable(env: dict) -> bool:
    probe = subprocess.run([sys.executable, "-c", "import trl, datasets"], env=env,
                           capture_output=True)
    return probe.returncode == 0


def batch_parts(steps: list[dict]) -> dict[str, float]:
    """Mean seconds per rollout batch of each part over the timed batches (means, so the parts
    add up to the wall time), with the batches' reward figures."""
    keys = (*PARTS[:-1], "wall", "reward_mean", "zero_frac", "resp_len")
    mean = {k: statistics.fmean(s.get(k, 0.0) for s in steps) for k in keys}
    mean["other"] = mean["wall"] - sum(mean[k] for k in PARTS[:-1])
    return mean


def run(kind: str, spec: dict, env: dict) -> dict:
    """One training in a process of its own: the child's RESULT, with its mean parts."""
    proc = subprocess.run([sys.executable, str(CHILD), kind, json.dumps(spec)], env=env,
                          capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
            res["parts"] = batch_parts(res["steps"])
            return res
    sys.stderr.write(proc.stderr[-3000:])
    why = f"exit status {proc.returncode}"
    if proc.returncode == -9:  # SIGKILL: on Linux most often the kernel's OOM killer
        why += " (SIGKILL: out of memory? see dmesg; its peak RSS grows with --max-new-tokens)"
    raise SystemExit(f"{kind} run failed, {why} (stderr above)")


class Arm:
    """One trainer configuration and its runs."""

    def __init__(self, name: str, kind: str, spec: dict, dtype: str, skip: str):
        self.name, self.kind, self.spec, self.dtype, self.skip = name, kind, spec, dtype, skip
        self.runs: list[dict] = []

    def rates(self) -> list[float]:
        return [round(r["samples_per_s"], 3) for r in self.runs]

    def part(self, key: str) -> float:
        """Median over runs of the part's mean seconds per batch."""
        return statistics.median(r["parts"][key] for r in self.runs)


def spread(values: list[float], digits: int = 3, unit: str = "") -> str:
    """'median (min–max)', or the one value."""
    m = f"{statistics.median(values):.{digits}f}{unit}"
    if len(values) == 1:
        return m
    return f"{m} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def make_arms(a, model_dir: str, template: str | None, trl_ok: bool) -> list[Arm]:
    """Ours at each skip setting asked for and, when it imports, TRL."""
    if a.few_shot:  # see --few-shot in the docstring
        skips = [False]
    elif a.both_skips:
        skips = [True, False]
    else:
        skips = [not a.no_skip]
    ours_dtype = (a.dtype + (f", rollouts {a.rollout_dtype}" if a.rollout_dtype else "")
                  + (f", update {a.update_dtype}" if a.update_dtype else ""))
    arms = [Arm("twoclocks" + ("" if skip else " (no skip)"), "ours",
                settings(a, model_dir, template, skip, False), ours_dtype,
                "yes" if skip else "no") for skip in skips]
    if a.with_fp32:
        fp32 = argparse.Namespace(**{**vars(a), "dtype": "float32", "rollout_dtype": None,
                                     "update_dtype": None})
        arms += [Arm("twoclocks fp32" + ("" if skip else " (no skip)"), "ours",
                     settings(fp32, model_dir, template, skip, False), "float32",
                     "yes" if skip else "no") for skip in skips]
    if trl_ok:
        trl_dtype = ("bfloat16, bf16=True" if a.dtype == "bfloat16"
                     else "float32, bf16=True (autocast)" if a.update_dtype else a.dtype)
        arms.append(Arm("TRL GRPOTrainer", "trl", settings(a, model_dir, template, False, False),
                        trl_dtype, "no (trains all)"))
    return arms


def ratio_cell(arm: Arm, trl_arm: Arm | None) -> str:
    """ours/TRL per alternating pair: median (min–max); a lone run against TRL's median."""
    if trl_arm is None or arm.kind != "ours":
        return "—"
    theirs = trl_arm.rates()
    if len(arm.runs) == len(theirs):
        return "**" + spread([o / t for o, t in zip(arm.rates(), theirs, strict=True)],
                             2, "×") + "**"
    return f"{arm.rates()[0] / statistics.median(theirs):.2f}× (vs TRL's median)"


def table(arms: list[Arm], trl_arm: Arm | None) -> list[str]:
    """The markdown table: rates, generation/update seconds, peak RSS, ratios."""
    lines = ["| trainer | dtype | new tokens | skip | samples/s (median, range) | generation "
             "s/step | update s/step | peak RSS MiB | ratio ours/TRL (median, range) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for arm in arms:
        rss = max(r["peak_rss_mib"] for r in arm.runs)
        lines.append(f"| {arm.name} | {arm.dtype} | {NEW_TOKENS} | {arm.skip} | "
                     f"{spread(arm.rates())} | {arm.part('gen'):.2f} | "
                     f"{arm.part('update'):.2f} | {rss:,.0f} | {ratio_cell(arm, trl_arm)} |")
    return lines


def breakdown(arms: list[Arm]) -> list[str]:
    """Seconds per rollout batch of every part, and the batches' reward figures."""
    lines = ["| trainer | " + " | ".join(PART_NAMES) + " | batch wall | reward mean | "
             "zero-adv. groups | completion tokens |",
             "|---|" + "---|" * (len(PARTS) + 4)]
    for arm in arms:
        cells = [f"{arm.part(k):.3f}" for k in (*PARTS, "wall")]
        cells += [f"{arm.part('reward_mean'):.3f}", f"{arm.part('zero_frac'):.2f}",
                  f"{arm.part('resp_len'):.1f}"]
        lines.append(f"| {arm.name} | " + " | ".join(cells) + " |")
    return lines


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
    if a.samples == 2048:  # the tiny model's default: 6 batches here
        a.samples = 6 * P * G


def parse_args() -> argparse.Namespace:
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
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="Completion cap (default: 12 tiny, the example's 24 with --smollm2).")
    skip = ap.add_mutually_exclusive_group()
    skip.add_argument("--no-skip", action="store_true",
                      help="Ours with skip_zero_advantage = false (TRL's work on every row).")
    skip.add_argument("--both-skips", action="store_true",
                      help="Ours with and without skipping, against the same TRL runs.")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="Both trainers' parameter dtype.")
    ap.add_argument("--rollout-dtype", choices=("auto", "float32", "bfloat16", "float16"),
                    default=None, help="Ours only: the precision its rollouts sample in.")
    ap.add_argument("--update-dtype", choices=("bfloat16",), default=None,
                    help="Mixed precision: ours' update on a bf16 copy of float32 weights, "
                         "TRL's bf16=True (autocast) over float32 weights.")
    ap.add_argument("--with-fp32", action="store_true",
                    help="Ours at float32 throughout in every repeat too, and the ratio of "
                         "ours at the asked precision to it, pair by pair.")
    ap.add_argument("--every-metric", action=argparse.BooleanOptionalAction, default=True,
                    help="One more run of ours with kl_init and the noise terms every step.")
    a = ap.parse_args()
    if a.max_new_tokens is not None and a.max_new_tokens < 1:
        ap.error(f"--max-new-tokens {a.max_new_tokens}: must be a positive integer")
    return a


def main() -> None:
    global NEW_TOKENS
    a = parse_args()
    a.template = None
    if a.smollm2:
        smollm2_setting(a)
    if a.max_new_tokens is not None:
        NEW_TOKENS = a.max_new_tokens
    from trainer.tiny import TINY_MODEL_ID, ensure_tiny_model

    model_dir = str(ensure_tiny_model(progress=True) if a.model == TINY_MODEL_ID else a.model)
    template = FEW_SHOT if a.few_shot else a.template
    if a.few_shot:
        print(f"prompts: few-shot template {template!r}")
    env = child_env(a.trl_path)
    trl_ok = trl_importable(env)
    arms = make_arms(a, model_dir, template, trl_ok)
    load0 = os.getloadavg()[0]
    print(f"{Path(model_dir).name}: {P} prompts x G {G}, {NEW_TOKENS} new tokens, T "
          f"{TEMPERATURE}, lr {LR}, {a.samples} samples a run ({a.samples // (P * G)} batches, "
          f"2.. timed), {a.updates} update(s) a batch, {a.threads} threads, our sampler "
          f"{a.hf_decoder}; load average {load0:.1f} at the start", flush=True)
    # alternate the trainers within each repeat, so a change in machine load hits all alike
    for i in range(a.repeats):
        for arm in arms:
            arm.runs.append(run(arm.kind, arm.spec, env))
            r = arm.runs[-1]
            print(f"repeat {i + 1}: {arm.name:<24} {r['samples_per_s']:8.3f} samples/s  peak "
                  f"RSS {r['peak_rss_mib']:,.0f} MiB", flush=True)
    trl_arm = next((x for x in arms if x.kind == "trl"), None)
    shown = list(arms)
    if a.every_metric:
        base = arms[0]
        full = Arm(base.name + ", every metric", "ours",
                   settings(a, model_dir, template, base.spec["skip"], True), base.dtype,
                   base.skip)
        full.runs.append(run("ours", full.spec, env))
        shown.insert(len(arms) - (trl_arm is not None), full)
    load1 = os.getloadavg()[0]
    print(f"load average {load1:.1f} at the end")
    if max(load0, load1) > a.threads + 0.5:  # others' work shares the cores, unequally
        print(f"warning: load average above the {a.threads} threads used: the machine is "
              "busy and these timings are not comparable with idle ones")
    print()
    print("\n".join(table(shown, trl_arm)))
    print("\nSeconds per rollout batch (mean over batches 2..N, median over runs):\n")
    print("\n".join(breakdown(shown)))
    if a.with_fp32:
        print()
        print("\n".join(against_fp32(arms)))
    notes(a, trl_arm)


def against_fp32(arms: list[Arm]) -> list[str]:
    """Each of ours at the asked precision against ours in float32 at the same skip setting:
    samples/s, generation and update seconds, each a ratio per alternating pair."""
    lines = []
    for arm in [x for x in arms if x.kind == "ours" and not x.name.startswith("twoclocks fp32")]:
        base = next(x for x in arms if x.name.startswith("twoclocks fp32")
                    and x.skip == arm.skip)
        pairs = list(zip(arm.runs, base.runs, strict=True))
        rate = [o["samples_per_s"] / b["samples_per_s"] for o, b in pairs]
        gen = [b["parts"]["gen"] / o["parts"]["gen"] for o, b in pairs]
        upd = [b["parts"]["update"] / o["parts"]["update"] for o, b in pairs]
        lines.append(f"{arm.name} ({arm.dtype}) / float32: samples/s {spread(rate, 2, 'x')}; "
                     f"generation {spread(gen, 2, 'x')} faster, update {spread(upd, 2, 'x')} "
                     f"faster (per alternating pair)")
    return lines


def notes(a, trl_arm: Arm | None) -> None:
    """Where the compared runs differ in work or setting."""
    print()
    if trl_arm is None:
        print("TRL GRPOTrainer: trl/datasets not importable (see --trl-path); no ratio")
        return
    target = 2.0 if a.smollm2 else 1.5
    print(f"target ours/TRL >= {target}x. TRL trains every row; 'skip yes' leaves the "
          "zero-advantage rows' forward/backward out (see 'zero-adv. groups').")
    r = trl_arm.runs[0]
    print(f"TRL parameters {', '.join(r['param_dtypes'])}, autocast {r['autocast']}.")
    if a.rollout_dtype:
        print(f"ours samples in {a.rollout_dtype} (TIS cap applied); TRL's transformers "
              "path has no separate rollout precision: it samples with its training weights.")


if __name__ == "__main__":
    main()
