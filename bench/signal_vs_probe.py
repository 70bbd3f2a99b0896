"""Which in-run signal tracks the local B_crit on real GRPO training: `twoclocks probe` branches a
main-job run at several points, and each candidate signal is read at the same point.

Why: an adaptive batch rule can only follow what it can see during the run. The probe is the
measured truth: from the run's state at `--at`, every batch size trains on with the sqrt lr and
the run's Adam state, and the local B_crit is where the samples to a held-out gain start to grow.

The candidates, all from the run's own rows or from short stretches of the probe's branches:
  - B_simple, the Euclidean noise scale from the two-batch gradient terms the trainer logs at every
    step, EMA-smoothed with weight 0.05 (what `analyze` and the noise rule read) and 0.3;
  - B_simple per step, the median of the last 16 measuring steps without smoothing;
  - the short-branch reading (what the branch rule sees): the batch whose branches gained the most
    held-out accuracy in their first 1,024 and 2,048 samples (median over seeds). The branch rule
    spends those samples; the probe's branches are long, so the short reading is their prefix.
B_sign is not among them: the grpo trainer does not log the l1 terms it needs.

What it runs, through the CLI into one SQLite store under $OUT (default out/bench-signal-probe):
the main job (`scripts/demo.sh`, reused when it finished; `--from-db` copies a finished store,
e.g. bench/adaptive_real.py's), then one probe per point, reusing finished probes. About 4-6
minutes per point on 2 idle cores (8 branches of 8,192 samples plus a replay to the point).

    .venv/bin/python bench/signal_vs_probe.py
    .venv/bin/python bench/signal_vs_probe.py --from-db out/bench-adaptive-real/twoclocks.db
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
from adaptive_real import ROOT, SWEEP, TC, sh  # bench/ is this script's own folder on sys.path

sys.path.insert(0, str(ROOT))
SHORT = (1024, 2048)  # the branch rule's branch lengths read off the probe's branches
LAST = 16  # measuring steps in the unsmoothed B_simple median


def main_job(out: Path, from_db: Path | None) -> str:
    """The main job's store URL: a copy of a finished one, or scripts/demo.sh run into `out`."""
    db = out / "twoclocks.db"
    if from_db is not None and not db.exists():
        shutil.copyfile(from_db, db)
    url = f"sqlite:///{db}"
    if from_db is None:
        print("the main job (scripts/demo.sh) ...", flush=True)
        sh("bash", "scripts/demo.sh", env={"TWOCLOCKS_DEMO_OUT": str(out)})
    return url


def run_id(url: str, batch: int, seed: int) -> int:
    """The main job's constant-batch run at `batch` samples and `seed`."""
    rows = json.loads(sh(TC, "runs", "list", "--sweep", SWEEP, "--db", url, "--json"))
    for r in rows:
        if r["batch_samples"] == batch and r["seed"] == seed:
            return int(r["id"])
    sys.exit(f"no run of sweep {SWEEP} at {batch} samples, seed {seed} in {url}")


def probe(url: str, rid: int, at: int, args) -> dict:
    """`twoclocks probe --wait --json` at one point (a finished probe is read, not rerun)."""
    print(f"probe of run {rid} at {at:,} samples ...", flush=True)
    text = sh(TC, "probe", str(rid), "--at", str(at), "--batches", args.batches,
              "--branch-samples", str(args.branch_samples), "--seeds", str(args.seeds),
              "--eval-every", str(args.eval_every), "--wait", "--json",
              "--workdir", str(args.out / "probes"), "--db", url)
    return json.loads(text)


def b_simple_signals(store, rid: int, step: int, probed: dict) -> dict:
    """B_simple at `step`: the probe's own reading (EMA 0.05, `probed` = its `noise`), under EMA
    0.3, and the median of the last unsmoothed steps."""
    from twoclocks_cli.clocks.runclock import GRAD_KEYS
    from twoclocks_cli.clocks.stats import noise_scale

    s = [store.load_metric([rid], k)[rid] for k in GRAD_KEYS]
    upto = int(np.searchsorted(s[0].steps, step, side="right"))
    terms = [x.values[:upto] for x in s]
    v = noise_scale(*terms, ema_alpha=0.3)[-1]
    out = {"ema0.05": probed["b_simple"],
           "ema0.3": float(v) if np.isfinite(v) and v > 0 else None}
    raw = noise_scale(*(t[-LAST:] for t in terms), ema_alpha=1.0)
    raw = raw[np.isfinite(raw)]
    out["raw_median"] = float(np.median(raw)) if raw.size else None
    out["raw_positive"] = f"{int((raw > 0).sum())}/{raw.size}"
    return out


def short_reading(store, res: dict, horizon: int) -> tuple[int | None, dict]:
    """The batch whose branches' median held-out gain over their first `horizon` samples is
    largest (the branch rule's comparison at that branch length), with every batch's gain."""
    at, p0 = res["at_samples"], res["progress_at"]
    gains = {}
    for b, ids in res["branch_runs"].items():
        series = store.load_metric(ids, "eval_accuracy")
        got = []
        for rid in ids:
            s = series.get(rid)
            ok = np.flatnonzero((s.samples > at) & (s.samples <= at + horizon)
                                & np.isfinite(s.values)) if s is not None else []
            if len(ok):
                got.append(float(s.values[ok[-1]]) - p0)
        if got:
            gains[int(b)] = float(np.median(got))
    best = max(gains, key=gains.get) if gains else None
    return best, gains


def fmt(x) -> str:
    return "-" if x is None else f"{x:,.0f}"


def ratio(a, b) -> str:
    return "-" if a is None or b is None else f"{a / b:.1f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "bench-signal-probe")
    ap.add_argument("--from-db", type=Path, help="copy this finished main-job store first")
    ap.add_argument("--batch", type=int, default=128, help="the probed run's batch (samples)")
    ap.add_argument("--seed", type=int, default=0, help="the probed run's seed")
    ap.add_argument("--at", default="2048,8192,16384,24576", help="branch points (samples)")
    ap.add_argument("--batches", default="32,128,512,1024", help="the branches' batch sizes")
    ap.add_argument("--branch-samples", type=int, default=8192)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=512)
    args = ap.parse_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)

    from twoclocks_cli.store import Store

    url = main_job(args.out, args.from_db)
    rid = run_id(url, args.batch, args.seed)
    store = Store.open(url)
    rows = []
    for at in (int(a) for a in args.at.split(",")):
        res = probe(url, rid, at, args)
        if res.get("state") != "done":
            sys.exit(f"probe at {at}: {res}")
        bc = res["b_crit"]
        sig = b_simple_signals(store, rid, res["at_step"], res["noise"])
        short = {h: short_reading(store, res, h) for h in SHORT}
        rows.append({"at": at, "progress_at": res["progress_at"], "b_crit": bc,
                     "clocks": res["clocks"], "b_simple": sig,
                     "short": {h: {"best": b, "gains": g} for h, (b, g) in short.items()}})
    (args.out / f"signal_vs_probe-run{rid}.json").write_text(json.dumps(rows, indent=1))

    from twoclocks_cli.clocks.critical import Estimate

    print(f"\nrun {rid} ({args.batch} samples, seed {args.seed}); probe branches "
          f"{args.batches} x {args.seeds} seeds x {args.branch_samples:,} samples")
    head = ("at", "eval acc", "probe local B_crit", "B_simple ema.05", "probe/B_simple",
            "ema.3", f"raw med ({LAST}, >0)", *(f"short best {h}" for h in SHORT))
    print(" | ".join(head))
    for r in rows:
        est = Estimate(**r["b_crit"])
        s = r["b_simple"]
        print(" | ".join([f"{r['at']:,}", f"{r['progress_at']:.3f}", est.text(),
                          fmt(s["ema0.05"]), ratio(est.b_crit, s["ema0.05"]), fmt(s["ema0.3"]),
                          f"{fmt(s['raw_median'])} ({s['raw_positive']})",
                          *(fmt(r["short"][h]["best"]) for h in SHORT)]))
    print("\nprobe clocks (samples from the point to the target, per seed; None = censored):")
    for r in rows:
        print(f"  at {r['at']:,}: {r['clocks']}")
    print("short-branch median gains (held-out accuracy after - at the point):")
    for r in rows:
        print(f"  at {r['at']:,}: " + "; ".join(
            f"{h}: " + ", ".join(f"{b} {g:+.3f}" for b, g in r["short"][h]["gains"].items())
            for h in SHORT))


if __name__ == "__main__":
    main()
