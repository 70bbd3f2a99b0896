"""Plan and submit a 256-cell sim sweep to the local SLURM (scripts/slurm-up.sh) and count the
scheduler calls: `sbatch` per submission (must be 1) and `sacct`/`squeue` per status refresh
(must be 1). Baselines measured in the same run: one `sbatch` per cell and one `sacct` per job.

    python bench/submit_scale.py [--cells 256]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CALLS = ("sbatch", "sacct", "squeue", "scancel")

CONFIG = """\
name = "bench-{n}"
backend = "sim"
sample_budget = {budget}
executor = "slurm"
workdir = "{workdir}"
[scaling]
reference_batch = 64
reference_lr = 0.01
[grid]
batch = [1, 2, 4, 8, 16, 32, 64, 128]
group_size = 8
seeds = {seeds}
[sim]
dim = 8
flat_dims = 8
[slurm]
array_parallelism = 2
timeout_min = 10
"""


def counting_path(root: Path, log: Path) -> str:
    """A PATH whose first entries log every scheduler call, then exec the real command."""
    bindir = root / "bin"
    bindir.mkdir()
    for name in CALLS:
        real = shutil.which(name)
        if real is None:
            sys.exit(f"{name} not found: start SLURM with scripts/slurm-up.sh")
        script = bindir / name
        script.write_text(f'#!/bin/sh\necho {name} >> "{log}"\nexec "{real}" "$@"\n')
        script.chmod(0o755)
    return f"{bindir}:{os.environ['PATH']}"


def counted(log: Path) -> dict[str, int]:
    lines = log.read_text().split() if log.exists() else []
    return {name: lines.count(name) for name in CALLS if lines.count(name)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=256, help="cells (a multiple of 8)")
    args = ap.parse_args()
    from twoclocks_cli.config import load_plan
    from twoclocks_cli.launch import sweeps
    from twoclocks_cli.store import Store

    root = Path(tempfile.mkdtemp(prefix="tc-bench-"))
    log = root / "calls.log"
    os.environ["PATH"] = counting_path(root, log)
    cfg_path = root / "sweep.toml"
    cfg_path.write_text(CONFIG.format(n=args.cells, budget=1024, workdir=root / "runs",
                                      seeds=list(range(args.cells // 8))))
    url = f"sqlite:///{root / 'store.db'}"
    store = Store.open(url)

    t0 = time.perf_counter()
    plan = load_plan(cfg_path)
    t_plan = time.perf_counter() - t0
    ex = sweeps.choose_executor(plan.config, "slurm")
    reg = sweeps.register(store, plan, str(cfg_path))
    t_reg = time.perf_counter() - t0
    job_ids = sweeps.submit(store, reg, sweeps.to_submit(store, reg, False), ex, url)
    t_submit = time.perf_counter() - t0
    submit_calls = counted(log)
    log.unlink(missing_ok=True)

    t1 = time.perf_counter()
    ref = sweeps.refresh(store, plan.config.name)
    t_refresh = time.perf_counter() - t1
    refresh_calls = counted(log)
    log.unlink(missing_ok=True)

    # baselines: one sacct per job (a per-job watcher), one sbatch per cell (held, then removed)
    t2 = time.perf_counter()
    for jid in sorted(set(job_ids.values())):
        subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", jid],
                       capture_output=True, check=True)
    t_per_job = time.perf_counter() - t2
    t3 = time.perf_counter()
    held = []
    for _ in range(len(job_ids)):
        out = subprocess.run(
            ["sbatch", "--hold", "--parsable", "-o", "/dev/null", "--wrap", "true"],
            capture_output=True, text=True, check=True)
        held.append(out.stdout.strip().split(";")[0])
    t_single = time.perf_counter() - t3
    subprocess.run(["scancel", *held], capture_output=True)
    n_cancel, _ = sweeps.cancel(store, plan.config.name)
    store.close()

    n = len(job_ids)
    print(f"cells submitted: {n} (plan {t_plan * 1000:.0f} ms, plan+register {t_reg:.2f}s)")
    print(f"submission wall time (plan+register+submit): {t_submit:.2f}s")
    print(f"sbatch calls for the submission: {submit_calls.get('sbatch', 0)} (must be 1); "
          f"baseline one sbatch per cell: {n} calls in {t_single:.2f}s -> "
          f"{t_single / max(t_submit - t_reg, 1e-9):.1f}x the array submit's "
          f"{t_submit - t_reg:.2f}s")
    print(f"scheduler queries per status refresh: {sum(refresh_calls.values())} "
          f"{refresh_calls} (must be 1); refresh took {t_refresh:.3f}s; "
          f"baseline one sacct per job: {n} queries in {t_per_job:.2f}s -> "
          f"{t_per_job / max(t_refresh, 1e-9):.0f}x")
    print(f"reconciled in refresh: {len(ref.fixed)}; cancelled afterwards: {n_cancel}")
    ok = submit_calls.get("sbatch", 0) == 1 and sum(refresh_calls.values()) == 1
    shutil.rmtree(root, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
