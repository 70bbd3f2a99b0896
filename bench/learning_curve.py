"""A learning curve on a real chat model: SmolLM2-135M-Instruct trained by `twoclocks train` on
`examples/smollm2-train.toml`'s task, held-out accuracy against samples and wall time.

Why: the trainer's claims on the tiny model say nothing about whether GRPO moves a pretrained
chat model here. Target: held-out accuracy (eval at T = 0.7 on `--eval-size` problems the
training never draws) rises by >= 0.10 over the step-0 base rate within a budget that runs in
<= 60 minutes on 2 cores. A finding counts when it replicates, so each (seed, threads) pair is
its own run, into its own SQLite store under --out, and the table has one row per run.

Each run is `twoclocks train` on the example with budget, lr, eval cadence, seed and threads
replaced; a finished run is reused; an interrupted one resumes from its checkpoint.
Run it with nothing else on the machine: the minutes column is wall time.

    .venv/bin/python bench/learning_curve.py                      # seeds 0,1 x threads 2,1
    .venv/bin/python bench/learning_curve.py --runs 0:2 --budget 640 --json
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TC = str(ROOT / ".venv" / "bin" / "twoclocks")
EXAMPLE = ROOT / "examples" / "smollm2-train.toml"
TARGET_GAIN, TARGET_MINUTES = 0.10, 60.0


def run_config(text: str, seed: int, threads: int, args) -> str:
    """The example with this run's budget, lr, eval cadence, seed and threads."""
    subs = {"sample_budget": str(args.budget), "lr": repr(args.lr), "seed": str(seed),
            "threads": str(threads), "eval_every_samples": str(args.eval_every),
            "eval_size": str(args.eval_size), "checkpoint_every_steps": "10"}
    for key, value in subs.items():
        text, n = re.subn(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
        if n != 1:
            sys.exit(f"{EXAMPLE}: no single `{key} =` line to replace")
    return text


def train(seed: int, threads: int, args) -> Path:
    """Train one (seed, threads) run into its own folder; the folder."""
    folder = Path(args.out) / f"seed{seed}-threads{threads}"
    if (folder / "wall_s").exists():  # finished before: its figures stand
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    cfg = folder / "smollm2.toml"
    cfg.write_text(run_config(EXAMPLE.read_text(), seed, threads, args))
    t0 = time.monotonic()
    done = subprocess.run([TC, "train", str(cfg), "--db", f"sqlite:///{folder / 'run.db'}",
                           "--workdir", str(folder / "wd"), "--json"],
                          cwd=folder, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"seed {seed} threads {threads}: rc {done.returncode}\n{done.stderr[-3000:]}")
    (folder / "wall_s").write_text(f"{time.monotonic() - t0:.1f}")
    return folder


def curve(folder: Path) -> dict:
    """Eval accuracy per step with samples and the run's own seconds (sum of step timings)."""
    with sqlite3.connect(folder / "run.db") as c:
        evals = c.execute("SELECT step, samples, value FROM metrics WHERE key = "
                          "'eval_accuracy' ORDER BY step").fetchall()
        secs = dict(c.execute("SELECT step, SUM(value) FROM metrics WHERE key IN "
                              "('time_gen_s', 'time_reward_s', 'time_update_s') "
                              "GROUP BY step").fetchall())
    return {"evals": [(s, n, v) for s, n, v in evals],
            "train_s": {s: sum(t for k, t in secs.items() if k <= s) for s, _, _ in evals},
            "wall_s": float((folder / "wall_s").read_text())}


def summary(seed: int, threads: int, c: dict) -> dict:
    """Base rate, best eval and the first eval past base + TARGET_GAIN (samples, minutes)."""
    (_, _, base), rest = c["evals"][0], c["evals"][1:]
    first = next(((s, n) for s, n, v in rest if v >= base + TARGET_GAIN), None)
    return {"seed": seed, "threads": threads, "base": base,
            "best": max(v for _, _, v in rest), "final": rest[-1][2],
            "evals": [[n, round(v, 4)] for _, n, v in c["evals"]],
            "gain_samples": first[1] if first else None,
            "gain_train_min": c["train_s"][first[0]] / 60 if first else None,
            "wall_min": c["wall_s"] / 60}


def table(rows: list[dict]) -> str:
    """One line per run; then whether every run met the target."""
    out = [f"{'seed':>4} {'thr':>3} {'base':>6} {'best':>6} {'final':>6} "
           f"{'+0.10 at':>9} {'train min':>9} {'wall min':>8}  curve (samples: acc)"]
    for r in rows:
        at = f"{r['gain_samples']:,}" if r["gain_samples"] is not None else "never"
        mins = f"{r['gain_train_min']:.1f}" if r["gain_train_min"] is not None else "-"
        pts = " ".join(f"{n}:{v:.2f}" for n, v in r["evals"])
        out.append(f"{r['seed']:>4} {r['threads']:>3} {r['base']:>6.3f} {r['best']:>6.3f} "
                   f"{r['final']:>6.3f} {at:>9} {mins:>9} {r['wall_min']:>8.1f}  {pts}")
    met = all(r["gain_samples"] is not None and r["wall_min"] <= TARGET_MINUTES for r in rows)
    out.append(f"target (+{TARGET_GAIN:.2f} over base within {TARGET_MINUTES:.0f} min) "
               f"{'met by every run' if met else 'NOT met by every run'}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="0:2,1:2,0:1",
                    help="seed:threads pairs, comma-separated (default 0:2,1:2,0:1)")
    ap.add_argument("--budget", type=int, default=320, help="samples per run (default 320)")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--eval-every", type=int, default=160, help="samples between evals")
    ap.add_argument("--eval-size", type=int, default=128)
    ap.add_argument("--out", default=str(ROOT / "out" / "learning_curve"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for pair in args.runs.split(","):
        seed, threads = (int(x) for x in pair.split(":"))
        rows.append(summary(seed, threads, curve(train(seed, threads, args))))
    print(json.dumps(rows, indent=1) if args.json else table(rows))


if __name__ == "__main__":
    main()
