"""Overhead of TwoClocksCallback: the same TRL GRPOTrainer run with and without it, interleaved.

Each run trains `builtin:tiny-arith` (the trl backend's builtin entry: tiny model, arithmetic
prompts, strict math-verify reward) for `--steps` optimizer steps of `--prompts` x G=8
completions, fp32 on CPU, one update per batch, logging every step. Run A has no callback; run
B adds `TwoClocksCallback` writing every log into a fresh SQLite store (one flush per log, as in
a sweep). Runs go A B A B ... in one process (same warm caches for both); samples/s counts the
steps after the first of each run (its warm-up). Prints each run, the median samples/s of A and
B, their ratio B / A, and the ratio within each A B pair. Target: >= 0.98. Benchmark only on
an otherwise idle machine (the load average is printed).

    python bench/trl_overhead.py [--steps 20] [--repeats 3] [--prompts 16] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def one_run(steps: int, prompts: int, with_callback: bool, work: Path, tag: str) -> float:
    """samples/s of one training run (steps 2..N), with or without the callback."""
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig

    from twoclocks_cli.backends.trl_tiny import tiny_arith_trainer
    from twoclocks_cli.integrations.trl import TwoClocksCallback

    g = 8
    args = GRPOConfig(
        output_dir=str(work / tag), per_device_train_batch_size=prompts * g, num_generations=g,
        max_completion_length=12, learning_rate=1e-4, lr_scheduler_type="constant", beta=0.0,
        temperature=1.0, bf16=False, gradient_checkpointing=False, use_cpu=True,
        max_steps=steps, logging_steps=1, save_strategy="no", report_to="none", seed=0,
        disable_tqdm=True, dataloader_num_workers=0)
    trainer = tiny_arith_trainer(args)
    trainer.remove_callback(PrinterCallback)  # the same quiet run for A and B
    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            marks.append(time.perf_counter())

    trainer.add_callback(Clock())
    if with_callback:
        trainer.add_callback(TwoClocksCallback(db=f"sqlite:///{work / 'bench.db'}",
                                               sweep="bench", name=tag))
    trainer.train()
    trainer.twoclocks_close()
    return (len(marks) - 1) * prompts * g / (marks[-1] - marks[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps per run")
    ap.add_argument("--repeats", type=int, default=3, help="A B pairs")
    ap.add_argument("--prompts", type=int, default=16, help="prompts per batch (G = 8)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    print(f"load average before: {os.getloadavg()[0]:.2f} (benchmark on an idle machine)")
    rates: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        one_run(3, a.prompts, True, work, "warm-up")  # model cache, imports, allocator
        for i in range(a.repeats):
            for with_cb in (False, True):
                tag = f"{'B' if with_cb else 'A'}{i}"
                rate = one_run(a.steps, a.prompts, with_cb, work, tag)
                rates[with_cb].append(rate)
                print(f"run {tag} ({'with' if with_cb else 'without'} callback): "
                      f"{rate:.1f} samples/s")
    plain, logged = statistics.median(rates[False]), statistics.median(rates[True])
    pairs = [b / a for a, b in zip(rates[False], rates[True], strict=True)]
    print(f"median samples/s: without {plain:.1f}, with {logged:.1f}; "
          f"ratio with/without = {logged / plain:.3f} (target >= 0.98)")
    print("ratio per A B pair: " + ", ".join(f"{r:.3f}" for r in pairs)
          + f"; median {statistics.median(pairs):.3f} (a pair far from the others was disturbed "
          "by other load)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
