"""The options of the in-run batch controller (`batch_schedule = "adaptive"`): the `[adaptive]`
table of a training config or a sim cell.

They are training options, so they live with the trainer's config; the controller that reads
them, and what each one does, is `twoclocks_cli.adaptive.controller`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.core.limits import INT32_MAX
from twoclocks_cli.core.numbers import short


class AdaptiveConfig(BaseModel):
    """The `[adaptive]` table of a run with `batch_schedule = "adaptive"`."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    rule: Literal["noise", "branch", "guard"] = Field(
        "noise", description="How the progress phase picks the batch. noise: overhead x kappa x "
        "B_noise from the logged gradient-noise terms (free, but on real training B_noise sat "
        "20x below the batch where progress per sample slows). branch: at each decision, short "
        "branches at the current batch B and at 2B from the same state measure the progress and "
        "the drift per sample of each; the run continues from the chosen branch and the other "
        "branch's samples are charged to its clock. Both the sim backend and the grpo trainer "
        "branch (the grpo trainer in one process, holding three copies of the training state "
        "at a decision). guard: the batch stays where it starts and only the failure guard "
        "moves it (to batch_max); with start = \"b_crit\" that is the sweep's small-batch-first "
        "schedule with the switch decided in-run from the drift.")
    adapt_every: int = Field(2048, gt=0, le=2**62, description="Samples between two decisions.")
    branch_samples: int = Field(
        128, gt=0, le=INT32_MAX, description="rule branch: samples each branch spends (rounded up "
        "to whole steps of 2B). Every one is charged: the longer, the surer the comparison and "
        "the costlier.")
    max_backoff: int = Field(
        3, ge=0, le=30, description="rule branch: after k decisions in a row that kept the "
        "batch the next comes adapt_every x 2^min(k, max_backoff) samples later (the failure "
        "guard is checked at decisions too). Branches cost samples; the batch a run needs "
        "changes slowly.")
    grow_ratio: float = Field(
        0.9, gt=0, le=2, description="rule branch: grow to 2B when its progress per sample is at "
        "least this share of B's. Under E(B) = E_min (1 + B/B_crit) the share at B is "
        "(1 + B/B_crit)/(1 + 2B/B_crit): 0.9 grows while B is below ~B_crit/8.")
    kappa: float | None = Field(
        None, gt=0, description="Batch = kappa x B_noise. None: 1, or from_sweep's calibration.")
    from_sweep: str | None = Field(
        None, min_length=1, description="An analysed sweep that calibrates kappa (its recommended "
        "B_crit / its median noise scale) and drift_threshold (the lowest drift at which its runs "
        "failed) where they are not given.")
    overhead: float = Field(
        1.0, gt=0, description="Extra samples accepted over the small-batch limit: the batch is "
        "overhead x kappa x B_noise. With E(B) = E_min (1 + B/B_crit) (McCandlish) a batch of "
        "overhead x B_crit spends (1 + overhead) E_min samples: 1 is B_crit itself (twice the "
        "samples, half the steps of the small-batch limit), 0.1 stays within 10% of E_min.")
    noise: Literal["euclidean", "sign"] = Field(
        "euclidean", description="Noise scale: euclidean (B_simple) or sign (B_sign).")
    noise_ema: float = Field(
        0.01, gt=0, le=1, description="EMA weight of the newest step in the noise terms (as "
        "analyze's --noise-ema; one step's terms are noisy, so ~100 steps by default).")
    batch_min: int = Field(1, gt=0, le=INT32_MAX, description="Smallest batch, in prompts.")
    batch_max: int = Field(..., gt=0, le=INT32_MAX, description="Largest batch, in prompts "
                           "(also the failure guard's batch).")
    start_prompts: int | None = Field(
        None, gt=0, description="Batch of the first steps, in prompts (None: by `start`).")
    start: Literal["batch_min", "best", "b_crit"] = Field(
        "batch_min", description="Where the first steps run when start_prompts is not given: "
        "batch_min, or the largest batch_min x 2^k (up to batch_max) at or below a batch of "
        "from_sweep's (batch_min when it has none). best: its batch with the fewest samples to "
        "the target (median over seeds); b_crit: its recommended B_crit, which costs up to 2x "
        "the fewest samples by definition (1.4-1.9x on the theory model's settings).")
    grow_lr: Literal["scaled", "hold"] = Field(
        "scaled", description="The lr of a batch above the starting one. scaled: the scaling "
        "rule's; hold: the starting batch's (below it the rule's still applies). On the tiny "
        "task a policy already trained at 512 samples fell from 0.48 to 0.23 held-out accuracy "
        "in one step at 4x the batch and its sqrt lr, and kept improving at the held lr.")
    max_change: float = Field(2.0, gt=1, description="Most the batch may grow or shrink by per "
                              "decision (a factor).")
    drift_key: Literal["drift_rel", "drift_abs", "kl_init"] = Field(
        "drift_rel", description="The guard's drift measure (a step metric of the run).")
    drift_threshold: float | None = Field(
        None, gt=0, description="Drift at which runs fail. None: from_sweep's, else no guard.")
    lookahead: int = Field(8192, gt=0, description="Samples over which the guard projects the "
                           "drift at its current rate.")
    safety: float = Field(0.8, gt=0, le=1, description="The guard fires at safety x threshold.")
    collapse_key: Literal["eval_accuracy", "reward_mean", "accuracy", "none"] = Field(
        "eval_accuracy", description="The progress metric the guard watches for a collapse "
        "(\"none\": drift only). Each step whose signals carry it is one evaluation of the live "
        "drop rule (twoclocks_cli.clocks.collapse.LiveFalls: analyze's drop rule with its "
        "defaults, on a trailing mean of 5 evaluations); a declared collapse sends the batch to "
        "batch_max as the drift guard does.")
    collapse_patience: int = Field(
        3, ge=0, le=INT32_MAX, description="Evaluations a fall must stay below its recovery "
        "level after the drop rule fires before the guard acts: a dip back within them never "
        "moves the batch; each one delays acting on a collapse by one evaluation.")
    guard_warmup: int = Field(
        1, ge=0, le=INT32_MAX, description="Decisions at which the guard does not fire (1: the "
        "first). Their drift is mostly the descent of the directions that matter away from the "
        "initial point, fast and saturating, not the noise-driven random walk the projection "
        "assumes: projected, it crossed the threshold at the first decision on the theory model.")
    scaling: Literal["sqrt", "linear", "constant"] = Field(
        "sqrt", description="lr rule from the reference: lr_ref (B/B_ref)^(1/2, 1, 0).")
    reference_prompts: int | None = Field(
        None, gt=0, description="Reference batch in prompts (None: the run's prompts_per_batch).")
    reference_lr: float | None = Field(
        None, gt=0, description="lr at the reference batch (None: the run's lr).")

    @model_validator(mode="after")
    def _bounds(self):
        if self.batch_min > self.batch_max:
            raise ValueError(f"batch_min ({self.batch_min}) > batch_max ({self.batch_max})")
        if self.start_prompts is not None and not (
                self.batch_min <= self.start_prompts <= self.batch_max):
            raise ValueError(f"start_prompts ({self.start_prompts}) must lie in [batch_min, "
                             f"batch_max] = [{self.batch_min}, {self.batch_max}]")
        if self.start != "batch_min" and self.from_sweep is None:
            raise ValueError(f"start = \"{self.start}\" needs from_sweep (the analysed sweep "
                             "whose batch it starts at)")
        return self

    @classmethod
    def from_dict(cls, data, where: str = "adaptive") -> AdaptiveConfig:
        """Validate a config table; a bad key or value is one ConfigError naming it."""
        if not isinstance(data, dict):
            raise ConfigError(f"{where} = {short(data)}: must be a table (batch_schedule = "
                              "\"adaptive\" needs [adaptive] with at least batch_max)")
        try:
            return cls(**data)
        except ValidationError as err:
            e = err.errors()[0]
            loc = ".".join(str(x) for x in e["loc"])
            key = f"{where}.{loc}" if loc else where
            value = data.get(e["loc"][0]) if e["loc"] else None
            shown = f" = {short(value)}" if e["loc"] and e["loc"][0] in data else ""
            allowed = ", ".join(cls.model_fields)
            hint = f" (allowed keys: {allowed})" if e["type"] == "extra_forbidden" else ""
            raise ConfigError(f"{key}{shown}: {e['msg']}{hint}") from None
