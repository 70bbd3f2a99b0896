"""This process's place in a data-parallel job, and the gradient sync through accelerate.

Alone (no `WORLD_SIZE` > 1) nothing is wrapped: the model trains as it is. Under `accelerate
launch` / `torchrun` an `Accelerator` prepares model and optimizer: DDP (gloo on CPUs, nccl on
GPUs) all-reduces gradients in buckets while backward runs, the gradients being views into those
buckets (no extra copy); micro-batches before the last one of a minibatch run under `no_sync`,
so only the last backward communicates. A comm hook makes the all-reduce a sum (DDP averages
by default): each rank's loss is already divided by the minibatch's global normaliser, so the
summed gradient is the gradient of the whole minibatch. An accelerate config selecting FSDP
(version 2) shards instead (`trainer.sharding`: every forward and backward communicates, so
every rank runs the same passes); DeepSpeed is refused (not supported yet).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

from trainer import sharding
from twoclocks_cli.core.errors import ConfigError


def _sum_hook(_state, bucket):
    """DDP comm hook: all-reduce one gradient bucket as a sum (the default divides by world)."""
    fut = torch.distributed.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


@dataclass
class Dist:
    """Rank, world size and device of this process (rank 0 of 1 when run alone)."""

    rank: int = 0
    world: int = 1
    device: str = "cuda" if torch.cuda.is_available() else "cpu"
    accelerator: object | None = None  # accelerate.Accelerator when world > 1
    fsdp: sharding.FsdpOptions | None = None  # set when accelerate's config selects FSDP

    @property
    def sharded(self) -> bool:
        """Whether parameters are sharded (FSDP): every forward and backward is collective."""
        return self.fsdp is not None

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over ranks (float64, so pooled counts stay exact)."""
        if self.world == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64)
        torch.distributed.all_reduce(t)
        return t.tolist()

    def max(self, value: float) -> float:
        """Maximum over ranks."""
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return float(t)

    def barrier(self) -> None:
        """Wait for every rank."""
        if self.world > 1:
            torch.distributed.barrier()

    def prepare(self, model, scorer, make_optimizer):
        """(training module, optimizer) for `scorer` (the update's forward over `model`'s
        weights): sharded in place under FSDP, accelerate's DDP wrapper with a summing
        all-reduce when several processes run, else the scorer itself. The optimizer is built
        by `make_optimizer()` after sharding (it must hold the sharded parameters)."""
        if self.fsdp is not None:
            sharding.shard(model, scorer, self.device, self.world, self.fsdp)
            return scorer, make_optimizer()
        if self.accelerator is None:
            return scorer, make_optimizer()
        net, opt = self.accelerator.prepare(scorer, make_optimizer())
        if isinstance(net, torch.nn.parallel.DistributedDataParallel):
            net.register_comm_hook(None, _sum_hook)
        return net, opt

    def sum_shards(self, value: float) -> float:
        """A sum over this rank's shards completed over every rank (FSDP); unchanged when each
        rank holds whole tensors."""
        return self.sum([value])[0] if self.sharded else value

    def no_sync(self, net):
        """Context in which backward accumulates locally without communicating (DDP; FSDP
        reduce-scatters after every backward, so no full-size gradient piles up locally)."""
        if isinstance(net, torch.nn.parallel.DistributedDataParallel):
            return net.no_sync()
        return contextlib.nullcontext()

    def zero_grad(self, net, opt) -> None:
        """Clear gradients: freed alone, zeroed in place under DDP (set to None they would be
        re-allocated apart from the buckets by the next no_sync backward)."""
        opt.zero_grad(set_to_none=self.sharded or not self.synced(net))

    def synced(self, net) -> bool:
        """Whether backward through `net` communicates (so every rank must run one)."""
        return self.sharded or isinstance(net, torch.nn.parallel.DistributedDataParallel)


def setup_dist() -> Dist:
    """Join the process group when launched with several processes (`accelerate launch`)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return Dist()
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, DistributedType

    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        raise ConfigError(
            "accelerate selects DeepSpeed (ACCELERATE_USE_DEEPSPEED=true): the grpo trainer runs "
            "DDP or FSDP (DeepSpeed is not supported yet); launch without --use_deepspeed"
        )
    fsdp = sharding.options_from_env()
    # gloo on CPUs needs cpu=True (else accelerate silently runs each process alone); the
    # trainer's dtype is its own, so accelerate's mixed precision stays off
    # gradients are views into DDP's buckets: no second full copy of them. No buffer broadcast
    # before each forward: the model's buffers (RoPE frequencies) are constants, and a forward
    # that communicates would have to run the same number of times on every rank — it does not
    # (a micro-batch's shared-prompt forward is two calls, an idle rank's is one; that
    # mismatch deadlocked 2 processes once the rollouts changed)
    views = DistributedDataParallelKwargs(gradient_as_bucket_view=True, broadcast_buffers=False)
    acc = Accelerator(cpu=not torch.cuda.is_available(), mixed_precision="no",
                      kwargs_handlers=[] if fsdp else [views])
    allowed = [DistributedType.MULTI_CPU, DistributedType.MULTI_GPU]
    if fsdp is not None:
        allowed.append(DistributedType.FSDP)  # on GPUs accelerate records it; we shard
    if acc.distributed_type not in allowed:
        raise ConfigError(
            f"accelerate distributed_type {acc.distributed_type.value}: the grpo trainer runs "
            "DDP (MULTI_CPU or MULTI_GPU) or FSDP version 2; DeepSpeed is not supported yet"
        )
    return Dist(acc.process_index, acc.num_processes, str(acc.device), acc, fsdp)
