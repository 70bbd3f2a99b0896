"""Driver of the DDP test: `train()` on the tiny model, alone or under `accelerate launch`.

Every world size trains on one global batch per step: the prompts already are (each rank keeps
its slice of one prompt stream); completions come from `GlobalBatch`, which samples the whole
batch from one seed on every rank and keeps this rank's rows. Rank 0 writes every step's
metrics, the final parameters' digest and the first step's rollout to the JSON file argv[1].
Usage: python ddp_driver.py OUT.json WORKDIR [--ppo-epochs N] [--budget SAMPLES --first-call K]
[--model DIR] — with a budget, a checkpoint in WORKDIR is resumed (extending the budget);
`--first-call` numbers the engine's first batch as the uninterrupted run numbered it (the step
it resumes after); `--model` trains another model directory than the built-in tiny one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

# run as a script (from accelerate launch): the repository root, for tests.support
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.support.training import Collect  # noqa: E402


class GlobalBatch:
    """A rollout engine that samples the global batch (every rank's prompts, in rank order) from
    a seed shared by all ranks and returns this rank's rows — one batch in any world size."""

    def __init__(self, inner, seed: int, first_call: int = 0):
        self.inner, self.seed, self.calls, self.rollouts = inner, seed, first_call, []

    def sync(self, model) -> None:
        self.inner.sync(model)

    def generate(self, prompts: list[str], temperature: float | None = None):
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        rank = torch.distributed.get_rank() if world > 1 else 0
        parts = [None] * world
        if world > 1:
            torch.distributed.all_gather_object(parts, prompts)
        else:
            parts = [prompts]
        everything = [p for part in parts for p in part]
        self.calls += 1
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed * 1000 + self.calls)
            roll = self.inner.generate(everything, temperature)
        self.rollouts.append(roll)
        n = len(prompts)
        return roll.select(torch.arange(rank * n, (rank + 1) * n))


def config(ppo_epochs: int, sample_budget: int = 96, model: str | None = None):
    """The tiny run both world sizes train: 3 steps of 8 prompts x 4 completions."""
    from trainer.config import TrainConfig

    return TrainConfig(
        **({"model": model} if model else {}),
        prompts_per_batch=8, group_size=4, micro_batch_size=8, lr=1e-3,
        sample_budget=sample_budget,
        seed=3, eval_every_samples=0, checkpoint_every_steps=0, threads=1,
        ppo_epochs=ppo_epochs, kl_init_every=1 if ppo_epochs > 1 else 0,
    )


def main(out: str, workdir: str, ppo_epochs: int = 1, budget: int | None = None,
         first_call: int = 0, model: str | None = None) -> None:
    from torch.distributed.fsdp import FSDPModule

    from trainer import sharding
    from trainer.dist import Dist, setup_dist
    from trainer.loop import train
    from trainer.rollout import make_engine
    from trainer.sharding import is_dtensor, local

    engines, prepared = [], {}
    prepare = Dist.prepare

    def keep(self, model, scorer, make_optimizer):  # remember the trained model
        prepared["model"], prepared["scorer"] = model, scorer
        return prepare(self, model, scorer, make_optimizer)

    Dist.prepare = keep
    shard, sharded = sharding.shard, []

    def count(model, *args):  # which models were sharded: the trained one, the reference
        sharded.append(model)
        return shard(model, *args)

    sharding.shard = count

    def make(cfg, model, tok, path):
        engines.append(GlobalBatch(make_engine(cfg, model, tok, path), cfg.seed, first_call))
        return engines[0]

    dist = setup_dist()
    sink = Collect()
    cfg = config(ppo_epochs, budget or 96, model)
    status = train(cfg, sink, Path(workdir), make_rollout=make, extend=budget is not None)
    if dist.rank != 0:
        return
    state = torch.load(sorted(Path(workdir).glob("checkpoints/step-*"))[-1] / "state.pt",
                       weights_only=False)
    params = torch.cat([v.float().reshape(-1) for v in state["model"].values()])
    first = engines[0].rollouts[0] if engines[0].rollouts else None
    trained = prepared["model"]
    Path(out).write_text(json.dumps({
        "status": status, "world": dist.world, "sharded": dist.sharded,
        # the share of the weights rank 0 holds, and whether the engine samples with whole ones
        "local_fraction": sum(local(p).numel() for p in trained.parameters())
        / sum(p.numel() for p in trained.parameters()),
        "engine_unsharded": not any(is_dtensor(p) for p in engines[0].inner.model.parameters()),
        "units": sum(isinstance(m, FSDPModule) for m in prepared["scorer"].modules()),
        "sharded_models": len(sharded),
        "rows": sink.rows,
        "param_sum": float(params.double().sum()),
        "param_sq": float(params.double().square().sum()),
        "first_rollout": None if first is None else
        {k: getattr(first, k).tolist() for k in ("input_ids", "attention_mask", "completion_mask")}
        | {"prompt_len": first.prompt_len, "texts": first.texts},
    }))


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("workdir")
    ap.add_argument("--ppo-epochs", type=int, default=1)
    ap.add_argument("--budget", type=int)
    ap.add_argument("--first-call", type=int, default=0)
    ap.add_argument("--model")
    a = ap.parse_args()
    main(a.out, a.workdir, a.ppo_epochs, a.budget, a.first_call, a.model)
