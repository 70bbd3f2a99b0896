"""bf16 rollouts and a bf16 update against fp32: throughput and held-out accuracy of the same
GRPO run.

Three arms on SmolLM2-135M-Instruct (`builtin:smollm2-135m`) with `examples/smollm2-train.toml`'s
task (its chat-template prompt, final-answer reward, T = 0.7, 4 prompts x 8 samples, 24 new
tokens): `fp32` samples and trains in float32 (the defaults); `bf16` samples in bfloat16
(`rollout_dtype = "bfloat16"`: a bf16 copy of the weights refreshed after every update) and
trains in float32, with truncated importance sampling at its default cap (`tis_cap` 2.0);
`bf16-both` samples as `bf16` and computes the update in bfloat16 too (`update_dtype =
"bfloat16"`: its forward and backward on the same bf16 copy, gradients added into the float32
weights, which with AdamW's state stay float32). The arms alternate, seed by seed, their order
rotated by one a seed (fp32, bf16, bf16-both for seed 0; bf16, bf16-both, fp32 for seed 1, ...),
so a drift in the machine's speed hits all alike; `--arms` runs a subset. Each run trains in a
process of its own, so that none starts with an earlier run's heap, caches or oneDNN kernels;
`--in-process` runs them all in this one, one after another.

Printed per arm: samples/s over steps 2..N (step 1 warms up; with --steps 1, step 1) as samples /
(generation + reward + update seconds), evaluation excluded; the median generation, reward and
update seconds of a step; each bf16 arm's ratio to fp32 of samples/s, generation and update
seconds for each seed and their median, all measured in this one invocation; the sampler/trainer
mismatch (`sampler_abs_logratio`) and the TIS weights; the share of groups the update skips
(`zero_std_frac`: a bf16-rollout arm scores their rows in a forward of their own); and the
held-out accuracy of every seed at every evaluation (before training, every --eval-every steps, at
the end), with the mean and the seed-to-seed spread of each arm at the last one, so that "equal
within seed noise" can be judged. Held-out accuracy is sampled by each arm's own rollout engine
(the bf16 arms' in bf16), at eval_temperature 0.7 on --eval-size problems.

Run it on an otherwise idle machine: the timings are worthless on shared cores.

    python bench/bf16_rollouts.py [--steps 12] [--seeds 2] [--eval-every 4] [--eval-size 64]
                                  [--threads 2] [--lr 1e-5] [--arms fp32,bf16,bf16-both]
                                  [--in-process] [--json]

Its defaults run 2 seeds x 3 arms x 12 steps = 72 steps and 24 evaluations. `--steps 12 --seeds
2 --eval-every 6 --eval-size 128 --threads 2` took 12 min 4 s on 2 idle cores (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "smollm2-train.toml"
ARMS = {"fp32": {}, "bf16": {"rollout_dtype": "bfloat16"},
        "bf16-both": {"rollout_dtype": "bfloat16", "update_dtype": "bfloat16"}}
STEP_KEYS = ("time_gen_s", "time_reward_s", "time_update_s")


class _Rows:
    """Metric sink keeping every step's values and the run's events."""

    def __init__(self):
        self.rows: dict[int, dict] = {}
        self.events: list[str] = []

    def log(self, step, samples, values):
        self.rows.setdefault(step, {}).update(values, samples=samples)

    def event(self, message):
        self.events.append(message)

    def flush(self):
        pass


def config(arm: str, seed: int, a):
    """The TrainConfig of one arm and seed: the example's task at this bench's settings."""
    from trainer.config import TrainConfig

    ex = tomllib.loads(EXAMPLE.read_text())
    batch = ex["prompts_per_batch"] * ex["group_size"]
    keep = ("model", "dataset", "arith_max_value", "arith_ops", "prompt_template", "reward",
            "group_size", "prompts_per_batch", "temperature", "eval_temperature",
            "max_new_tokens", "micro_batch_size")
    return TrainConfig(**{k: ex[k] for k in keep if k in ex}, **ARMS[arm], lr=a.lr, seed=seed,
                       sample_budget=a.steps * batch, eval_every_samples=a.eval_every * batch,
                       eval_size=a.eval_size, checkpoint_every_steps=0, threads=a.threads)


def rotated(seed: int, arms: list[str]) -> list[str]:
    """`arms` in the order seed `seed` runs them: rotated by one a seed, so that no arm is
    always the first (or last) of its seed when the machine's speed drifts."""
    k = seed % len(arms)
    return arms[k:] + arms[:k]


def present(steps: list[dict], key: str) -> list[float]:
    """`key`'s values over the steps that logged it (a step that trained no token logs no
    TIS weight; one whose every row the sampler scored, no mismatch)."""
    return [r[key] for r in steps if key in r]


def one_run(arm: str, seed: int, a) -> dict:
    """Train one arm at one seed; its throughput, step times, mismatch and accuracy curve."""
    from trainer.loop import train
    from trainer.rewards import _parse

    _parse.cache_clear()  # every run starts with math-verify's parse cache cold
    sink = _Rows()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        status = train(config(arm, seed, a), sink, Path(work))
    steps = [r for s, r in sorted(sink.rows.items()) if s >= 1 and "time_gen_s" in r]
    timed = steps[1:] or steps  # step 1 warms up
    busy = sum(sum(r[k] for k in STEP_KEYS) for r in timed)
    out = {
        "arm": arm, "seed": seed, "status": status, "wall_s": round(time.perf_counter() - start, 1),
        "samples_per_s": sum(r["batch_samples"] for r in timed) / busy,
        **{k: statistics.median(r[k] for r in timed) for k in STEP_KEYS},
        "sampler_abs_logratio": statistics.mean(present(steps, "sampler_abs_logratio")
                                                or [float("nan")]),
        "zero_std_frac": statistics.mean(r["zero_std_frac"] for r in steps),
        "eval": {r["samples"]: r["eval_accuracy"] for _, r in sorted(sink.rows.items())
                 if "eval_accuracy" in r},
        "events": sink.events,
    }
    print(f"{arm} seed {seed}: {status}, {out['wall_s']} s", file=sys.stderr, flush=True)
    if present(steps, "tis_weight_mean"):
        out["tis_weight_mean"] = statistics.mean(present(steps, "tis_weight_mean"))
        out["tis_capped_frac"] = max(present(steps, "tis_capped_frac"))
    return out


def in_child(arm: str, seed: int, a) -> dict:
    """`one_run` in a process of its own, so that no run starts with an earlier run's heap,
    caches or oneDNN kernels; its stderr passes through."""
    cmd = [sys.executable, __file__, *sys.argv[1:], "--child", arm, str(seed)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            out = json.loads(line[7:])
            out["eval"] = {int(k): v for k, v in out["eval"].items()}  # JSON keys are strings
            return out
    raise SystemExit(f"{arm} seed {seed}: the child run failed (exit status {proc.returncode})")


def report(runs: list[dict]) -> None:
    """The throughput, time split, mismatch and accuracy tables of `runs`."""
    by = {(r["arm"], r["seed"]): r for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    arms = [arm for arm in ARMS if (arm, seeds[0]) in by]
    for arm in arms:
        rs = [by[arm, s] for s in seeds]
        rate = statistics.median(r["samples_per_s"] for r in rs)
        split = ", ".join(f"{k[5:-2]} {statistics.median(r[k] for r in rs):.2f} s"
                          for k in STEP_KEYS)
        extra = (f"; tis_weight_mean {statistics.mean(r['tis_weight_mean'] for r in rs):.5f}, "
                 f"capped at most {max(r['tis_capped_frac'] for r in rs):.4f}"
                 if "tis_weight_mean" in rs[0] else "")
        each = [round(r["samples_per_s"], 2) for r in rs]
        skipped = statistics.mean(r["zero_std_frac"] for r in rs)
        print(f"{arm}: {rate:7.2f} samples/s (median of seeds {each}); "
              f"median step: {split}; groups skipped (zero_std_frac) {skipped:.2f}; "
              f"sampler_abs_logratio "
              f"{statistics.mean(r['sampler_abs_logratio'] for r in rs):.2e}{extra}")
    for arm in [a for a in arms if a != "fp32" and "fp32" in arms]:
        ratios = [by[arm, s]["samples_per_s"] / by["fp32", s]["samples_per_s"] for s in seeds]
        gens = [by["fp32", s]["time_gen_s"] / by[arm, s]["time_gen_s"] for s in seeds]
        ups = [by["fp32", s]["time_update_s"] / by[arm, s]["time_update_s"] for s in seeds]
        print(f"{arm} / fp32 samples/s: {statistics.median(ratios):.2f}x (per seed "
              f"{[round(x, 2) for x in ratios]}); generation alone "
              f"{statistics.median(gens):.2f}x faster, update alone "
              f"{statistics.median(ups):.2f}x")
    print("held-out accuracy (samples: per seed)")
    points = sorted({p for r in runs for p in r["eval"]})
    for p in points:
        cells = "   ".join(f"{arm} " + " ".join(f"{by[arm, s]['eval'].get(p, float('nan')):.3f}"
                                                 for s in seeds) for arm in arms)
        print(f"  {p:>6}: {cells}")
    last = points[-1]
    for arm in arms:
        accs = [by[arm, s]["eval"][last] for s in seeds]
        spread = statistics.stdev(accs) if len(accs) > 1 else float("nan")
        print(f"{arm} at {last} samples: mean {statistics.mean(accs):.3f}, seed-to-seed std "
              f"{spread:.3f} over {len(accs)} seeds")
    print(f"wall: {sum(r['wall_s'] for r in runs):.0f} s for {len(runs)} runs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12, help="Steps per run (32 samples each).")
    ap.add_argument("--seeds", type=int, default=2, help="Seeds 0..N-1, each arm at each.")
    ap.add_argument("--eval-every", type=int, default=4, help="Steps between evaluations.")
    ap.add_argument("--eval-size", type=int, default=64, help="Held-out problems per evaluation.")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--arms", default=",".join(ARMS),
                    help=f"Comma-separated arms to run, of {', '.join(ARMS)}.")
    ap.add_argument("--in-process", action="store_true",
                    help="Every run in this one process, one after another (each in a fresh "
                         "process by default).")
    ap.add_argument("--json", action="store_true", help="Every run's numbers as JSON too.")
    ap.add_argument("--child", nargs=2, metavar=("ARM", "SEED"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print("RESULT " + json.dumps(one_run(a.child[0], int(a.child[1]), a)), flush=True)
        return
    chosen = a.arms.split(",")
    if unknown := [arm for arm in chosen if arm not in ARMS]:
        ap.error(f"--arms: unknown arm(s) {', '.join(unknown)}; allowed: {', '.join(ARMS)}")
    from trainer.precision import bf16_native

    print(f"native bf16 on this CPU: {bf16_native('cpu') or 'no (bf16 is emulated here)'}")
    run = one_run if a.in_process else in_child
    runs = [run(arm, seed, a) for seed in range(a.seeds) for arm in rotated(seed, chosen)]
    for r in runs:
        if r["status"] != "completed":
            print(f"{r['arm']} seed {r['seed']}: {r['status']}")
    report(runs)
    if a.json:
        print(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
