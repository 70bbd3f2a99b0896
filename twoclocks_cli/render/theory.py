"""The tables of `twoclocks theory`: the model's predictions per batch (and simulated clocks),
then its B_crit, the curvature critical batch and the failure-clock exponent."""

from __future__ import annotations

from twoclocks_cli.core.numbers import num
from twoclocks_cli.render.tables import console


def render_theory(out: dict, simulate: bool) -> None:
    """Rich table and lines of a theory table (`theory.table.theory_table`'s dict)."""
    con = console()
    con.print(_rows_table(out, simulate))
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


def _rows_table(out: dict, simulate: bool):
    """One row per batch: lr, curvature penalty, floor, predicted (and simulated) clocks."""
    from rich.table import Table

    t = Table(
        title=f"local quadratic model: lr0={out['lr0']:g} at B0={out['b0']:g}, "
        f"alpha={out['alpha']:g}, optimizer {out['model']['optimizer']}, "
        f"target p={out['target']:g}"
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
    return t


def _g(v) -> str:
    """A clock or batch, or 'never (censored)' when the model says it never comes."""
    return "never (censored)" if v is None else num(v)
