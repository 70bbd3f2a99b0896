"""The sampler's and the update's precision apart from the parameters': which dtype the
rollouts sample in (`rollout_dtype`), the persistent copy of the weights they sample with, the
truncated importance-sampling cap that corrects the update for the difference (`tis_cap`), and
the dtype the update computes in (`update_dtype`).

The parameters, their gradients and AdamW's state are in `dtype`. A rollout precision other
than it samples with a copy of the weights in that dtype, made once and refreshed in place after
every update (the loop's weight sync: a cast-copy into the same tensors, no new allocation); the
copy is derived from the trainer's weights, so a checkpoint holds none and a resume rebuilds it
exactly. An update precision other than it runs, in one process, every trainer forward and
backward on a copy of the weights in that dtype (`ComputeCopy`: one copy with the sampler's when
both are bf16), whose gradients are added into the `dtype` ones after each backward: float32
master weights and AdamW state, bf16 arithmetic throughout the forward and backward, no per-
forward weight cast. Under several processes (DDP/FSDP: their gradient sync hooks the master
parameters) it runs under `torch.autocast` over the `dtype` weights instead.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from twoclocks_cli.core.errors import ConfigError

# TRL's vllm_importance_sampling_cap and the truncated-IS cap of Yao et al.
# (https://fengyao.notion.site/off-policy-rl): the default when the sampler differs
DEFAULT_TIS_CAP = 2.0
# x86 flags of native bf16 arithmetic (AMX tiles, AVX512 dot products); without them oneDNN
# emulates bf16 on AVX512 and bf16 matmuls run slower than fp32 ones
BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_flags(path: str | Path = "/proc/cpuinfo") -> set[str]:
    """The CPU feature flags of Linux's `path` (empty where it cannot be read: not Linux)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return set()
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags.update(value.split())
    return flags


def bf16_native(device, cpuinfo: str | Path = "/proc/cpuinfo") -> str | None:
    """Why `device` computes bf16 natively ('this CPU has amx_bf16', ...), None where it does
    not (then bf16 is emulated, or absent, and no faster than float32)."""
    kind = torch.device(device).type
    if kind == "cuda":
        return "torch.cuda.is_bf16_supported()" if torch.cuda.is_bf16_supported() else None
    if kind == "cpu":
        found = [f for f in BF16_FLAGS if f in cpu_flags(cpuinfo)]
        return f"this CPU has {' and '.join(found)}" if found else None
    return None


@dataclass(frozen=True)
class Precision:
    """What a training samples and trains in, and the TIS cap it runs with; `why` and
    `tis_why` say how each was chosen (for the run's event)."""

    train: str
    sample: str
    engine: str
    tis_cap: float | None
    why: str
    tis_why: str
    compute: str = ""  # the dtype the update's forwards compute in (`train`: no autocast)
    compute_why: str = ""  # empty where update_dtype was left unset
    on_copy: bool = True  # a compute dtype apart from `train` runs on a copy, else autocast

    @property
    def mixed(self) -> bool:
        """Whether the update computes in a dtype apart from the parameters'."""
        return self.compute not in ("", self.train)

    @property
    def differs(self) -> bool:
        """Whether the sampler is not the trainer's own forward (another precision or engine).
        An update under autocast is never the sampler's forward: no engine samples under it."""
        return self.sample != self.train or self.engine != "hf" or self.mixed

    @property
    def computes_on_copy(self) -> bool:
        """Whether the update computes on a `ComputeCopy`: it is `mixed` and one process trains
        (`on_copy`)."""
        return self.on_copy and self.mixed


def resolve(cfg, device, cpuinfo: str | Path = "/proc/cpuinfo", *,
            alone: bool = True) -> Precision:
    """The rollout precision and TIS cap `cfg` asks for on `device`: rollout_dtype unset
    samples in `dtype`; auto in bfloat16 where `device` has it natively, else in `dtype`;
    tis_cap unset is DEFAULT_TIS_CAP when the sampler differs from the trainer, else off.
    `alone`: one process trains (the update may then compute on a copy, else autocast)."""
    train, asked = cfg.dtype, cfg.rollout_dtype
    if asked is None:
        sample, why = train, "rollout_dtype unset: the parameter dtype"
    elif asked == "auto":
        native = bf16_native(device, cpuinfo)
        sample = "bfloat16" if native else train
        why = (f"rollout_dtype = 'auto': {native}" if native else
               f"rollout_dtype = 'auto': no native bf16 on {torch.device(device).type}")
    else:
        sample, why = asked, f"rollout_dtype = {asked!r}"
    prec = Precision(train, sample, cfg.rollout_engine, None, why, "",
                     *_compute(cfg, device, cpuinfo), on_copy=alone)
    if cfg.tis_cap == "off":
        return _with_cap(prec, None, "tis_cap = 'off'")
    if cfg.tis_cap is not None:
        return _with_cap(prec, float(cfg.tis_cap), f"tis_cap = {cfg.tis_cap}")
    if prec.differs:
        return _with_cap(prec, DEFAULT_TIS_CAP, "tis_cap unset, the sampler differs from the "
                         "trainer: the default cap")
    return _with_cap(prec, None, "tis_cap unset, the sampler is the trainer: off")


def _with_cap(prec: Precision, cap: float | None, why: str) -> Precision:
    return replace(prec, tis_cap=cap, tis_why=why)


def _compute(cfg, device, cpuinfo) -> tuple[str, str]:
    """(the dtype the update computes in, why): unset is `dtype`; auto is bfloat16 where
    `device` has it natively, else `dtype`. The config allows update_dtype only over float32
    weights; a CUDA device without bfloat16 is refused here."""
    train, asked = cfg.dtype, getattr(cfg, "update_dtype", None)
    kind = torch.device(device).type
    if asked is None:  # no word in the event: the update as before the option existed
        return train, ""
    if asked == "auto":
        native = bf16_native(device, cpuinfo)
        if native is None:
            return train, f"update_dtype = 'auto': no native bf16 on {kind}"
        return "bfloat16", f"update_dtype = 'auto': {native}"
    why = f"update_dtype = {asked!r}"
    if asked == train:
        return train, why
    if kind == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"key 'update_dtype' = {asked!r}: this CUDA device has no bfloat16 "
                          "(torch.cuda.is_bf16_supported() is False); leave update_dtype unset")
    if kind == "cpu" and bf16_native(device, cpuinfo) is None:
        why += " (emulated on this CPU, no faster than float32)"
    return asked, why


def settle(cfg, prec: Precision):
    """`cfg` with what `prec` resolved put in (rollout_dtype and update_dtype dtypes, tis_cap
    a number or None), for the training that runs it; the config as written stays the run's
    record."""
    return cfg.model_copy(update={"rollout_dtype": prec.sample, "tis_cap": prec.tis_cap,
                                  "update_dtype": prec.compute or prec.train})


def describe(prec: Precision) -> str:
    """One line for the run's events: what samples and what trains, and the TIS cap."""
    engine = "" if prec.engine == "hf" else f" ({prec.engine} engine)"
    cap = "off" if prec.tis_cap is None else f"{prec.tis_cap:g}"
    if not prec.mixed:
        update = f"the update runs in {prec.train}"
        update += f" ({prec.compute_why})" if prec.compute_why else ""
    elif prec.on_copy:
        update = (f"the update computes in {prec.compute} on a {prec.compute} copy of the "
                  f"{prec.train} weights ({prec.compute_why})")
    else:
        update = (f"the update computes in {prec.compute} under autocast over {prec.train} "
                  f"weights ({prec.compute_why})")
    return (f"rollouts sample in {prec.sample}{engine} ({prec.why}), {update}; "
            f"tis_cap {cap} ({prec.tis_why})")


def announce(run, prec: Precision, cfg) -> None:
    """Record as an event of `run` the precisions and the cap it runs with (`describe`), when
    the sampler or the update's compute differs from the parameters or the config (`cfg` as
    written) named a rollout or update precision: what auto chose stays with the run's record."""
    named = cfg.rollout_dtype is not None or getattr(cfg, "update_dtype", None) is not None
    if (prec.differs or prec.mixed or named) and run.writes:
        run.sink.event(describe(prec))


def autocast(cfg, model):
    """The context a trainer forward through `model` runs in: `torch.autocast` to the settled
    `update_dtype` where it differs from `dtype` and `model`'s weights are not already in it
    (a `ComputeCopy`'s are), else nothing (the forward as before the option existed, bit for
    bit). Backward runs outside it, as torch advises."""
    compute = getattr(cfg, "update_dtype", None)
    if compute is None or compute == cfg.dtype:
        return contextlib.nullcontext()
    weight = next(model.parameters())
    if weight.dtype == getattr(torch, compute):
        return contextlib.nullcontext()
    return torch.autocast(weight.device.type, dtype=getattr(torch, compute))


class ComputeCopy:
    """The update's forward and backward on a copy of the weights in the compute dtype: the
    gradients its backward leaves are added into the master parameters' (`fold`, in their
    dtype, so micro-batches accumulate in float32), and the copy is re-cast from the master
    weights whenever they change (`refresh`). `net` is the forward over the copy."""

    def __init__(self, master: torch.nn.Module, copy_: torch.nn.Module, net: torch.nn.Module):
        self.model, self.net = copy_, net
        self.pairs = [(p, q) for p, q in zip(master.parameters(), copy_.parameters(),
                                             strict=True) if p.requires_grad]
        for _, q in self.pairs:
            q.requires_grad_(True)

    def fold(self) -> None:
        """Add the copy's gradients into the master ones and clear them from the copy."""
        with torch.no_grad():
            for p, q in self.pairs:
                if q.grad is None:
                    continue
                if p.grad is None:
                    p.grad = q.grad.to(p.dtype)
                else:
                    p.grad.add_(q.grad)
                q.grad = None

    def refresh(self) -> None:
        """Cast the master weights into the copy, in place."""
        with torch.no_grad():
            torch._foreach_copy_([q for _, q in self.pairs], [p for p, _ in self.pairs])


def compute_copy(model: torch.nn.Module, sampler: torch.nn.Module, compute: str,
                 make_net) -> ComputeCopy:
    """The `ComputeCopy` of `model` in `compute`: the sampler's copy when it is one in that
    dtype already (one copy serves both), else a new one; `make_net(copy)` is its forward."""
    dtype = getattr(torch, compute)
    shared = sampler is not model and next(sampler.parameters()).dtype == dtype
    copy_ = sampler if shared else cast_copy(model, dtype)
    return ComputeCopy(model, copy_, make_net(copy_))


def cast_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A copy of `model` with its parameters in `dtype`, without gradients. Buffers (RoPE's
    frequencies) stay as loaded, as a model loaded in `dtype` keeps them."""
    twin = copy.deepcopy(model).requires_grad_(False).train()
    for p in twin.parameters():
        p.data = p.data.to(dtype)
    return twin


def sampling_model(model: torch.nn.Module, sample: str, separate: bool) -> torch.nn.Module:
    """What the rollout engine samples with: `model` itself when it is already in `sample`
    and no separate copy is needed (`separate`: FSDP shards `model`), else an unsharded copy
    in `sample` without gradients, which the loop refreshes after every update."""
    dtype = getattr(torch, sample)
    if not separate and next(model.parameters()).dtype == dtype:
        return model
    return cast_copy(model, dtype)
