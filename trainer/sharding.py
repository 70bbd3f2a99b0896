"""FSDP (torch's `fully_shard`, FSDP2) for the grpo trainer, selected by accelerate's own config.

`accelerate launch --use_fsdp --fsdp_version 2` (or an accelerate config file saying the same)
sets `ACCELERATE_USE_FSDP=true` and `FSDP_*` variables; `options_from_env` reads them. The
sharding itself is applied here, not by `Accelerator.prepare`: accelerate 1.15 selects FSDP only
on accelerators (on CPU processes it silently runs plain MULTI_CPU), and the trainer's update
forward (`trainer.scorer.Scorer`) runs the layer math itself, so each decoder layer's gather and
free must wrap twoclocks' per-layer block (`decoder_math.BLOCK`), which FSDP learns through
`register_fsdp_forward_method`. One code path on CPU (gloo, tested) and GPU (nccl, not run here).

Each decoder layer is one FSDP unit, so are the input embeddings and the LM head when they are
not tied, and the Scorer (the rest: final norm, a tied embedding/LM head) is the root:
a rank keeps 1/world of every parameter, gradient and AdamW moment; a layer's full weights
exist only while its block runs forward or backward. Gradients are reduce-scattered after every
micro-batch's backward (no local accumulation of full-size gradients) as a sum — the loss is
already divided by the global normaliser. The rollout engine reads a separate unsharded copy of
the weights, refreshed by an all-gather after every update (`copy_full_weights`); the frozen
reference policy of the KL terms is sharded like the model. Checkpoints hold full tensors, in
the same layout as a single process's (so a run resumes in any world size and either mode).
"""

from __future__ import annotations

import os
import types
from dataclasses import dataclass

import torch

from twoclocks_cli.core.errors import ConfigError


@dataclass(frozen=True)
class FsdpOptions:
    """The FSDP settings twoclocks honours from accelerate's config."""

    reshard_after_forward: bool = True  # free a layer's gathered weights after its forward
    # (gathered again for backward); False keeps them until backward: less communication,
    # more memory


def _flag(name: str, default: str) -> str:
    return os.environ.get(name, default).strip().lower()


def options_from_env() -> FsdpOptions | None:
    """FSDP options when accelerate's config selects FSDP (`ACCELERATE_USE_FSDP=true`), else
    None; settings twoclocks does not implement are refused in one line (ConfigError)."""
    if _flag("ACCELERATE_USE_FSDP", "false") != "true":
        return None
    version = _flag("FSDP_VERSION", "1")
    if version != "2":
        raise ConfigError(
            f"accelerate selects FSDP version {version} (FSDP_VERSION): the grpo trainer shards "
            "with FSDP2 only; launch with --fsdp_version 2"
        )
    for name, what in (("FSDP_OFFLOAD_PARAMS", "parameter offload"),
                       ("FSDP_ACTIVATION_CHECKPOINTING", "activation checkpointing")):
        if _flag(name, "false") == "true":
            raise ConfigError(f"accelerate selects FSDP {what} ({name}=true): not supported by "
                              "the grpo trainer yet; launch without it")
    reshard = _flag("FSDP_RESHARD_AFTER_FORWARD", "true")
    if reshard not in ("true", "false"):
        raise ConfigError(f"FSDP_RESHARD_AFTER_FORWARD = {reshard!r}: allowed are true, false")
    return FsdpOptions(reshard_after_forward=reshard == "true")


def is_dtensor(t) -> bool:
    """Whether `t` is a sharded (DTensor) tensor; False on a torch built without distributed."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a sharded tensor (the tensor itself otherwise)."""
    return t.to_local() if is_dtensor(t) else t


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor: an all-gather for a sharded one (every rank must call, in one order)."""
    return t.full_tensor() if is_dtensor(t) else t


def shard(model: torch.nn.Module, scorer: torch.nn.Module, device: str, world: int,
          options: FsdpOptions) -> None:
    """Shard `model`'s decoder layers (each its own unit, gathered around twoclocks' block) and
    `scorer` (the root, holding the rest) over all `world` ranks, in place; gradients sum."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method

    from trainer.decoder_math import BLOCK, layer_block
    from trainer.scorer import Scorer

    if not isinstance(scorer, Scorer):
        raise ConfigError(
            "FSDP runs with twoclocks' own forward (scorer = \"auto\" and a Qwen2/Llama model): "
            "the transformers forward's call count depends on the batch, which sharded ranks "
            "must agree on"
        )
    mesh = init_device_mesh(torch.device(device).type, (world,))
    reshard = options.reshard_after_forward
    for layer in model.model.layers:
        setattr(layer, BLOCK, types.MethodType(layer_block, layer))
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
        register_fsdp_forward_method(layer, BLOCK)
    embed, head = model.get_input_embeddings(), model.lm_head
    if head.weight is not embed.weight:  # untied: each its own unit (a tied pair stays in the
        # root, since one parameter cannot belong to two units)
        fully_shard(embed, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(head, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(scorer, mesh=mesh, reshard_after_forward=reshard)
    for module in scorer.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # a sum: each rank's loss is pre-normalised
            module.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no PREMUL_SUM)


def full_state(module: torch.nn.Module) -> dict:
    """`module.state_dict()` with every sharded tensor gathered (collective; CPU copies)."""
    return {k: full(v).detach().cpu() for k, v in module.state_dict().items()}


def load_full_state(module: torch.nn.Module, state: dict) -> None:
    """Copy full tensors `state` into `module`'s (possibly sharded) parameters and buffers."""
    from torch.distributed.tensor import distribute_tensor

    own = module.state_dict()
    missing = set(own) - set(state)
    if missing:
        raise ConfigError(f"checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[0]}")
    with torch.no_grad():
        for name, target in own.items():
            value = state[name]
            if is_dtensor(target):
                value = distribute_tensor(value.to(target.dtype), target.device_mesh,
                                          target.placements, src_data_rank=None).to_local()
            local(target).copy_(value)


def full_optimizer_state(opt: torch.optim.Optimizer) -> dict:
    """`opt.state_dict()` with every sharded moment gathered: the single-process layout."""
    sd = opt.state_dict()
    sd["state"] = {i: {k: full(v) if isinstance(v, torch.Tensor) else v for k, v in s.items()}
                   for i, s in sorted(sd["state"].items())}
    return sd


def load_optimizer_state(opt: torch.optim.Optimizer, state: dict) -> None:
    """Load a single-process-layout optimizer state, re-sharding each moment like its
    parameter (each rank keeps its slice; no communication)."""
    from torch.distributed.tensor import distribute_tensor

    opt.load_state_dict(state)
    for group in opt.param_groups:
        for p in group["params"]:
            if not is_dtensor(p):
                continue
            st = opt.state.get(p, {})
            for k, v in list(st.items()):
                if isinstance(v, torch.Tensor) and not is_dtensor(v) and v.shape == p.shape:
                    st[k] = distribute_tensor(v, p.device_mesh, p.placements, src_data_rank=None)


def copy_full_weights(src: torch.nn.Module, dst: torch.nn.Module) -> None:
    """Gather `src`'s sharded parameters one at a time into the unsharded copy `dst`."""
    targets = dict(dst.named_parameters())
    with torch.no_grad():
        for name, p in src.named_parameters():
            targets[name].copy_(full(p.detach()))
