"""Verify a schedule: train it as one run, then set its two clocks beside the constant-batch runs.

`schedule_train_config` turns a sweep plus the `[[phases]]` that `twoclocks schedule --out` wrote
into a full training config (the sweep's own trainer settings, the phases, the sweep's budget).
`compare_schedule` measures the schedule run with exactly the options, metric and target of the
sweep's stored analysis (the functions of `twoclocks_cli.clocks`), so the numbers line up.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import numpy as np

from twoclocks_cli.clocks import collapse
from twoclocks_cli.clocks.curves import clean, first_crossing, smooth
from twoclocks_cli.clocks.options import AnalysisOptions
from twoclocks_cli.errors import AnalysisError, ConfigError, NotFoundError

# Keys the schedule's phases replace: a single-phase batch/lr would only confuse a reader.
_PHASE_KEYS = ("prompts_per_batch", "samples_per_batch", "lr", "phases")


def read_phases(path: str | Path) -> list[dict]:
    """The `[[phases]]` tables of a schedule TOML file, validated as the trainer will."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: schedule file not found (write it with `twoclocks schedule "
                          "--out FILE`)")
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
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


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"cannot write the non-finite value {value} to TOML")
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise ConfigError(f"cannot write a {type(value).__name__} to TOML")


def to_toml(cfg: dict, header: list[str] = ()) -> str:
    """A flat training config with `[[phases]]` tables as TOML (tomllib reads it back)."""
    lines = [f"# {h}" for h in header]
    for key, value in cfg.items():
        if key != "phases" and value is not None:
            lines.append(f"{key} = {_toml_value(value)}")
    for ph in cfg.get("phases", []):
        lines += ["", "[[phases]]"] + [f"{k} = {_toml_value(v)}" for k, v in ph.items()
                                       if v is not None]
    return "\n".join(lines) + "\n"


def _run_clocks(store, run_id: int, metric: str, tau: float, opts: AnalysisOptions) -> dict:
    """Progress and failure clocks of one run under the analysis's options (as `analyze`)."""
    series = store.load_metric([run_id], metric).get(run_id)
    curve = clean(series.steps, series.samples, series.values) if series is not None else None
    if curve is None or curve.empty:
        raise AnalysisError(f"run {run_id} has no finite {metric!r} values: nothing to compare")
    sm = smooth(curve.values, opts.smoothing, opts.window, opts.ema_alpha)
    last = float(curve.samples[-1])
    fired = {}
    nf = store.load_metric([run_id], "nonfinite").get(run_id)
    fired["nonfinite"] = collapse.nonfinite_rule(nf.samples, nf.values) if nf else None
    if opts.drop:
        fired["drop"] = collapse.drop_rule(curve.samples, sm, float(sm[0]), opts.drop_rho,
                                           opts.drop_delta, opts.drop_k)
    if opts.drift_threshold is not None:
        s = store.load_metric([run_id], opts.drift_key).get(run_id)
        fired["drift"] = (collapse.above_rule(s.samples, s.values, opts.drift_threshold)
                          if s else None)
    if opts.entropy_low is not None or opts.entropy_high is not None:
        s = store.load_metric([run_id], opts.entropy_key).get(run_id)
        fired["entropy"] = (collapse.band_rule(s.samples, s.values, opts.entropy_low,
                                               opts.entropy_high) if s else None)
    hits = []
    for key, bound in (("resp_len_mean", opts.length_max), ("truncated_frac", opts.truncated_max)):
        s = store.load_metric([run_id], key).get(run_id) if bound is not None else None
        if s:
            hits.append(collapse.above_rule(s.samples, s.values, bound))
    if opts.length_max is not None or opts.truncated_max is not None:
        fired["length"] = min([h for h in hits if h is not None], default=None)
    n_fail, rule = collapse.earliest(fired)
    n_prog = first_crossing(curve.samples, sm, tau)
    if n_prog is not None and n_fail is not None and n_fail < n_prog:
        n_prog = None  # collapsed before the target, as in `analyze`
    return {
        "progress": {"samples": n_prog, "censored": n_prog is None,
                     "censored_at": last if n_prog is None else None},
        "failure": {"samples": n_fail, "rule": rule, "censored": n_fail is None,
                    "censored_at": last if n_fail is None else None},
        "last_samples": last,
        "final": float(sm[-1]),
        "best": float(sm.max()),
    }


def phase_summary(store, run_id: int) -> list[dict]:
    """The phases a run actually trained, from its per-step `phase`, `prompts`, `lr` metrics."""
    cols = {k: store.load_metric([run_id], k).get(run_id)
            for k in ("phase", "prompts", "lr", "batch_samples")}
    ph = cols["phase"]
    if ph is None or ph.values.size == 0:
        return []
    out: list[dict] = []
    for i, value in enumerate(ph.values):
        index = int(value)
        if not out or out[-1]["phase"] != index:
            start = float(ph.samples[i])
            if cols["batch_samples"] is not None:
                start -= float(_at(cols["batch_samples"], ph.steps[i]) or 0)
            out.append({"phase": index, "from_samples": start, "steps": 0,
                        "prompts_per_batch": _int(_at(cols["prompts"], ph.steps[i])),
                        "lr": _at(cols["lr"], ph.steps[i])})
        out[-1]["steps"] += 1
        out[-1]["to_samples"] = float(ph.samples[i])
    return out


def _at(series, step):
    if series is None:
        return None
    idx = np.flatnonzero(series.steps == step)
    return float(series.values[idx[-1]]) if idx.size else None


def _int(v):
    return None if v is None else int(round(v))


def _constant_rows(store, analysis: dict, tau: float, opts: AnalysisOptions) -> list[dict]:
    """Per batch size: the analysis's clocks, plus the median final smoothed metric."""
    rows = []
    for b in analysis["batches"]:
        runs = [r for r in analysis["runs"] if r["batch_samples"] == b["batch_samples"]]
        finals = []
        for r in runs:
            try:
                clocks = _run_clocks(store, r["run_id"], analysis["metric"], tau, opts)
                finals.append(clocks["final"])
            except AnalysisError:
                continue
        rows.append({
            "final": float(np.median(finals)) if finals else None,
            "batch_samples": b["batch_samples"], "batch_prompts": b["batch_prompts"],
            "lr": b["lr"], "n_runs": b["n_runs"],
            "progress": b["progress"], "failure": b["failure"],
            "failure_rules": sorted({r["failure"]["rule"] for r in runs if r["failure"]["rule"]}),
            "reached": sum(1 for r in runs if not r["progress"]["censored"]),
            "failed": sum(1 for r in runs if not r["failure"]["censored"]),
        })
    return rows


def _fmt(v) -> str:
    return f"{v:.4g}"


def _verdict(constant: list[dict], sched: dict) -> list[str]:
    """Plain statements with the numbers: schedule vs the smallest and the largest batch."""
    lines = []
    if not constant:
        return ["no constant-batch runs to compare with"]
    small, large = constant[0], constant[-1]
    sp = sched["progress"]["samples"]
    for label, row in (("smallest", small), ("largest", large)):
        med = row["progress"]["median"]
        b = row["batch_samples"]
        if sp is None and med is None:
            lines.append(f"progress: neither the schedule nor the {label} batch (B={b}) reached "
                         "the target")
        elif sp is None:
            lines.append(f"progress: the schedule did not reach the target (censored at "
                         f"{_fmt(sched['progress']['censored_at'])}); the {label} batch (B={b}) "
                         f"did at {_fmt(med)} samples")
        elif med is None:
            lines.append(f"progress: the schedule reached the target at {_fmt(sp)} samples; the "
                         f"{label} batch (B={b}) median did not ({row['reached']} of "
                         f"{row['n_runs']} seeds did)")
        else:
            lines.append(f"progress: the schedule reached the target at {_fmt(sp)} samples vs "
                         f"{_fmt(med)} for the {label} batch (B={b}): {sp / med:.2f}x")
    sf = sched["failure"]["samples"]
    fs = small["failure"]["median"]
    sched_f = (f"failed at {_fmt(sf)} samples ({sched['failure']['rule']})" if sf is not None
               else f"did not fail within {_fmt(sched['failure']['censored_at'])} samples")
    small_f = (f"failed at {_fmt(fs)} (median)" if fs is not None
               else f"did not fail (median censored; {small['failed']} of {small['n_runs']} "
               "seeds failed)")
    lines.append(f"failure: the schedule {sched_f}; the smallest batch "
                 f"(B={small['batch_samples']}) {small_f}")
    return lines


def compare_schedule(store, sweep: str, run_id: int, analysis: dict) -> dict:
    """The schedule run's clocks and phases beside the sweep's per-batch clocks (a JSON dict)."""
    run = store.get_run(run_id)
    opts = AnalysisOptions(**analysis["options"])
    tau = float(analysis["target"]["value"])
    clocks = _run_clocks(store, run_id, analysis["metric"], tau, opts)
    constant = _constant_rows(store, analysis, tau, opts)
    sched = {"run_id": run.id, "name": run.name, "status": run.status,
             "phases": phase_summary(store, run_id), **clocks}
    return {
        "sweep": sweep,
        "analysis_id": analysis.get("analysis_id"),
        "metric": analysis["metric"],
        "target": analysis["target"],
        "options": analysis["options"],
        "units": "samples (one sampled completion)",
        "constant": constant,
        "schedule": sched,
        "verdict": _verdict(constant, sched),
    }
