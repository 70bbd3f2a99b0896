"""An in-memory copy of a training's state, to run from one point more than once.

The branch rule of the adaptive controller runs short branches at two batch sizes from the
same state and keeps one: each branch starts from a snapshot, and the kept one's end state is
a snapshot the run continues from. Everything a step reads is copied: weights, optimizer
moments and lr, step and sample counters, data position and every random stream. One process
only (the adaptive schedule refuses more). A snapshot holds a copy of the weights and of Adam's
two moments, three at a decision (its start and each branch's end); they live in host memory
whatever the model's device, so a decision costs the accelerator no memory beyond the run's own
(untested on a GPU here: no CUDA device on the machines this was built on).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from trainer import checkpoint


@dataclass
class Snapshot:
    """What `take` copied out of a run (`trainer.loop.Run`)."""

    model: dict
    optimizer: dict
    step: int
    samples: int
    data: dict
    rng: dict


def take(run) -> Snapshot:
    """Copy the run's state now (nothing of it shared with the live tensors)."""
    return Snapshot(_host(run.model.state_dict()), _host(run.opt.state_dict()),
                    run.step, run.samples, copy.deepcopy(run.source.state()),
                    copy.deepcopy(checkpoint.rng_state(run.data_rng)))


def _host(tree):
    """A deep copy of `tree` with every tensor copied to host memory (loading it back puts the
    values on the live tensors' devices: load_state_dict copies into the parameters, and the
    optimizer casts its state to each parameter's device)."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, dict):
        return {k: _host(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_host(v) for v in tree)
    return copy.deepcopy(tree)


def put(run, snap: Snapshot) -> None:
    """Make the run's state the snapshot's; the snapshot stays usable (the optimizer's
    load_state_dict keeps the tensors it is given, so it gets a copy)."""
    run.model.load_state_dict(snap.model)
    run.opt.load_state_dict(copy.deepcopy(snap.optimizer))
    run.step, run.samples = snap.step, snap.samples
    run.source.load_state(copy.deepcopy(snap.data))
    checkpoint.restore_rng(snap.rng, run.data_rng)
