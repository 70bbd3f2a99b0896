"""The sweep config (TOML): pydantic models, every field documented once, unknown keys rejected."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from twoclocks_cli.backends import BACKENDS
from twoclocks_cli.core.fields import Int32
from twoclocks_cli.core.limits import INT64_MAX, SWEEP_NAME

Alpha = Annotated[float, Field(ge=-4, le=4)]  # a larger exponent overflows lr at any grid
BackendName = Literal[tuple(BACKENDS)]  # type: ignore[valid-type]  # the backends' registry
# the one list of executor names (`launch.sweeps.choose_executor` builds each): the config's
# `executor` and the --executor of `sweep` and `probe` take these
EXECUTORS = ("local", "slurm", "debug", "auto")
ExecutorName = Literal[EXECUTORS]  # type: ignore[valid-type]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class Scaling(_Strict):
    """How lr follows the batch: lr(B) = reference_lr * (B / reference_batch) ** alpha."""

    reference_batch: Int32 = Field(gt=0, description="Reference batch B0, in samples (P*G).")
    reference_lr: float = Field(gt=0, description="Learning rate at the reference batch.")
    rule: Literal["sqrt", "linear", "none"] | Alpha = Field(
        "sqrt", description="sqrt (alpha=0.5: Adam's rule under the SDE view, Malladi et al. "
        "2022, https://arxiv.org/abs/2205.10287), linear (1: SGD's, Goyal et al. 2017, "
        "https://arxiv.org/abs/1706.02677), none (0), or the exponent alpha itself (-4 to 4)."
    )
    adam_adjust: bool = Field(
        False, description="Also scale Adam as the SDE rule says (Malladi et al. 2022, "
        "https://arxiv.org/abs/2205.10287): 1-beta -> k(1-beta), eps -> eps/sqrt(k), "
        "k = B/B0 (off by default).")
    adam_beta1: float = Field(0.9, ge=0, lt=1, description="beta1 at the reference batch.")
    adam_beta2: float = Field(0.999, ge=0, lt=1, description="beta2 at the reference batch.")
    adam_eps: float = Field(1e-8, gt=0, description="Adam eps at the reference batch.")

    @property
    def alpha(self) -> float:
        return {"sqrt": 0.5, "linear": 1.0, "none": 0.0}.get(self.rule, self.rule)  # type: ignore


class BatchRange(_Strict):
    """A geometric range of batch sizes: start, start*factor, ... up to stop (inclusive)."""

    start: Int32 = Field(gt=0, description="First batch size.")
    stop: Int32 = Field(gt=0, description="Largest batch size (included when on the progression).")
    factor: float = Field(2.0, gt=1, description="Ratio between consecutive batch sizes.")


class Grid(_Strict):
    """The axes crossed (or zipped) into cells. A scalar is an axis of one value."""

    batch: list[int] | BatchRange = Field(
        description="Batch sizes: a list, or {start, stop, factor} (geometric).")
    batch_unit: Literal["prompts", "samples"] = Field(
        "prompts", description="Whether `batch` counts prompts (P) or samples (P*G).")
    group_size: int | list[int] = Field(8, description="Group size G (samples per prompt).")
    clip_low: float | list[float] = Field(0.2, description="Lower ratio clip eps.")
    clip_high: float | list[float] | None = Field(
        None, description="Upper ratio clip eps (default: equal to clip_low).")
    seeds: int | list[int] = Field(0, description="Seeds.")
    zip: list[str] = Field(
        default_factory=list, description="Axes zipped together instead of crossed, e.g. "
        "[\"batch\", \"seeds\"] or [\"batch\", \"sim.optimizer\"]; they need equal lengths.")
    trainer: dict[str, list[Any]] = Field(
        default_factory=dict, description="grpo trainer options as axes: key = [values].")
    sim: dict[str, list[Any]] = Field(
        default_factory=dict, description="sim model options as axes: key = [values].")
    trl: dict[str, list[Any]] = Field(
        default_factory=dict, description="trl backend: GRPOConfig fields as axes (into each "
        "cell's trl.args): key = [values].")


class Local(_Strict):
    """The local executor: cells run as local processes through submitit, a few at a time."""

    threads_per_job: Int32 = Field(1, gt=0, description="CPU threads one cell uses.")
    max_parallel: Int32 | None = Field(
        None, gt=0, description="Cells at once (default: cores // threads_per_job, at least 1).")
    timeout_min: float = Field(24 * 60, gt=0, description="Wall-clock limit per cell, minutes.")


class Slurm(_Strict):
    """SLURM parameters: all pending cells go out as one job array."""

    partition: str | None = Field(None, description="Partition (default: the cluster's).")
    nodes: Int32 = Field(1, gt=0, description="Nodes per cell.")
    gpus_per_node: Int32 | None = Field(None, ge=0, description="GPUs per node.")
    cpus_per_task: Int32 = Field(1, gt=0, description="CPUs per cell.")
    mem_gb: float | None = Field(None, gt=0, description="Memory per node, GB.")
    timeout_min: Int32 = Field(60, gt=0, description="Time limit per attempt, minutes; on timeout "
                             "the cell checkpoints and requeues.")
    account: str | None = Field(None, description="Account to charge.")
    qos: str | None = Field(None, description="Quality of service.")
    constraint: str | None = Field(None, description="Node feature constraint.")
    array_parallelism: Int32 = Field(16, gt=0, description="Array tasks running at once (%N).")
    max_requeues: Int32 = Field(3, ge=0, description="Timeouts a cell may requeue after.")
    setup: list[str] = Field(
        default_factory=list, description="Shell lines run before the cell (module load, ...).")
    sbatch: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="Additional sbatch options, e.g. {exclusive = true}.")


_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
ENTRY_PATTERN = rf"^(builtin:[a-z0-9-]+|{_IDENT}(\.{_IDENT})*:{_IDENT})$"  # module:function


class Trl(_Strict):
    """The `trl` backend: a user function builds a TRL GRPOTrainer from the GRPOConfig of a cell."""

    entry: str = Field(
        description="`module:function` taking a trl.GRPOConfig and returning a trainer, or "
        "`builtin:tiny-arith` (the project's tiny model on the arithmetic task).")
    python_path: list[str] = Field(
        default_factory=list, description="Folders the entry module is imported from (relative "
        "to the config file; the config file's folder is always searched).")
    processes: Int32 = Field(
        1, gt=0, description="Processes the trainer runs on (its world size); a cell's P*G "
        "completions are split over processes x gradient_accumulation_steps.")
    checkpoint_every_steps: Int32 = Field(
        10, gt=0, description="GRPOConfig save_steps: a checkpoint in the cell's workdir every N "
        "optimizer steps (a rerun resumes from the latest).")
    args: dict[str, Any] = Field(
        default_factory=dict, description="Fixed GRPOConfig fields for every cell (those the "
        "sweep sets — batch, G, lr, clip, seed, max_steps, output_dir — are refused).")

    @field_validator("entry")
    @classmethod
    def _entry_form(cls, value: str) -> str:
        if not re.match(ENTRY_PATTERN, value):
            raise ValueError("must be module:function (e.g. my_trainers:make_trainer) or "
                             "builtin:tiny-arith")
        return value


class Command(_Strict):
    """The `command` backend: any trainer run as a shell command whose log is followed live."""

    preset: Literal["verl"] | None = Field(
        None, description="verl: appends the verl overrides of the cell (batch, n, lr, clip, "
        "steps, checkpoint folder, console logger, seed) and sets the log format and resume "
        "flag.")
    template: str = Field(
        min_length=1, description="The command, with placeholders {prompts} {group_size} {lr} "
        "{clip_low} {clip_high} {seed} {total_steps} {workdir} ({{ and }} for braces); run by "
        "bash in the cell's workdir.")
    log_format: Literal["verl", "jsonl", "csv"] | None = Field(
        None, description="How the log is parsed (the ingest parsers): verl, jsonl or csv "
        "(default: the preset's; required without one).")
    log_source: str = Field(
        "stdout", min_length=1, description="stdout, or the path of the log file the command "
        "writes (placeholders allowed, e.g. \"{workdir}/metrics.jsonl\").")
    resume_args: str | None = Field(
        None, description="Appended to the command when the cell runs again (a requeue or a "
        "rerun); default: the preset's (verl: trainer.resume_mode=auto), else nothing.")
    env: dict[str, str] = Field(
        default_factory=dict, description="Environment variables set for the command.")
    poll_s: float = Field(1.0, gt=0, le=600, description="Seconds between reads of the log.")


# the sweep's tables of backend options (each backend reads one, its TABLE); grid has all but
# command as axes
OPTION_TABLES = ("trainer", "sim", "trl", "command")


class SweepConfig(_Strict):
    """One sweep: a name, a backend, a sample budget, an lr scaling rule and a grid."""

    name: str = Field(pattern=f"^{SWEEP_NAME}$",
                      description="Sweep name: letters, digits, . _ - (unique in the store).")
    backend: BackendName = Field(
        description="Which backend runs the cells: grpo (the embedded trainer), sim (the theory "
        "model), trl (a TRL GRPOTrainer, [trl]) or command (any trainer's command line, "
        "[command]).")
    sample_budget: int = Field(gt=0, le=INT64_MAX,
                               description="Samples per cell, equal across batch sizes.")
    scaling: Scaling = Field(description="The lr scaling rule.")
    grid: Grid = Field(description="The grid axes.")
    trainer: dict[str, Any] = Field(
        default_factory=dict, description="Fixed grpo trainer options passed to every cell.")
    sim: dict[str, Any] = Field(
        default_factory=dict, description="Fixed sim model options (the cell's `sim` table).")
    trl: Trl | None = Field(None, description="The trl backend's entry point and GRPOConfig.")
    command: Command | None = Field(
        None, description="The command backend's command template and log.")
    executor: ExecutorName = Field(
        "auto", description="local, slurm, debug (in-process, blocking) or auto (slurm when "
        "sbatch is on PATH, else local).")
    store: str | None = Field(
        None, min_length=1,
        description="Database URL (default: --db, $TWOCLOCKS_DB, sqlite:///twoclocks.db).")
    workdir: str = Field(
        "twoclocks-runs", min_length=1,
        description="Folder for submitit files and cell checkpoints.")
    min_steps: Int32 = Field(20, gt=0, description="Warn for cells with fewer optimizer steps.")
    local: Local = Field(default_factory=Local, description="Local executor settings.")
    slurm: Slurm = Field(default_factory=Slurm, description="SLURM settings.")
