"""Verifications per second: math-verify serially in this process vs MathVerifyReward's fork pool.

Usage: python bench/reward_throughput.py [--n 2000] [--workers 2]
Completions mimic a GRPO batch on the arithmetic task: 40% right, 40% wrong, 20% format hacks
(rejected by the policy before math-verify). Every completion is distinct: nothing is deduplicated.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from trainer.data import ArithmeticTask
from trainer.rewards import MathVerifyReward


def batch(n: int, seed: int = 0):
    """n (completion, problem) pairs of distinct completions."""
    rng = np.random.default_rng(seed)
    probs = ArithmeticTask(max_value=9999).sample(rng, n)
    comps = []
    for p in probs:
        u = rng.random()
        if u < 0.4:
            comps.append(f"\\boxed{{{p.answer}}}")
        elif u < 0.8:
            comps.append(f"\\boxed{{{int(p.answer) + int(rng.integers(1, 9))}}}")
        else:
            comps.append(f"\\boxed{{{p.question}}}")
    return comps, probs


def rate(reward: MathVerifyReward, comps, probs) -> tuple[float, float]:
    """(items per second, mean reward) for one call over the whole batch."""
    t0 = time.perf_counter()
    out = reward(comps, probs)
    return len(comps) / (time.perf_counter() - t0), float(np.mean(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="completions per measurement")
    ap.add_argument("--workers", type=int, default=2, help="pool size")
    ap.add_argument("--rounds", type=int, default=3, help="alternating measurements; medians shown")
    args = ap.parse_args()
    comps, probs = batch(50)
    serial_rates, pool_rates = [], []
    with MathVerifyReward(workers=0) as serial, MathVerifyReward(workers=args.workers) as pool:
        rate(serial, comps, probs)  # warm imports and sympy caches
        rate(pool, comps, probs)  # start the workers
        for k in range(args.rounds):  # alternate, so a load change on a shared machine hits both
            comps, probs = batch(args.n, seed=1 + k)
            s, s_mean = rate(serial, comps, probs)
            p, p_mean = rate(pool, comps, probs)
            assert s_mean == p_mean, (s_mean, p_mean)
            serial_rates.append(s)
            pool_rates.append(p)
    s, p = float(np.median(serial_rates)), float(np.median(pool_rates))
    print(f"serial (in-process):     {s:8.0f} verifications/s")
    print(f"pool ({args.workers} fork workers):  {p:8.0f} verifications/s")
    print(f"ratio pool/serial:       {p / s:8.2f}x   (medians of {args.rounds} rounds, n={args.n},"
          f" mean reward {p_mean:.3f})")


if __name__ == "__main__":
    main()
