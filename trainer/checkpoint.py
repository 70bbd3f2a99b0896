"""Checkpoints for exact resume: model, optimizer, every RNG, data position and counters.

Layout: `workdir/checkpoints/step-NNNNNNNN/` holds `state.pt` (rank 0: model, optimizer,
counters), `rng-R.pt` per rank (torch, numpy data Generator, python `random`) and `owner.json`
(the owner's record: the config and its hash, and the store without password and the run id
when there is one; `trainer.ownership`); a `COMPLETE` marker written last makes it valid.
Resuming a checkpoint of another run, or with a changed config (except a larger sample_budget
under `--extend`), is refused in one line by the owner (`trainer.ports.Owner.refusal`). Files
are written to a temporary name and renamed, so a kill -9 at any moment leaves either the old or
the new checkpoint, never a torn one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from trainer.ownership import OWNER

MARKER = "COMPLETE"


def _atomic_save(obj, path: Path) -> None:
    """torch.save to a temporary file in the same directory, fsync, then rename over `path`."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def rng_state(data_rng: np.random.Generator) -> dict:
    """Every random stream a step consumes."""
    state = {
        "torch": torch.get_rng_state(),
        "numpy_data": data_rng.bit_generator.state,
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict, data_rng: np.random.Generator) -> None:
    """Put back what `rng_state` captured."""
    torch.set_rng_state(state["torch"])
    data_rng.bit_generator.state = state["numpy_data"]
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def step_dir(workdir: Path, step: int) -> Path:
    return Path(workdir) / "checkpoints" / f"step-{step:08d}"


def save(workdir: Path, step: int, rank: int, main_state: dict | None, rng: dict, barrier,
         owner: dict | None = None) -> None:
    """Write step `step`'s checkpoint (rank 0 passes `main_state` and the `owner` record);
    every rank calls this."""
    d = step_dir(workdir, step)
    d.mkdir(parents=True, exist_ok=True)
    _atomic_save(rng, d / f"rng-{rank}.pt")
    if main_state is not None:
        _atomic_save(main_state, d / "state.pt")
    if owner is not None:
        tmp = d / f"{OWNER}.tmp{os.getpid()}"
        tmp.write_text(json.dumps(owner, sort_keys=True))
        os.replace(tmp, d / OWNER)
    barrier()
    if rank == 0:
        marker = d / MARKER
        marker.with_suffix(".tmp").write_text(str(step))
        os.replace(marker.with_suffix(".tmp"), marker)
        for old in (d.parent).glob("step-*"):
            if old != d:
                shutil.rmtree(old, ignore_errors=True)
    barrier()


def latest(workdir: Path) -> Path | None:
    """The newest complete checkpoint directory under `workdir`, if any."""
    root = Path(workdir) / "checkpoints"
    if not root.is_dir():
        return None
    done = sorted(p for p in root.glob("step-*") if (p / MARKER).is_file())
    return done[-1] if done else None


def load(path: Path, rank: int) -> tuple[dict, dict]:
    """(main state, this rank's RNG state) of checkpoint directory `path`."""
    main = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    rng = torch.load(path / f"rng-{rank}.pt", map_location="cpu", weights_only=False)
    return main, rng
