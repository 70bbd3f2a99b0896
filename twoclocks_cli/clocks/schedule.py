"""The schedule rule of the two-clocks note: small batch first, switch before the failure clock.

B_small = the largest grid batch not above the B_crit estimate; N_switch = s * (lower bound of
N_fail(B_small)); B_large = the grid batch with the latest failure clock among the batches
larger than B_small whose progress clock is uncensored and whose failure clock is later than
B_small's (the note's "switch to a larger batch"; when there is none, one phase that stops at
N_switch). Output: a phase list the trainer runs as-is, with its rationale.
"""

from __future__ import annotations

import math

from twoclocks_cli.errors import AnalysisError


def _pick_b_crit(analysis: dict) -> tuple[float, str]:
    crit = analysis["critical_batch"]
    for name in ("mccandlish", "theory", "noise_scale"):
        est = crit.get(name) or {}
        value = est.get("b_crit") if name != "noise_scale" else est.get("b_simple")
        if value is not None and math.isfinite(value):
            return float(value), name
    raise AnalysisError(
        f"sweep {analysis['sweep']!r}: no critical batch estimate ("
        + (crit["mccandlish"].get("note") or "fit failed")
        + "): cannot schedule"
    )


def _setting(analysis: dict, batch: float) -> dict:
    """lr, prompts and clip of the runs at `batch` (the first run's when they differ)."""
    rows = [r for r in analysis["runs"] if r["batch_samples"] == batch]
    r = rows[0]
    return {
        "prompts_per_batch": r["batch_prompts"],
        "lr": r["lr"],
        "clip_eps_low": r["clip_low"],
        "clip_eps_high": r["clip_high"],
        "group_size": r["group_size"],
    }


def make_schedule(analysis: dict, budget: float | None = None, safety: float = 0.8) -> dict:
    """The recommended phases of an analysed sweep (dict: phases, predicted clocks, rationale)."""
    if not 0 < safety <= 1:
        raise AnalysisError(f"--safety {safety}: must be in (0, 1]")
    batches = [b for b in analysis["batches"] if b["n_runs"] > 0]
    if not batches:
        raise AnalysisError(f"sweep {analysis['sweep']!r}: no analysed batch sizes")
    b_crit, source = _pick_b_crit(analysis)
    grid = sorted(b["batch_samples"] for b in batches)
    by = {b["batch_samples"]: b for b in batches}
    below = [b for b in grid if b <= b_crit]
    b_small = max(below) if below else grid[0]
    if budget is None:
        budget = max((r.get("last_samples") or 0) for r in analysis["runs"])
    ok = [b for b in grid if by[b]["progress"]["median"] is not None]

    def fail_key(b):
        f = by[b]["failure"]
        return math.inf if f["median"] is None else f["median"]

    # a larger batch that reached the target and fails later than B_small (else: no switch)
    later = [b for b in ok if b > b_small and fail_key(b) > fail_key(b_small)]
    b_large = max(later, key=lambda b: (fail_key(b), b)) if later else b_small
    fail_small = by[b_small]["failure"]
    lower = fail_small["low"] if fail_small["low"] is not None else fail_small["median"]
    rationale = [
        f"B_crit = {b_crit:.4g} samples ({source} estimate); grid = {grid}",
        f"B_small = {b_small:g}: the largest grid batch not above B_crit"
        + ("" if below else " (none was: the smallest batch)"),
    ]
    phases = []
    small = _setting(analysis, b_small)
    if lower is None:
        rationale.append(f"no run at B={b_small:g} failed within the budget: one phase, no switch")
        phases.append({"until_samples": budget, **_phase_keys(small)})
        n_switch = None
    elif b_large == b_small:
        rationale.append(
            f"no larger batch that reached the target fails later than B={b_small:g}: "
            "switching would not delay failure; one phase, stop (or keep the checkpoint) before "
            f"{safety:g} x {lower:.4g} = {safety * lower:.4g} samples"
        )
        n_switch = safety * lower
        phases.append({"until_samples": budget, **_phase_keys(small)})
    else:
        n_switch = safety * lower
        rationale.append(
            f"N_switch = {safety:g} x {lower:.4g} (lower bound of N_fail at B={b_small:g}) = "
            f"{n_switch:.4g} samples"
        )
        rationale.append(
            f"B_large = {b_large:g}: latest failure clock ("
            + (
                "censored"
                if by[b_large]["failure"]["median"] is None
                else f"{by[b_large]['failure']['median']:.4g}"
            )
            + " samples) among larger batches that reached the target"
        )
        phases.append({"until_samples": round(n_switch), **_phase_keys(small)})
        phases.append({"until_samples": budget, **_phase_keys(_setting(analysis, b_large))})
    prog = by[b_small]["progress"]["median"]
    pred_fail = _predicted_failure(by, b_small, b_large, n_switch)
    return {
        "sweep": analysis["sweep"],
        "b_crit": b_crit,
        "b_crit_source": source,
        "b_small": b_small,
        "b_large": b_large,
        "n_switch": n_switch if len(phases) > 1 else None,
        "stop_before_samples": n_switch if len(phases) == 1 else None,
        "safety": safety,
        "budget": budget,
        "phases": phases,
        "predicted": {"progress_samples": prog, "failure_samples": pred_fail},
        "rationale": rationale,
    }


def _phase_keys(setting: dict) -> dict:
    return {k: setting[k] for k in ("prompts_per_batch", "lr", "clip_eps_low", "clip_eps_high")}


def _predicted_failure(by, b_small, b_large, n_switch):
    """Drift budget left at the switch, spent at the large batch's rate (None: beyond data)."""
    fs = by[b_small]["failure"]["median"]
    fl = by[b_large]["failure"]["median"]
    if n_switch is None or fs is None:
        return None
    if b_large == b_small:
        return fs
    if fl is None:
        return None
    return n_switch + (1 - n_switch / fs) * fl


def to_toml(schedule: dict) -> str:
    """The phase list as TOML ([[phases]] tables), with the rationale as comments."""
    lines = [f"# twoclocks schedule for sweep {schedule['sweep']!r}"]
    lines += [f"# {r}" for r in schedule["rationale"]]
    for ph in schedule["phases"]:
        lines.append("")
        lines.append("[[phases]]")
        for key, value in ph.items():
            if value is None:
                continue
            if isinstance(value, float) and key in ("until_samples",):
                value = int(round(value))
            lines.append(
                f"{key} = {value!r}" if not isinstance(value, str) else f'{key} = "{value}"'
            )
    return "\n".join(lines) + "\n"
