"""Does the recommended schedule stop before a single run fails? The drift-threshold simulator.

The theory model's runs collapse where their parameter drift crosses a threshold D, a clock that
is the same in samples at every batch under the sqrt rule (without a cap). For several D (so the
failure clock falls at several sample counts) and with and without a per-step cap, this runs a
sim sweep (batches 4-64 samples, 3 seeds), analyses it with the drift rule at D, takes the
recommended schedule, and trains that schedule on 200 fresh seeds to where its last phase
ends. It prints how many of those runs collapsed before the end (target: <= 2%), per sweep seed
set (a repeat sweep redraws the 3 seeds the schedule rests on).

    .venv/bin/python bench/schedule_stop.py                 # 4 thresholds x cap/free x 2 sets
    .venv/bin/python bench/schedule_stop.py --runs 50 --thresholds 6.5
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.simsweep import make_sweep  # noqa: E402
from twoclocks_cli.clocks import AnalysisOptions, analyze_sweep, make_schedule  # noqa: E402
from twoclocks_cli.store import Store  # noqa: E402

PROMPTS = [1, 2, 4, 8, 16]  # G = 4: 4-64 samples
SIM = {"log_every": 4, "eval_every": 1, "checkpoint_every": 100000}
CAP = 0.05


def one(store, root: Path, d: float, cap: bool, set_no: int, runs: int) -> dict:
    """Sweep, schedule, and `runs` fresh runs of the schedule to its end."""
    sim = {**SIM, "drift_threshold": d, **({"cap": CAP} if cap else {})}
    budget = 60_000 * (d / 6.5) ** 2
    tag = f"d{d}-{'cap' if cap else 'free'}-set{set_no}"
    make_sweep(store, tag, PROMPTS, 3, budget, sim, root / tag, seed0=1000 * set_no)
    opts = AnalysisOptions(target="0.9", drift_threshold=d, theory=False, bootstrap=200)
    a = analyze_sweep(store, tag, opts)
    plan = make_schedule(a, budget=budget)
    phases = [dict(p) for p in plan["phases"]]
    end = phases[-1]["until_samples"]
    name = f"{tag}-runs"
    make_sweep(store, name, [phases[0]["prompts_per_batch"]], runs, end, sim, root / name,
               phases=phases, seed0=100_000 + 1000 * set_no)
    ran = analyze_sweep(store, name, opts)
    failed = sum(r.failure.samples is not None and r.failure.samples <= end for r in ran.runs)
    fails = [r.failure.samples for r in a.runs if r.failure.samples is not None]
    shape = " -> ".join(f"{p['prompts_per_batch'] * 4}" for p in phases)
    return {"tag": tag, "sweep_fail": (min(fails), max(fails)) if fails else None,
            "schedule": shape, "end": end, "failed": failed, "runs": len(ran.runs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--thresholds", default="5,6.5,8,10")
    ap.add_argument("--sets", type=int, default=2, help="sweep seed sets per setting")
    ap.add_argument("--runs", type=int, default=200, help="runs of each schedule")
    args = ap.parse_args()
    print("| D | cap | sweep set | sweep failures (samples) | schedule | ends at | collapsed "
          "before the end |")
    print("|---|---|---|---|---|---|---|")
    total = bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = Store.open(f"sqlite:///{root / 'bench.db'}")
        for d in [float(x) for x in args.thresholds.split(",")]:
            for cap in (False, True):
                for k in range(args.sets):
                    t0 = time.time()
                    r = one(store, root, d, cap, k, args.runs)
                    total += r["runs"]
                    bad += r["failed"]
                    sf = "none" if r["sweep_fail"] is None else \
                        f"{r['sweep_fail'][0]:,.0f}-{r['sweep_fail'][1]:,.0f}"
                    print(f"| {d:g} | {'yes' if cap else 'no'} | {k} | {sf} | {r['schedule']} | "
                          f"{r['end']:,.0f} | {r['failed']} of {r['runs']} "
                          f"({r['failed'] / r['runs']:.1%}) |  [{time.time() - t0:.0f} s]",
                          flush=True)
        store.close()
    print(f"all: {bad} of {total} runs collapsed before their schedule ended "
          f"({bad / max(total, 1):.2%}; target <= 2% per schedule)")


if __name__ == "__main__":
    main()
