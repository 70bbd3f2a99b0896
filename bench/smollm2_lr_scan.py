"""An lr scan on a real chat model: SmolLM2-135M-Instruct trained by `twoclocks train` on
`examples/smollm2-task.toml` (two-digit sums) at several (batch, lr, seed) cells, held-out
accuracy against samples, and where each run collapses after progress.

Why: a batch-size study of the failure clock needs an lr at which held-out accuracy first rises,
then falls and stays down (a collapse after progress), and the lr just below it; an lr that
blows up at once, or a dip that recovers, is not a failure clock. The verdicts use the analysis'
own drop rule (`twoclocks_cli.clocks.collapse.falls`, its defaults: floor = running peak -
max(0.3 x (peak - initial), 0.05), three evals in a row below it; a fall that climbs back is a
dip) on the raw held-out curve, so the scan calls a collapse what `twoclocks analyze` would.
Progress: the curve's peak at least PROGRESS above its first eval. At a collapse (or at the end
of a run without one) the table gives the step metrics the issue asks for: drift from init
(relative), KL to init, entropy and mean response length.

Each cell is its own `twoclocks train` run in its own folder and SQLite store under --out; a
finished cell is reused, an interrupted one resumes from its checkpoint, so the scan resumes.
Accuracy does not depend on load; the minutes column does (say what else ran).

    .venv/bin/python bench/smollm2_lr_scan.py --cells 4:1e-4,4:3e-4 --threads 1
    .venv/bin/python bench/smollm2_lr_scan.py --cells 4:1e-4:1 --budget 2560 --json
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from twoclocks_cli.clocks.collapse import falls  # noqa: E402

TC = str(ROOT / ".venv" / "bin" / "twoclocks")
EXAMPLE = ROOT / "examples" / "smollm2-task.toml"
PROGRESS = 0.05  # a peak this far above the first eval: ~2 s.e. of a difference at 256 problems
AT_FAILURE = ("drift_rel", "kl_init", "entropy", "resp_len_mean", "reward_mean")


@dataclass(frozen=True)
class Cell:
    """One scan run: prompts per batch (x group_size 8 samples), lr, seed."""

    prompts: int
    lr: float
    seed: int

    @property
    def name(self) -> str:
        return f"p{self.prompts}-lr{self.lr:g}-s{self.seed}"


def parse_cells(text: str) -> list[Cell]:
    """`P:LR[:SEED],...` into cells (seed 0 when left out); exits with one line on bad input."""
    cells = []
    for part in text.split(","):
        bits = part.split(":")
        try:
            if len(bits) not in (2, 3):
                raise ValueError
            cells.append(Cell(int(bits[0]), float(bits[1]), int(bits[2]) if len(bits) == 3 else 0))
        except ValueError:
            sys.exit(f"--cells: '{part}': expected PROMPTS:LR or PROMPTS:LR:SEED, e.g. 4:1e-4:0")
    return cells


def run_config(text: str, cell: Cell, args) -> str:
    """The example with this cell's batch, lr, seed and the scan's budget, evals and threads."""
    subs = {"prompts_per_batch": str(cell.prompts), "lr": f"{cell.lr:g}", "seed": str(cell.seed),
            "threads": str(args.threads), "sample_budget": str(args.budget),
            "eval_every_samples": str(args.eval_every), "eval_size": str(args.eval_size),
            "checkpoint_every_steps": "5"}
    for key, value in subs.items():
        text, n = re.subn(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
        if n != 1:
            sys.exit(f"{EXAMPLE}: no single `{key} =` line to replace")
    return text


def train(cell: Cell, args) -> Path:
    """Train one cell into its own folder (reused when finished); the folder."""
    folder = Path(args.out).resolve() / cell.name
    if (folder / "wall_s").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    cfg = folder / "smollm2.toml"
    cfg.write_text(run_config(EXAMPLE.read_text(), cell, args))
    print(f"training {cell.name} ...", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    done = subprocess.run([TC, "train", str(cfg), "--db", f"sqlite:///{folder / 'run.db'}",
                           "--workdir", str(folder / "wd"), "--json"],
                          cwd=folder, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{cell.name}: rc {done.returncode}\n{done.stderr[-3000:]}")
    (folder / "wall_s").write_text(f"{time.monotonic() - t0:.1f}")
    return folder


def read_run(folder: Path) -> tuple[list[tuple[int, int, float]], dict[int, dict[str, float]]]:
    """(evals as (step, samples, accuracy), step -> the AT_FAILURE metrics) of one store."""
    with sqlite3.connect(folder / "run.db") as c:
        evals = c.execute("SELECT step, samples, value FROM metrics WHERE key = "
                          "'eval_accuracy' ORDER BY step").fetchall()
        marks = ",".join("?" * len(AT_FAILURE))
        rows = c.execute(f"SELECT step, key, value FROM metrics WHERE key IN ({marks})",
                         AT_FAILURE).fetchall()
    steps: dict[int, dict[str, float]] = {}
    for step, key, value in rows:
        steps.setdefault(step, {})[key] = value
    return evals, steps


def around(steps: dict[int, dict[str, float]], step: int, width: int = 2) -> dict[str, float]:
    """Each AT_FAILURE metric averaged over the trained steps within `width` of `step`
    (one step is noisy: 32 samples)."""
    near = [m for s, m in steps.items() if abs(s - step) <= width]
    return {k: sum(m[k] for m in near if k in m) / max(1, sum(k in m for m in near))
            for k in AT_FAILURE}


def verdict(cell: Cell, folder: Path) -> dict:
    """The cell's curve, its peak, the drop rule's dips and collapse, and the metrics there."""
    evals, steps = read_run(folder)
    samples = [n for _, n, _ in evals]
    acc = [v for _, _, v in evals]
    found = falls(samples, acc, acc[0], raw=acc, recover=0.5)
    collapse = next((f.at for f in found if not f.dip), None)
    top = max(range(len(acc)), key=acc.__getitem__)
    progressed = acc[top] - acc[0] >= PROGRESS
    kind = ("collapse after progress" if collapse is not None and progressed
            else "falls without progress" if collapse is not None
            else "progress, no collapse" if progressed else "no progress")
    at_step = (next(s for s, n, _ in evals if n == collapse) if collapse is not None
               else evals[-1][0])
    return {"prompts": cell.prompts, "samples_per_batch": cell.prompts * 8, "lr": cell.lr,
            "seed": cell.seed, "base": acc[0], "peak": acc[top], "peak_at": samples[top],
            "final": acc[-1], "collapse_at": collapse,
            "dips": [f.at for f in found if f.dip], "verdict": kind,
            "at": {"step": at_step, **around(steps, at_step)},
            "curve": [[n, round(v, 4)] for n, v in zip(samples, acc, strict=True)],
            "wall_min": float((folder / "wall_s").read_text()) / 60}


def table(rows: list[dict]) -> str:
    """One line per cell, the metrics at its collapse (or its end), then its curve."""
    out = [f"{'B':>4} {'lr':>7} {'seed':>4} {'base':>5} {'peak':>5} {'@':>5} {'final':>5} "
           f"{'collapse':>8} {'dips':>9}  {'verdict':<24} {'drift':>8} {'KL0':>6} {'ent':>5} "
           f"{'len':>5} {'min':>5}  curve (samples:acc)"]
    for r in rows:
        a = r["at"]
        out.append(f"{r['samples_per_batch']:>4} {r['lr']:>7.1e} {r['seed']:>4} {r['base']:>5.3f} "
                   f"{r['peak']:>5.3f} {r['peak_at']:>5} {r['final']:>5.3f} "
                   f"{'-' if r['collapse_at'] is None else int(r['collapse_at']):>8} "
                   f"{','.join(str(int(d)) for d in r['dips']) or '-':>9}  "
                   f"{r['verdict']:<24} {a['drift_rel']:>8.2e} {a['kl_init']:>6.3f} "
                   f"{a['entropy']:>5.3f} {a['resp_len_mean']:>5.1f} {r['wall_min']:>5.1f}  "
                   + " ".join(f"{n}:{v:.2f}" for n, v in r["curve"]))
    out.append("drift, KL0, ent, len: drift from init (relative), KL to init, token entropy and "
               "mean response length around the collapse (or the last eval)")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default="4:3e-5,4:1e-4,4:3e-4",
                    help="PROMPTS:LR[:SEED] cells, comma-separated; 8 samples per prompt")
    ap.add_argument("--budget", type=int, default=1280, help="samples per run (default 1280)")
    ap.add_argument("--eval-every", type=int, default=160, help="samples between evals")
    ap.add_argument("--eval-size", type=int, default=256, help="held-out problems per eval")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "out" / "lr_scan"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [verdict(cell, train(cell, args)) for cell in parse_cells(args.cells)]
    print(json.dumps(rows, indent=1) if args.json else table(rows))


if __name__ == "__main__":
    main()
