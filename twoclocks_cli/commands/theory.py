"""`twoclocks theory`: the local quadratic model's predictions for a batch grid (+ simulation)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from twoclocks_cli.options import COUNT, JsonOption, parse_numbers, within

MAX_BATCH = 1e9  # samples per batch the model is asked about


def theory_table(
    batches: list[float],
    lr0: float,
    b0: float,
    alpha: float,
    target: float,
    sim: dict | None = None,
    simulate: bool = False,
    seeds: int = 3,
    budget: float = 1e5,
    cap: float | None = None,
    lr_factors: tuple[float, ...] = (),
) -> dict:
    """Closed-form predictions per batch, the theory B_crit, and optionally simulated clocks."""
    import numpy as np

    from twoclocks_cli import theory as th

    cfg = th.ModelConfig.from_dict(sim or {}, where="--set")
    lr = th.scaled_lr(lr0, b0, batches, alpha)
    c = th.step_constant(lr0, cfg.sigma, b0)
    h = cfg.h[: cfg.dim]
    offset = cfg.dim * cfg.theta0**2
    fail = th.failure_clock(
        cfg.optimizer, lr, batches, cfg.sigma, cfg.flat_dims, cfg.drift_threshold, offset
    )
    rows = []
    for i, b in enumerate(batches):
        rows.append(
            {
                "batch": b,
                "lr": float(lr[i]),
                "first_order_drift_per_sample_hmax": float(
                    th.first_order_drift_per_sample(c, h.max())
                ),
                "curvature_penalty_per_sample_hmax": float(
                    th.curvature_penalty_per_sample(c, h.max(), cfg.theta0, b)
                ),
                "stationary_floor_idealised": float(
                    np.sum(th.stationary_floor(c, cfg.sigma, h, b))
                ),
                "failure_clock_predicted": float(fail[i]),
            }
        )
    out = {
        "model": cfg.to_dict(),
        "lr0": lr0,
        "b0": b0,
        "alpha": alpha,
        "target": target,
        "cap": cap,
        "c": c,
        "curvature_critical_batch_hmax": float(th.curvature_critical_batch(c, h.max())),
        "failure_exponent": th.failure_exponent(cfg.optimizer, alpha),
        "failure_exponent_meaning": "d log N_fail / d log B: 0 invariant per sample, 1 per step",
        "critical_batch": th.predict_critical_batch(cfg, lr0, b0, target, alpha, cap),
        "rows": rows,
        "critical_batch_vs_lr": [
            {"lr0": lr0 * f, **th.predict_critical_batch(cfg, lr0 * f, b0, target, alpha, cap)}
            for f in lr_factors
        ],
    }
    if simulate:
        res = th.simulate_sweep(cfg, batches, lr, seeds, budget, target, cap=cap)
        for which in ("n_prog", "n_fail"):
            bb, med = res.median_by_batch(which)
            for row, m in zip(rows, med, strict=True):
                row[f"simulated_{which}"] = None if np.isnan(m) else float(m)
        out["simulation"] = {"seeds": seeds, "budget": budget}
    return out


def _parse_set(items: list[str]) -> dict:
    from twoclocks_cli.core.errors import ConfigError

    out = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE (a sim model field)")
        k, v = item.split("=", 1)
        try:
            val = json.loads(v)
        except json.JSONDecodeError:
            val = v
        out[k.strip()] = val
    return out


def _check_simulation(grid: list[float], seeds: int, budget: float) -> None:
    """Refuse a --simulate grid whose rows or steps could not finish in reason (every row
    steps until the smallest batch has spent the budget)."""
    from twoclocks_cli.core.errors import ConfigError
    from twoclocks_cli.core.limits import MAX_SIM_ROW_STEPS as MAX_ROW_STEPS
    from twoclocks_cli.core.limits import MAX_SIM_ROWS as MAX_ROWS

    rows = len(grid) * seeds
    if rows > MAX_ROWS:
        raise ConfigError(f"--seeds {seeds} x {len(grid)} batches = {rows:,} simulated runs; "
                          f"at most {MAX_ROWS:,}")
    work = rows * budget / min(grid)
    if work > MAX_ROW_STEPS:
        raise ConfigError(f"--simulate: {rows:,} runs x {budget / min(grid):,.0f} steps "
                          f"(--budget / the smallest batch) = {work:.3g} steps; at most "
                          f"{MAX_ROW_STEPS:.0e}: lower --budget or --seeds, or raise the "
                          "smallest batch")


def theory(
    batches: Annotated[
        str, typer.Option(help="Comma-separated batch sizes (samples).")
    ] = "16,32,64,128,256",
    lr0: Annotated[float, typer.Option(help="Learning rate at the reference batch, in (0, 1].",
                                       callback=within(0, 1, low_open=True))] = 0.01,
    b0: Annotated[float, typer.Option(help="Reference batch (samples).",
                                      callback=within(1, MAX_BATCH))] = 32,
    rule: Annotated[
        str, typer.Option(help="lr scaling: sqrt, linear, constant, or alpha=X.")
    ] = "sqrt",
    target: Annotated[float, typer.Option(
        help="Target progress p = 1 - L/L0 in (0,1).",
        callback=within(0, 1, low_open=True, high_open=True))] = 0.9,
    cap: Annotated[float | None, typer.Option(
        help="Per-step displacement cap (> 0).", callback=within(0, low_open=True))] = None,
    sets: Annotated[
        list[str] | None,
        typer.Option(
            "--set", help="Model field KEY=VALUE (dim, sigma, flat_dims, optimizer, ...)."
        ),
    ] = None,
    simulate: Annotated[bool, typer.Option("--simulate", help="Add simulated clocks.")] = False,
    seeds: Annotated[int, typer.Option(help="Seeds per batch when simulating.",
                                       callback=COUNT)] = 3,
    budget: Annotated[float, typer.Option(help="Samples per simulated run.",
                                          callback=within(0, 2**63 - 1, low_open=True))] = 1e5,
    lr_scan: Annotated[
        str | None, typer.Option(help="Also give B_crit at lr0 times these factors, e.g. 0.3,3.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Print the local quadratic model's predictions for a batch grid (--simulate: and clocks)."""
    from twoclocks_cli.core.errors import ConfigError
    from twoclocks_cli.theory import SCALING_RULES

    grid = parse_numbers(batches, "--batches", 1, MAX_BATCH, most=64)
    if rule in SCALING_RULES:
        alpha = SCALING_RULES[rule]
    elif rule.startswith("alpha="):
        try:
            alpha = float(rule[6:])
        except ValueError:
            raise ConfigError(f"--rule {rule!r}: alpha=X needs a number") from None
        if not -4 <= alpha <= 4:  # also refuses nan
            raise ConfigError(f"--rule {rule!r}: alpha must be a number from -4 to 4")
    else:
        raise ConfigError(f"--rule {rule!r}: allowed are sqrt, linear, constant, alpha=X")
    factors = () if lr_scan is None else tuple(
        parse_numbers(lr_scan, "--lr-scan", 0, 1 / lr0, low_open=True, most=16))
    if simulate:
        _check_simulation(grid, seeds, budget)
    out = theory_table(
        grid, lr0, b0, alpha, target, _parse_set(sets or []), simulate, seeds, budget, cap, factors
    )
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    from rich.table import Table

    from twoclocks_cli.core.numbers import num
    from twoclocks_cli.render.tables import console

    con = console()
    t = Table(
        title=f"local quadratic model: lr0={lr0:g} at B0={b0:g}, alpha={alpha:g}, "
        f"optimizer {out['model']['optimizer']}, target p={target:g}"
    )
    cols = ["batch", "lr", "penalty/sample", "floor", "N_fail pred"]
    if simulate:
        cols += ["N_prog sim", "N_fail sim"]
    for col in cols:
        t.add_column(col)
    for r in out["rows"]:
        cells = [
            num(r["batch"]),
            num(r["lr"]),
            f"{r['curvature_penalty_per_sample_hmax']:.3g}",
            f"{r['stationary_floor_idealised']:.3g}",
            num(r["failure_clock_predicted"]),
        ]
        if simulate:
            cells += [_g(r.get("simulated_n_prog")), _g(r.get("simulated_n_fail"))]
        t.add_row(*cells)
    con.print(t)
    con.print(
        "penalty/sample: one-step curvature loss per sample at h_max (c^2 h^3 theta0^2 B/2); "
        "floor: idealised stationary loss; N_fail pred: noise-driven drift reaching "
        "drift_threshold, no cap; N_prog/N_fail sim: medians over seeds, in samples."
    )
    cb = out["critical_batch"]
    con.print(
        f"critical batch (theory, {cb['method']}): {_g(cb['b_crit'])} "
        f"— {cb['mechanism']}; E_min={_g(cb['e_min'])}, "
        f"S_min={'-' if cb['s_min'] is None else _g(cb['s_min'])}"
    )
    for row in out["critical_batch_vs_lr"]:
        con.print(f"  at lr0={row['lr0']:.4g}: B_crit {_g(row['b_crit'])} — {row['mechanism']}")
    con.print(
        f"curvature critical batch 2/(c h_max) (idealised): "
        f"{out['curvature_critical_batch_hmax']:.4g}"
    )
    con.print(
        f"failure-clock exponent d log N_fail / d log B = {out['failure_exponent']:g} "
        "(0: invariant per sample, 1: invariant per step)"
    )


def _g(v) -> str:
    from twoclocks_cli.core.numbers import num

    return "never (censored)" if v is None else num(v)
