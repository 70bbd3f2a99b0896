"""A stand-in for `python3 -m verl.trainer.main_ppo` (verl needs GPUs): takes verl's Hydra-style
overrides, prints verl's console format through Ray prefixes at a steady pace, checkpoints
and resumes like verl's `trainer.resume_mode=auto`, and can crash mid-run once.

    python verl_writer.py data.train_batch_size=2 actor_rollout_ref.rollout.n=4 \\
        trainer.total_training_steps=12 trainer.default_local_dir=DIR [trainer.resume_mode=auto] \\
        +fixture.pace=0.25 +fixture.save_freq=4 +fixture.crash_at=6 +fixture.crash_seed=1

Every value is a known function of the step (`truth`), so a test can check every stored row.
The crash happens once per checkpoint folder (a marker file remembers it), before step
`crash_at` is printed, on the cell whose data.seed is `crash_seed`.
"""

from __future__ import annotations

import os
import pprint
import sys
import time
from pathlib import Path

DRIVER = f"(TaskRunner pid={os.getpid()})"
WORKER = "(WorkerDict pid=4242, ip=10.0.0.7)"


def truth(step: int, lr: float) -> dict[str, float]:
    """The values the fixture prints at `step` (store names -> value)."""
    return {"reward_mean": round(0.1 + 0.8 * step / (step + 10), 6),
            "loss": round(-0.01 * step, 6), "lr": lr,
            "resp_len_mean": float(100 + step)}


def _overrides(argv: list[str]) -> dict[str, str]:
    out = {}
    for arg in argv:
        key, _, value = arg.partition("=")
        out[key.lstrip("+")] = value
    return out


def _tree(opts: dict[str, str]) -> dict:
    """The overrides as verl's nested config dict (what its driver pprints at start)."""
    tree: dict = {}
    for key, value in opts.items():
        if key.startswith("fixture."):
            continue
        node = tree
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        try:
            node[last] = int(value)
        except ValueError:
            try:
                node[last] = float(value)
            except ValueError:
                node[last] = value
    tree.setdefault("algorithm", {})["adv_estimator"] = "grpo"
    return tree


def main(argv: list[str]) -> int:
    opts = _overrides(argv)
    steps = int(opts["trainer.total_training_steps"])
    lr = float(opts["actor_rollout_ref.actor.optim.lr"])
    pace = float(opts.get("fixture.pace", "0.2"))
    save_freq = int(opts.get("fixture.save_freq", "4"))
    crash_at = int(opts.get("fixture.crash_at", "0"))
    crash_seed = opts.get("fixture.crash_seed")
    ckpt = Path(opts["trainer.default_local_dir"])
    ckpt.mkdir(parents=True, exist_ok=True)
    latest = ckpt / "latest_checkpointed_iteration.txt"
    print(f"{DRIVER} TaskRunner hostname: node0, PID: {os.getpid()}", flush=True)
    for line in pprint.pformat(_tree(opts), width=60).splitlines():
        print(f"{DRIVER} {line}", flush=True)
        if "actor_rollout_ref" in line:  # another Ray process prints into the middle of it
            print(f"{WORKER} Model config after override: Qwen2Config {{...}}", flush=True)
    start = 1
    if opts.get("trainer.resume_mode") == "auto" and latest.exists():
        done = int(latest.read_text())
        print(f"{DRIVER} Load from checkpoint folder: {ckpt}/global_step_{done}", flush=True)
        print(f"{DRIVER} Resuming from global_step_{done}", flush=True)
        start = done + 1
    marker = ckpt / "crashed-once"
    for step in range(start, steps + 1):
        time.sleep(pace)
        if crash_at and step == crash_at and opts.get("data.seed") == crash_seed \
                and not marker.exists():
            marker.write_text("1")
            print(f"{WORKER} [rank0]: CUDA error: an illegal memory access", flush=True)
            print("Traceback (most recent call last):\n  File \"main_ppo.py\", line 42\n"
                  f"RuntimeError: simulated crash before step {step}", file=sys.stderr,
                  flush=True)
            return 1
        t = truth(step, lr)
        print(f"{DRIVER} step:{step} - critic/score/mean:{t['reward_mean']} - "
              f"actor/pg_loss:np.float64({t['loss']}) - actor/lr:{t['lr']} - "
              f"response_length/mean:{t['resp_len_mean']} - timing_s/gen:{pace:.3f}",
              flush=True)
        if step % save_freq == 0:
            latest.write_text(str(step))
    print(f"{DRIVER} Final validation metrics: {{}}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
