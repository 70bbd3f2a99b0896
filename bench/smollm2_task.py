"""Base rates of SmolLM2-135M-Instruct on candidate arithmetic tasks: which one leaves room to
learn arithmetic, not only the reply's format.

Why: on `examples/smollm2-train.toml`'s sums up to 20 most of GRPO's gain is format (the model
learns to reply with just the number), and its held-out set has only 50 distinct problems. A
batch-size study needs a task whose accuracy once the format is learned lies between ~10% and
~50%, with >= 500 distinct held-out problems. For each candidate this evaluates N held-out
problems with the trainer's own evaluation (`trainer.loop.evaluate`, the engine and reward
`twoclocks train` builds), at the example's T = 0.7 (one sample each) and greedy, and prints:
the held-out pool and the distinct problems evaluated; accuracy under the final-answer reward
(its last number) with its binomial standard error; the fraction of
replies that are just a number, and the accuracy among those; the fraction that state a result
(just a number, or one ending the reply after "=" or "is": this model writes "29 + 22 = 51"),
and the accuracy among those (an estimate of the rate once the format is learned); the mean
completion length.
Each row goes to stderr as JSON when it is done (a row takes minutes on a CPU).

    .venv/bin/python bench/smollm2_task.py                            # 4 candidates, N = 512
    .venv/bin/python bench/smollm2_task.py --n 256 --tasks 10:99:+- --json
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "smollm2-train.toml"
# min:max:ops: two-digit sums; sums and differences; products up to 99; three-digit sums
DEFAULT_TASKS = "10:99:+,10:99:+-,0:99:*,100:999:+"
JUST_A_NUMBER = re.compile(r"\s*-?\d+\s*\.?\s*")
# a reply that states a result: just a number, or ends in one after "=" or "is" ("29+22 = 51.")
STATES_RESULT = re.compile(r"(?s)\s*-?\d+\s*\.?\s*|.*(=|\bis)\s*-?\d+[\s.!]*")
TEMPERATURES = (0.7, 0.0)  # the example's eval temperature, then greedy


def parse_task(spec: str) -> tuple[int, int, tuple[str, ...]]:
    """`min:max:ops` (ops a string of +, - and *) as ArithmeticTask's options."""
    lo, hi, ops = spec.split(":")
    return int(lo), int(hi), tuple(ops)


class Recording:
    """The engine and the reward as evaluate() calls them, keeping what they return."""

    def __init__(self, engine, reward_fn):
        self.engine, self.reward_fn = engine, reward_fn
        self.texts, self.lengths, self.rewards = [], [], []

    def generate(self, prompts, temperature=None):
        roll = self.engine.generate(prompts, temperature=temperature)
        self.texts += roll.texts
        self.lengths += roll.completion_mask.sum(dim=1).tolist()
        return roll

    def reward(self, texts, problems):
        out = self.reward_fn(texts, problems)
        self.rewards += [float(r) for r in out]
        return out


def measure(engine, reward_fn, tok, base, spec: str, n: int, temperature: float) -> dict:
    """One candidate at one temperature, through the trainer's evaluation."""
    from trainer.config import TrainConfig
    from trainer.data import read_data
    from trainer.loop import evaluate

    lo, hi, ops = parse_task(spec)
    cfg = TrainConfig(**{**base, "arith_min_value": lo, "arith_max_value": hi,
                         "arith_ops": list(ops), "eval_size": n,
                         "eval_temperature": temperature})
    task, held = read_data(cfg)
    rec = Recording(engine, reward_fn)
    t0 = time.monotonic()
    acc = evaluate(rec, rec.reward, held, cfg, tok, 0)
    bare = [JUST_A_NUMBER.fullmatch(t) is not None for t in rec.texts]
    stated = [STATES_RESULT.fullmatch(t) is not None for t in rec.texts]
    hits_bare = [r >= 1.0 for r, b in zip(rec.rewards, bare, strict=True) if b]
    hits_stated = [r >= 1.0 for r, b in zip(rec.rewards, stated, strict=True) if b]
    return {"task": spec, "temperature": temperature, "n": len(held),
            "distinct": len({p.question for p in held}), "pool": task.heldout_size(),
            "accuracy": acc, "se": math.sqrt(acc * (1 - acc) / len(held)),
            "just_number": sum(bare) / len(bare),
            "acc_just_number": sum(hits_bare) / len(hits_bare) if hits_bare else None,
            "stated": sum(stated) / len(stated),
            "acc_stated": sum(hits_stated) / len(hits_stated) if hits_stated else None,
            "mean_len": sum(rec.lengths) / len(rec.lengths), "seconds": time.monotonic() - t0,
            "examples": [[p.question, t] for p, t in zip(held[:3], rec.texts[:3], strict=True)]}


def table(rows: list[dict]) -> str:
    """One line per candidate and temperature."""
    out = [f"{'task':<12} {'T':>3} {'pool':>6} {'distinct':>8} {'accuracy':>14} "
           f"{'just num':>8} {'acc|num':>7} {'stated':>6} {'acc|st':>6} {'len':>5} {'s':>5}"]
    for r in rows:
        pool = f"{r['pool']:,}" if r["pool"] is not None else "~1/10"
        among = f"{r['acc_just_number']:.3f}" if r["acc_just_number"] is not None else "-"
        st = f"{r['acc_stated']:.3f}" if r.get("acc_stated") is not None else "-"
        out.append(f"{r['task']:<12} {r['temperature']:>3} {pool:>6} {r['distinct']:>8} "
                   f"{r['accuracy']:>7.3f} ± {r['se']:.3f} {r['just_number']:>8.3f} "
                   f"{among:>7} {r.get('stated', float('nan')):>6.3f} {st:>6} "
                   f"{r['mean_len']:>5.1f} {r['seconds']:>5.0f}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default=DEFAULT_TASKS,
                    help=f"min:max:ops candidates, comma-separated (default {DEFAULT_TASKS})")
    ap.add_argument("--n", type=int, default=512, help="held-out problems per candidate")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch

    from trainer.config import TrainConfig
    from trainer.loop import load_model
    from trainer.rewards import load_reward
    from trainer.rollout import make_engine

    torch.set_num_threads(args.threads)
    example = tomllib.loads(EXAMPLE.read_text())
    base = {k: example[k] for k in ("model", "dataset", "prompt_template", "reward",
                                    "max_new_tokens", "temperature")}
    cfg = TrainConfig(**base)
    path, tok, model = load_model(cfg)
    engine = make_engine(cfg, model.eval(), tok, path)
    reward_fn = load_reward(cfg.reward)
    rows = []
    for spec in args.tasks.split(","):
        for t in TEMPERATURES:
            rows.append(measure(engine, reward_fn, tok, base, spec, args.n, t))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)  # each row as it ends
    print(json.dumps(rows, indent=1) if args.json else table(rows))


if __name__ == "__main__":
    main()
