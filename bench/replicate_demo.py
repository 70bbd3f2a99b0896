"""The main job's sweep replicated: other seed sets and another thread count, one table.

Why: float rounding differs between machines and thread counts, and GRPO amplifies it; a
conclusion of the demo counts only when it holds across disjoint seed sets AND at threads 1 and
2 (a different thread count changes the rounding the way another machine does). This reruns
`examples/tiny-arith-sweep.toml` (or --config) once per (seed set, thread count), each into its
own SQLite store under $OUT (default out/replicate/<tag>/), reusing finished cells, then
analyses each with the demo's options and prints: B_crit, collapses and dips per batch, the
schedule's shape and the tool's own stability verdict.

About 12 minutes a replication on 2 idle cores (12 cells of 32,768 samples); run it with nothing
else on the machine.

    .venv/bin/python bench/replicate_demo.py                         # 3 seed sets x threads 1, 2
    .venv/bin/python bench/replicate_demo.py --seed-sets 0-3,4-7 --threads 1
    .venv/bin/python bench/replicate_demo.py --analyze-only --json   # the table from what ran
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TC = str(ROOT / ".venv" / "bin" / "twoclocks")
CONFIG = ROOT / "examples" / "tiny-arith-sweep.toml"
ANALYZE = ["--drift-key", "drift_rel"]  # the demo's options (scripts/demo.sh)
SCHEDULE = ["--large-lr", "hold"]


def sh(*args: str) -> str:
    """Run a command from the repository root; its stdout (stderr shown on failure)."""
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(args)}: rc {done.returncode}\n{done.stderr[-3000:]}")
    return done.stdout


def seed_set(spec: str) -> list[int]:
    """'4-7' -> [4, 5, 6, 7]; '0,2' -> [0, 2]."""
    if "-" in spec:
        lo, hi = spec.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in spec.split("+")]


def replicate_config(text: str, seeds: list[int], threads: int, workdir: Path) -> str:
    """The sweep config with its seeds, thread count (cells at once: 2 cores // threads) and
    workdir replaced."""
    subs = {
        "seeds": json.dumps(seeds),
        "threads": str(threads),
        "threads_per_job": str(threads),
        "max_parallel": str(max(1, 2 // threads)),
        "workdir": json.dumps(str(workdir)),
    }
    for key, value in subs.items():
        text, n = re.subn(rf"(?m)^{key}\s*=[^#\n]*", f"{key} = {value}  ", text)
        if not n:
            sys.exit(f"{CONFIG}: no '{key} = ...' line to replace")
    return text


def run_one(tag: str, seeds: list[int], threads: int, out: Path, analyze_only: bool) -> dict:
    """One replication: the sweep (unless analyze_only), its analysis and schedule as JSON."""
    here = out / tag
    here.mkdir(parents=True, exist_ok=True)
    cfg = here / "sweep.toml"
    cfg.write_text(replicate_config(CONFIG.read_text(), seeds, threads, here / "runs"))
    db = f"sqlite:///{here / 'twoclocks.db'}"
    t0 = time.time()
    if not analyze_only:
        print(f"[{tag}] sweep (seeds {seeds}, threads {threads})", flush=True)
        sh(TC, "sweep", str(cfg), "--db", db, "--wait")
    name = re.search(r'(?m)^name\s*=\s*"([^"]+)"', cfg.read_text()).group(1)
    analysis = json.loads(sh(TC, "analyze", name, "--db", db, "--save", "--json", *ANALYZE))
    schedule = json.loads(sh(TC, "schedule", name, "--db", db, "--json", *SCHEDULE))
    return {"tag": tag, "seeds": seeds, "threads": threads, "seconds": time.time() - t0,
            "analysis": analysis, "schedule": schedule}


def _n(x) -> str:
    return "-" if x is None else f"{x:,.0f}"


def b_crit_text(rec: dict) -> str:
    """B_crit as `analyze` prints it: '1,459 [943, open]', '>= 2,048', '<= 128', 'none'."""
    b, bound = rec.get("b_crit"), rec.get("bound")
    if b is None:
        return "none"
    if bound in ("lower", "upper"):
        return f"{'>=' if bound == 'lower' else '<='} {b:,.0f}"
    if rec.get("low") is None:
        return f"{b:,.0f}"
    low = ("<= " if rec.get("low_bound") else "") + f"{rec['low']:,.0f}"
    high = "open" if rec.get("high") is None else f"{rec['high']:,.0f}"
    return f"{b:,.0f} [{low}, {high}]"


def summary(rep: dict) -> dict:
    """The conclusions the main job must replicate, from one replication's JSON."""
    a, s = rep["analysis"], rep["schedule"]
    per_batch = {
        f"{row['batch_samples']:g}": {
            "progress": row["progress"]["median"],
            "collapses": row["failure"].get("n_failed"),
            "runs_with_dips": row["failure"].get("runs_with_dips"),
            "runs": row["n_runs"],
        }
        for row in a["batches"]
    }
    group = rep.get("group_size", 8)
    phases = " -> ".join(
        f"{p['prompts_per_batch'] * group:,} to {p['until_samples']:,.0f}" for p in s["phases"])
    stab = (s.get("stability") or {}).get("schedule") or {}
    share = stab.get("main_share", stab.get("share"))
    settled = s.get("settled")
    return {"tag": f"seeds {rep['tag'].split('_')[1]}, threads {rep['threads']}",
            "b_crit": b_crit_text(a["critical_batch"].get("recommended") or {}),
            "per_batch": per_batch, "b_small": s["b_small"], "schedule": phases,
            "settled": settled, "share": share,
            "verdict": (s.get("stability") or {}).get("verdict")}


def table(rows: list[dict]) -> str:
    """The markdown table docs/benchmarks.md shows, exactly as it is printed here."""
    batches = sorted({b for r in rows for b in r["per_batch"]}, key=float)
    head = ["replication", "B_crit"] + [
        f"{float(b):,.0f}: progress / collapsed / with dips" for b in batches] + [
        "B_small", "schedule", "settled"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["tag"], r["b_crit"]]
        for b in batches:
            pb = r["per_batch"].get(b)
            cells.append("-" if pb is None else
                         f"{_n(pb['progress'])} / {pb['collapses']} of {pb['runs']} / "
                         f"{pb['runs_with_dips']} of {pb['runs']}")
        settled = "-" if r["settled"] is None else (
            f"{'yes' if r['settled'] else 'no'} ({r['share']:.0%})")
        cells += [f"{r['b_small']:,.0f}", r["schedule"], settled]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed-sets", default="0-3,4-7,8-11",
                    help="comma-separated seed sets: 4-7 (a range) or 0+2+5 (a list)")
    ap.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    ap.add_argument("--out", default=os.environ.get("OUT", "out/replicate"))
    ap.add_argument("--analyze-only", action="store_true",
                    help="analyse the replications already run; train nothing")
    ap.add_argument("--json", action="store_true", help="print the summaries as JSON")
    args = ap.parse_args()
    out = (ROOT / args.out).resolve()
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        for spec in args.seed_sets.split(","):
            seeds = seed_set(spec)
            tag = f"seeds {spec} threads {threads}".replace(" ", "_")
            if args.analyze_only and not (out / tag / "twoclocks.db").is_file():
                continue
            rep = run_one(tag, seeds, threads, out, args.analyze_only)
            (out / tag / "summary.json").write_text(json.dumps(rep, indent=1, default=str))
            rows.append(summary(rep))
            print(f"[{tag}] done in {rep['seconds']:.0f} s", flush=True)
    print(json.dumps(rows, indent=1) if args.json else table(rows))


if __name__ == "__main__":
    main()
