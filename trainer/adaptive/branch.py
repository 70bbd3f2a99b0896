"""A branch: a training that starts from another training's checkpoint (`twoclocks probe`).

The branch's own config says how it continues (its batch, lr, budget, eval spacing); the
checkpoint gives where it starts: weights, Adam's moments and step count, counters (step and
samples continue the parent's, so its metrics sit on the parent's axes), data position and
every random stream. Replicate 0 keeps the parent's streams, so a branch at the parent's own
batch and lr is the parent's continuation, step for step; replicate r > 0 reseeds the sampling
and data streams from (seed, r), the same for every batch size of a probe.

Adam's moments are carried as they are. Its first moment is a gradient average whatever the
batch; its second holds E[g^2] = G^2 + sigma^2/B at the parent's batch B and relaxes to the
branch's own value over ~1/(1 - beta2) steps (1,000 at 0.999), longer than a branch: a branch
at B' > B steps with the parent's preconditioner, lr(B') scaling it. betas and eps are the
branch config's (they differ from the parent's only when the sweep scales Adam with the batch).

A branch resumed from its own workdir (a checkpoint there) resumes as any training does.
No torch at import: the backend builds a Branch from a cell's table before training.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from twoclocks_cli.core.errors import ConfigError

KEYS = ("from_workdir", "replicate")


@dataclass(frozen=True)
class Branch:
    """Where a branch starts: the newest checkpoint in `from_workdir` (None: the initial
    weights, a branch at 0 samples), and which replicate of the random streams it runs."""

    from_workdir: Path | None
    replicate: int = 0

    @classmethod
    def from_dict(cls, data, source: str) -> Branch:
        """A cell's `branch` table; anything else is one ConfigError line."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: key 'branch' must be a table ({{from_workdir, "
                              "replicate}})")
        unknown = sorted(set(data) - set(KEYS))
        if unknown:
            raise ConfigError(f"{source}: unknown key 'branch.{unknown[0]}' (allowed: "
                              f"{', '.join(KEYS)})")
        rep, where = data.get("replicate", 0), data.get("from_workdir")
        if isinstance(rep, bool) or not isinstance(rep, int) or rep < 0:
            raise ConfigError(f"{source}: key 'branch.replicate' = {rep!r}: an integer >= 0")
        if where is not None and not isinstance(where, str):
            raise ConfigError(f"{source}: key 'branch.from_workdir' = {where!r}: a folder path")
        return cls(None if where is None else Path(where), rep)

    def to_dict(self) -> dict:
        return {"from_workdir": None if self.from_workdir is None else str(self.from_workdir),
                "replicate": self.replicate}

    def checkpoint(self) -> Path | None:
        """The checkpoint to start from (None at 0 samples); a folder without a complete one
        is one ConfigError line."""
        if self.from_workdir is None:
            return None
        from trainer import checkpoint

        ckpt = checkpoint.latest(self.from_workdir)
        if ckpt is None:
            raise ConfigError(f"branch: no complete checkpoint in {self.from_workdir} to start "
                              "from")
        return ckpt


def stream_seeds(seed: int, replicate: int) -> tuple[int, list[int]]:
    """(torch seed, numpy data seed) of replicate `replicate` > 0: distinct from the run's own
    streams (torch seed*7919 + rank, numpy [seed, 0]) and the same for every batch size."""
    import numpy as np

    torch_seed = int(np.random.default_rng([seed, 1, replicate]).integers(2**62))
    return torch_seed, [seed, 2, replicate]
