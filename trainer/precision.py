"""The sampler's precision apart from the trainer's: which dtype the rollouts sample in
(`rollout_dtype`), the persistent copy of the weights they sample with, and the truncated
importance-sampling cap that corrects the update for the difference (`tis_cap`).

The update always runs in `dtype`. A rollout precision other than it samples with a copy of the
weights in that dtype, made once and refreshed in place after every update (the loop's weight
sync: a cast-copy into the same tensors, no new allocation); the copy is derived from the
trainer's weights, so a checkpoint holds none and a resume rebuilds it exactly.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from pathlib import Path

import torch

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

    @property
    def differs(self) -> bool:
        """Whether the sampler is not the trainer's own forward (another precision or engine)."""
        return self.sample != self.train or self.engine != "hf"


def resolve(cfg, device, cpuinfo: str | Path = "/proc/cpuinfo") -> Precision:
    """The rollout precision and TIS cap `cfg` asks for on `device`: rollout_dtype unset
    samples in `dtype`; auto in bfloat16 where `device` has it natively, else in `dtype`;
    tis_cap unset is DEFAULT_TIS_CAP when the sampler differs from the trainer, else off."""
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
    prec = Precision(train, sample, cfg.rollout_engine, None, why, "")
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


def settle(cfg, prec: Precision):
    """`cfg` with what `prec` resolved put in (rollout_dtype a dtype, tis_cap a number or None),
    for the training that runs it; the config as written stays the run's record."""
    return cfg.model_copy(update={"rollout_dtype": prec.sample, "tis_cap": prec.tis_cap})


def describe(prec: Precision) -> str:
    """One line for the run's events: what samples and what trains, and the TIS cap."""
    engine = "" if prec.engine == "hf" else f" ({prec.engine} engine)"
    cap = "off" if prec.tis_cap is None else f"{prec.tis_cap:g}"
    return (f"rollouts sample in {prec.sample}{engine} ({prec.why}), the update runs in "
            f"{prec.train}; tis_cap {cap} ({prec.tis_why})")


def announce(run, prec: Precision, cfg) -> None:
    """Record as an event of `run` the precisions and the cap it runs with (`describe`), when
    the sampler differs from the trainer or the config (`cfg` as written) named a rollout
    precision: what auto chose stays with the run's record."""
    if (prec.differs or cfg.rollout_dtype is not None) and run.writes:
        run.sink.event(describe(prec))


def sampling_model(model: torch.nn.Module, sample: str, separate: bool) -> torch.nn.Module:
    """What the rollout engine samples with: `model` itself when it is already in `sample`
    and no separate copy is needed (`separate`: FSDP shards `model`), else an unsharded copy
    in `sample` without gradients, which the loop refreshes after every update."""
    dtype = getattr(torch, sample)
    if not separate and next(model.parameters()).dtype == dtype:
        return model
    twin = copy.deepcopy(model).requires_grad_(False).train()
    for p in twin.parameters():  # buffers (RoPE's frequencies) stay as loaded, as a model
        p.data = p.data.to(dtype)  # loaded in `sample` keeps them
    return twin
