"""The cost of one step's parameter drift on SmolLM2-135M: `trainer.metrics.Drift` against the
whole-tensor reference it replaced, alternating in one process.

Every training step logs `drift_abs` / `drift_rel` (||theta - theta_0|| over every trainable
parameter, summed in float64). The reference forms each parameter's whole difference as a new
tensor (`torch._foreach_sub`, 0.5 GB for SmolLM2's 134.5M float32 parameters) and takes its
float64 norms; `Drift` forms the difference a block at a time in one reused float64 buffer.
Both run on the same weights: SmolLM2 (`builtin:smollm2-135m`, float32) moved by a fixed random
step from a saved copy, so the drift is not zero. Printed: each one's median and range over
--runs alternating calls, the ratio reference / Drift of the medians, and both values (they agree
to 1e-7 relative: the reference rounds each difference to float32; the bench stops if they
differ by more).

    python bench/drift_cost.py [--runs 15] [--threads 2]

Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import time


def reference(now, then) -> float:
    """The whole-tensor drift: one fresh difference per parameter, its float64 norms."""
    import torch

    norms = torch._foreach_norm(torch._foreach_sub(now, then), 2, dtype=torch.float64)
    return float(torch.stack(norms).pow(2).sum()) ** 0.5


def timed(fn) -> tuple[float, float]:
    """(seconds, value) of one call."""
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=15, help="Alternating calls of each.")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from trainer.metrics import Drift
    from trainer.smollm2 import ensure_smollm2

    torch.set_num_threads(a.threads)
    model = AutoModelForCausalLM.from_pretrained(ensure_smollm2(), dtype=torch.float32)
    drift = Drift(model)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 1e-4)
    now = [p.detach() for p in model.parameters() if p.requires_grad]
    n = sum(t.numel() for t in now)

    ours, ref = [], []
    for _ in range(a.runs):
        t, v_ours = timed(lambda: drift(model)[0])
        ours.append(t)
        t, v_ref = timed(lambda: reference(now, drift.theta0))
        ref.append(t)
    if abs(v_ours - v_ref) > 1e-7 * v_ref:
        raise SystemExit(f"the two drifts differ: Drift {v_ours!r}, reference {v_ref!r}")

    def show(name: str, ts: list[float]) -> str:
        ms = [1e3 * t for t in ts]
        return (f"{name:<34} {statistics.median(ms):8.1f} ms  "
                f"({min(ms):.1f}–{max(ms):.1f}, {a.runs} calls)")

    print(f"SmolLM2-135M, {n:,} trainable float32 parameters, {a.threads} threads")
    print(show("reference (foreach_sub + norms)", ref))
    print(show("Drift (blocked, reused buffer)", ours))
    print(f"reference / Drift (medians): {statistics.median(ref) / statistics.median(ours):.2f}x")
    print(f"drift_abs: Drift {v_ours:.12g}, reference {v_ref:.12g}")


if __name__ == "__main__":
    main()
