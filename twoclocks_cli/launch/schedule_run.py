"""The training side of `twoclocks compare`: a schedule from `twoclocks schedule --out` as one
run's full training config, with the sweep's own trainer settings, the phases and the budget;
`clocks.compare` then measures the trained run.
"""

from __future__ import annotations

from pathlib import Path

from twoclocks_cli.core import toml
from twoclocks_cli.core.errors import ConfigError, NotFoundError

# Keys the schedule's phases replace: a single-phase batch/lr would only confuse a reader.
_PHASE_KEYS = ("prompts_per_batch", "samples_per_batch", "lr", "phases")


def read_phases(path: str | Path) -> list[dict]:
    """The `[[phases]]` tables of a schedule TOML file, validated as the trainer will."""
    path = Path(path)
    data = toml.read(path, "schedule file",
                     " (write it with `twoclocks schedule --out FILE`)")
    phases = data.get("phases")
    if not isinstance(phases, list) or not phases or not all(isinstance(p, dict) for p in phases):
        raise ConfigError(f"{path}: no [[phases]] tables: expected the output of "
                          "`twoclocks schedule --out`")
    return phases


def _base_cell(store, sweep: str, prompts: int) -> dict:
    """The cell config of a finished grpo run of `sweep` at `prompts` (else any grpo run)."""
    runs = [r for r in store.list_runs(sweep) if r.backend == "grpo" and r.config]
    if not runs:
        raise NotFoundError(f"sweep {sweep!r} has no grpo runs: a schedule can only be trained "
                            "from a GRPO sweep's own settings")
    runs.sort(key=lambda r: (r.batch_prompts != prompts, r.status != "completed", r.id))
    return dict(runs[0].config)


def schedule_train_config(store, sweep: str, phases: list[dict], budget: int | None = None,
                          name: str | None = None) -> dict:
    """A complete training config that runs `phases` with the sweep's trainer settings."""
    from trainer.config import TrainConfig

    base = TrainConfig.from_dict(_base_cell(store, sweep, phases[0].get("prompts_per_batch")),
                                 source=f"sweep {sweep!r} cell config")
    cfg = {k: v for k, v in base.model_dump(mode="json").items()
           if k not in _PHASE_KEYS and v is not None}
    if budget is None and phases[-1].get("until_samples") is not None:
        budget = phases[-1]["until_samples"]  # the schedule stops where it says
    if budget is not None:
        if budget <= 0:
            raise ConfigError(f"--budget {budget}: must be a positive number of samples")
        cfg["sample_budget"] = int(budget)
    cfg["prompts_per_batch"] = phases[0]["prompts_per_batch"]
    cfg["lr"] = phases[0]["lr"]
    cleaned = []
    for i, ph in enumerate(phases):
        ph = {k: v for k, v in ph.items() if v is not None}
        if i == len(phases) - 1:
            ph.pop("until_samples", None)  # the last phase runs to the budget
        cleaned.append(ph)
    cfg["phases"] = cleaned
    # Validate now: a bad phase list is one line here, not a failed run later.
    TrainConfig.from_dict(cfg, source=f"schedule of sweep {sweep!r}")
    return cfg


def to_toml(cfg: dict, header: list[str] = ()) -> str:
    """A flat training config with `[[phases]]` tables as TOML (tomllib reads it back)."""
    lines = [f"# {h}" for h in header]
    for key, value in cfg.items():
        if key != "phases" and value is not None:
            lines.append(f"{key} = {toml.value(value)}")
    for ph in cfg.get("phases", []):
        lines += ["", "[[phases]]"] + [f"{k} = {toml.value(v)}" for k, v in ph.items()
                                       if v is not None]
    return "\n".join(lines) + "\n"
