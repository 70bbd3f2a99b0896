"""Build sim sweeps in a store the way the launcher would: Sweep + Run rows, then run_cell."""

from __future__ import annotations

import math
from pathlib import Path

from twoclocks_cli.backends import run_cell
from twoclocks_cli.store import Run, RunStatus, Sweep

LR0, B0, G = 0.01, 32, 4  # lr at the reference batch (samples), group size


def make_sweep(
    store,
    name: str,
    prompts: list[int],
    seeds: int,
    budget: float,
    sim: dict,
    workdir: Path,
    clip=(0.2, 0.2),
    phases=None,
    run=True,
    seed0=0,
) -> list[int]:
    """Create one run per (prompts, seed) under sqrt scaling and execute each with its backend."""
    ids = []
    with store.session() as s:
        sweep = Sweep(name=name, backend="sim", config={"sim": sim})
        s.add(sweep)
        s.flush()
        for p in prompts:
            for seed in range(seed0, seed0 + seeds):
                b = p * G
                cell = {
                    "prompts_per_batch": p,
                    "group_size": G,
                    "lr": LR0 * math.sqrt(b / B0),
                    "clip_eps_low": clip[0],
                    "clip_eps_high": clip[1],
                    "seed": seed,
                    "sample_budget": budget,
                    "sim": sim,
                }
                if phases:
                    cell["phases"] = phases
                    cell["lr"] = phases[0]["lr"]
                r = Run(
                    sweep_id=sweep.id,
                    cell_id=f"p{p}-s{seed}",
                    name=f"{name}-p{p}-s{seed}",
                    backend="sim",
                    batch_prompts=p,
                    group_size=G,
                    batch_samples=b,
                    lr=cell["lr"],
                    clip_low=clip[0],
                    clip_high=clip[1],
                    seed=seed,
                    config=cell,
                )
                s.add(r)
                s.flush()
                ids.append(r.id)
    if run:
        for rid in ids:
            store.set_status(rid, RunStatus.running)
            status = run_cell(store, rid, Path(workdir) / str(rid))
            store.set_status(rid, status)
    return ids
