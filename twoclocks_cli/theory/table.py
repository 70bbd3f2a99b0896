"""`twoclocks theory`'s numbers: the local quadratic model's closed-form predictions for a
batch grid, its theory B_crit (also at other learning rates), and optionally simulated clocks."""

from __future__ import annotations


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
    rows = _rows(cfg, batches, lr, c)
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


def _rows(cfg, batches: list[float], lr, c: float) -> list[dict]:
    """Per batch: its lr, the first-order drift and curvature penalty per sample at h_max, the
    idealised stationary floor and the predicted failure clock."""
    import numpy as np

    from twoclocks_cli import theory as th

    h = cfg.h[: cfg.dim]
    offset = cfg.dim * cfg.theta0**2
    fail = th.failure_clock(
        cfg.optimizer, lr, batches, cfg.sigma, cfg.flat_dims, cfg.drift_threshold, offset
    )
    return [
        {
            "batch": b,
            "lr": float(lr[i]),
            "first_order_drift_per_sample_hmax": float(
                th.first_order_drift_per_sample(c, h.max())
            ),
            "curvature_penalty_per_sample_hmax": float(
                th.curvature_penalty_per_sample(c, h.max(), cfg.theta0, b)
            ),
            "stationary_floor_idealised": float(np.sum(th.stationary_floor(c, cfg.sigma, h, b))),
            "failure_clock_predicted": float(fail[i]),
        }
        for i, b in enumerate(batches)
    ]
