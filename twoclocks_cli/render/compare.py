"""`twoclocks compare`'s table: a schedule or adaptive run's clocks beside the sweep's
constant batches and the static schedule, in samples and (with a throughput) in hours and cost."""

from __future__ import annotations

from rich.table import Table

from twoclocks_cli.core.numbers import count, num
from twoclocks_cli.render.tables import console


def merged_phases(phases: list[dict]) -> list[dict]:
    """Consecutive phases with the same batch as one (an adaptive run's decisions that kept
    the batch), its lr the last one's: the controller's lr follows the batch, so within one
    batch only an lr warm-up moves it, and the lr it reached is the one to show."""
    out: list[dict] = []
    for p in phases:
        last = out[-1] if out else None
        if last and last["prompts_per_batch"] == p["prompts_per_batch"]:
            last["to_samples"], last["steps"] = p["to_samples"], last["steps"] + p["steps"]
            last["lr"] = p["lr"]
        else:
            out.append(dict(p))
    return out


def _clock(c: dict) -> str:
    if c.get("median") is not None:
        lo, hi = c.get("low"), c.get("high")
        return count(c["median"]) + (f" [{count(lo)}, {count(hi)}]" if lo is not None else "")
    lb = c.get("lower_bound")
    return f">= {count(lb)} (censored)" if lb is not None else "censored"


def _one(c: dict) -> str:
    if c["samples"] is not None:
        return count(c["samples"]) + (f" ({c['rule']})" if c.get("rule") else "")
    return f">= {count(c['censored_at'])} (censored)"


def _hours(sp: dict | None, money: bool = False) -> str:
    """One clock in hours (or money): median [interval], '>= bound' when censored, '-' when
    unknown."""
    if sp is None:
        return "-"
    value, low, high = (sp["cost"], sp["cost_low"], sp["cost_high"]) if money else (
        sp["seconds"], sp["low"], sp["high"])
    scale, unit = (1.0, "") if money else (3600.0, " h")
    if value is None:
        bound = sp["lower_bound"]
        return "-" if money or bound is None else f">= {num(bound / scale, 3)}{unit} (censored)"
    text = f"{num(value / scale, 3)}{unit}"
    if low is None or low == high:  # one seed at an exact throughput: no interval
        return text
    hi = "censored" if high is None else num(high / scale, 3)
    return f"{text} [{num(low / scale, 3)}-{hi}]"


def _time_cells(time: dict | None, sp: tuple[dict, dict] | None) -> list[str]:
    """The time (and cost) columns of one row: to target, to failure."""
    if time is None:
        return []
    prog, fail = sp if sp is not None else (None, None)
    cells = [_hours(prog), _hours(fail)]
    if time["price_per_hour"] is not None:
        cells += [_hours(prog, True), _hours(fail, True)]
    return cells


def _pair(doc: dict | None) -> tuple[dict, dict] | None:
    return None if doc is None else (doc["progress"], doc["failure"])


def render(result: dict) -> None:
    """A rich table: constant batches, then the schedule row, in samples and (with a
    throughput) in hours and cost; the phases; the verdict."""
    con = console()
    t = result["target"]
    time = result.get("time")
    title = (f"schedule vs constant batches ({result['sweep']}): samples to "
             f"{result['metric']} {t['value']:.3g} ({t['spec']}), samples to failure")
    if time is not None:
        title += (f"; hours ({time['source']} throughput" + (
            f", cost at {time['price_per_hour']:g} per hour" if time["price_per_hour"]
            is not None else "") + "), median [90%]")
    table = Table(title=title)
    cols = ["run", "batch: samples (prompts)", "lr", "seeds", "to target", "failure", "final"]
    if time is not None:
        cols += ["time to target", "time to failure"]
        cols += ["cost to target", "cost to failure"] if time["price_per_hour"] is not None \
            else []
    for col in cols:
        table.add_column(col)
    timed = {b["batch_samples"]: b for b in (time or {}).get("batches", [])}
    for row in result["constant"]:
        final = "-" if row["final"] is None else f"{row['final']:.3f}"
        prompts = ",".join(str(x) for x in row["batch_prompts"])
        tb = timed.get(row["batch_samples"])
        table.add_row("constant", f"{num(row['batch_samples'])} ({prompts})",
                      ", ".join(f"{x:.3g}" for x in row["lr"]), str(row["n_runs"]),
                      _clock(row["progress"]), _clock(row["failure"]), final,
                      *_time_cells(time, tb and (tb["progress"], tb["failure"])))
    s = result["schedule"]
    kind = result.get("kind", "schedule")
    phases = merged_phases(s["phases"])
    batches = " -> ".join(f"({p['prompts_per_batch']})" for p in phases) or "-"
    lrs = " -> ".join("-" if p["lr"] is None else f"{p['lr']:.3g}" for p in phases) or "-"
    static = result.get("static_schedule")
    if static and static["phases"]:
        pred = static["predicted"]
        pp, pf = pred["progress_samples"], pred["failure_samples"]
        table.add_row("static schedule (predicted)",
                      " -> ".join(f"({p['prompts_per_batch']})" for p in static["phases"]),
                      " -> ".join(f"{p['lr']:.3g}" for p in static["phases"]), "-",
                      "unknown" if pp is None else count(pp),
                      "unknown" if pf is None else count(pf), "-",
                      *_time_cells(time, _pair((time or {}).get("static_schedule"))))
    table.add_row(f"{kind} #{s['run_id']}", batches, lrs, "1", _one(s["progress"]),
                  _one(s["failure"]), f"{s['final']:.3f}",
                  *_time_cells(time, _pair((time or {}).get("schedule"))))
    con.print(table)
    if time is None and result.get("time_note"):
        con.print(result["time_note"])
    if static and static["phases"]:
        pred = static["predicted"]
        con.print(f"static schedule (`twoclocks schedule`): progress {pred['progress_why']}; "
                  f"failure {pred['failure_why']}")
    elif static:
        con.print(f"static schedule: none ({static['why']})")
    con.print(f"{kind} run {s['run_id']} ({s['status']}):")
    for p in phases:
        lr = "-" if p["lr"] is None else f"{p['lr']:.4g}"
        con.print(f"  phase {p['phase']}: samples {count(p['from_samples'])}-"
                  f"{count(p['to_samples'])}, "
                  f"{p['prompts_per_batch']} prompts/batch, lr {lr}, {p['steps']} steps")
    for line in result["verdict"]:
        con.print(f"  {line}")
