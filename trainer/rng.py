"""Keeping the trainer's random streams where they were: around code that reseeds the global
generators (vLLM's worker start-up), and around evaluation's own seeded stream.

`torch.random.fork_rng(devices=[])` restores only the CPU generator, while `torch.manual_seed`
also reseeds every CUDA device: after an evaluation on a GPU the training sampler's CUDA stream
would restart from the evaluation seed. `private_torch_rng` forks this process's CUDA device as
well (its current one, which accelerate sets to the local rank's: forking every visible device
would open a context on each GPU of the node from every rank). The CUDA half has not run in
this project's CI (no GPU); on a CPU machine the device list is empty and only the CPU
generator is forked and restored.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch


def cuda_devices() -> list[int]:
    """The CUDA device this process computes on, as a list ([] without CUDA)."""
    return [torch.cuda.current_device()] if torch.cuda.is_available() else []


@contextmanager
def private_torch_rng(seed: int) -> Iterator[None]:
    """torch's CPU and this process's CUDA generator seeded with `seed` inside, restored on
    exit (use instead of `fork_rng(devices=[])` + `manual_seed`)."""
    with torch.random.fork_rng(devices=cuda_devices()):
        torch.manual_seed(seed)
        yield


@contextmanager
def preserved_rng() -> Iterator[None]:
    """Python's `random`, numpy's global, torch's CPU and this process's CUDA generator restored
    on exit, whatever the body reseeds (vLLM's worker seeds all four with its own seed)."""
    py, npy, cpu = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    devices = cuda_devices()
    cuda = [torch.cuda.get_rng_state(d) for d in devices]
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.random.set_rng_state(cpu)
        for d, state in zip(devices, cuda, strict=True):
            torch.cuda.set_rng_state(state, d)
