"""The two-panel analysis figure: curves with both clock markers; clocks vs batch with the fit."""

from __future__ import annotations

import numpy as np

from twoclocks_cli.clocks.curves import clean, smooth
from twoclocks_cli.errors import ConfigError


def plot_analysis(store, result: dict, path: str) -> None:
    """Write a PNG: (1) metric vs samples per batch, clocks marked; (2) clocks vs B, log-log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    opts = result["options"]
    runs = result["runs"]
    curves = store.load_metric([r["run_id"] for r in runs], result["metric"])
    batches = sorted({r["batch_samples"] for r in runs if r["batch_samples"]})
    cmap = plt.get_cmap("viridis")
    color = {b: cmap(i / max(len(batches) - 1, 1)) for i, b in enumerate(batches)}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    seen = set()
    for r in runs:
        s = curves.get(r["run_id"])
        if s is None:
            continue
        c = clean(s.steps, s.samples, s.values)
        if c.empty:
            continue
        sm = smooth(c.values, opts["smoothing"], opts["window"], opts["ema_alpha"])
        b = r["batch_samples"]
        ax1.plot(
            c.samples,
            sm,
            color=color.get(b, "grey"),
            lw=1,
            alpha=0.8,
            label=f"B={b}" if b not in seen else None,
        )
        seen.add(b)
        if r["progress"]["samples"] is not None:
            ax1.plot(
                r["progress"]["samples"],
                result["target"]["value"],
                "o",
                color=color.get(b, "grey"),
                ms=5,
            )
        if r["failure"]["samples"] is not None:
            ax1.axvline(r["failure"]["samples"], color=color.get(b, "grey"), ls=":", lw=1)
    ax1.axhline(result["target"]["value"], color="k", ls="--", lw=0.8, label="target")
    ax1.set(
        xlabel="samples",
        ylabel=result["metric"],
        title="progress (o = progress clock, dotted = failure clock)",
    )
    ax1.legend(fontsize=8)
    bs = [b["batch_samples"] for b in result["batches"]]
    for key, marker, label in (
        ("progress", "o-", "progress clock"),
        ("failure", "s-", "failure clock"),
    ):
        med = [b[key]["median"] for b in result["batches"]]
        x = [b for b, m in zip(bs, med, strict=True) if m is not None]
        y = [m for m in med if m is not None]
        lo = [
            b[key]["low"] if b[key]["low"] is not None else m
            for b, m in zip(result["batches"], med, strict=True)
            if m is not None
        ]
        hi = [
            b[key]["high"] if b[key]["high"] is not None else m
            for b, m in zip(result["batches"], med, strict=True)
            if m is not None
        ]
        if x:
            yerr = np.clip([np.subtract(y, lo), np.subtract(hi, y)], 0, None)
            ax2.errorbar(x, y, yerr=yerr, fmt=marker, capsize=3, label=label)
        _plot_censored(ax2, result["batches"], key, marker[0], f"{label}: censored (>=)")
    crit = result["critical_batch"]
    lin, pw = crit.get("mccandlish") or {}, crit.get("power") or {}
    if bs and lin.get("b_crit") and lin.get("e_min") is not None and not lin.get("bound"):
        grid = np.geomspace(min(bs), max(bs), 50)
        s_min = lin["e_min"] / lin["b_crit"]
        ax2.plot(grid, lin["e_min"] + s_min * grid, "k--", lw=1, label="linear fit E_min + S_min B")
    if bs and pw.get("b_crit") and pw.get("exponent") and pw.get("e_min"):
        grid = np.geomspace(min(bs), max(bs), 50)
        # E0 (1 + (B/B_k)^a) with E(1) = e_min and E(b_crit) = 2 e_min (the estimate's own terms)
        a = pw["exponent"]
        bk = _power_bk(pw["b_crit"], a)
        e0 = pw["e_min"] / (1 + (1 / bk) ** a)
        ax2.plot(grid, e0 * (1 + (grid / bk) ** a), "c-.", lw=1,
                 label=f"power fit (a = {a:.2f})")
    rec = crit.get("recommended") or {}
    if rec.get("b_crit"):
        bound = {"lower": ">= ", "upper": "<= "}.get(rec.get("bound") or "", "")
        ax2.axvline(rec["b_crit"], color="r", lw=1,
                    label=f"B_crit {bound}{rec['b_crit']:.3g} ({rec.get('source')})")
        if rec.get("low") is not None and not rec.get("bound"):
            ax2.axvspan(rec["low"], rec.get("high") or max(bs or [rec["b_crit"]]), color="r",
                        alpha=0.08)
    theory = result["critical_batch"].get("theory") or {}
    if theory.get("b_crit"):
        ax2.axvline(
            theory["b_crit"],
            color="m",
            ls=":",
            lw=1,
            label=f"theory B_crit = {theory['b_crit']:.3g}",
        )
    ax2.set(
        xscale="log",
        yscale="log",
        xlabel="batch (samples)",
        ylabel="samples",
        title="clocks vs batch size (median, 90% interval)",
    )
    if bs:
        from matplotlib.ticker import NullFormatter

        ax2.set_xticks(bs, [f"{b:g}" for b in bs])
        ax2.xaxis.set_minor_formatter(NullFormatter())
    ax2.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise ConfigError(f"--plot {path}: {exc.strerror}") from None
    finally:
        plt.close(fig)


def _plot_censored(ax, batches: list[dict], key: str, marker: str, label: str) -> None:
    """Batches whose median clock is censored: an open marker at the lower bound, arrow up."""
    points = [(b["batch_samples"], b[key]["lower_bound"]) for b in batches
              if b[key]["median"] is None and b[key].get("lower_bound")]
    if not points:
        return
    x, y = zip(*points, strict=True)
    ax.scatter(x, y, marker=marker, facecolors="none", edgecolors="grey", label=label)
    for xi, yi in points:
        ax.annotate("", xy=(xi, yi * 1.35), xytext=(xi, yi),
                    arrowprops={"arrowstyle": "->", "color": "grey"})


def _power_bk(b_crit: float, a: float) -> float:
    """B_k of E0 (1 + (B/B_k)^a) whose value doubles from B = 1 to b_crit (solved numerically)."""
    from scipy.optimize import brentq

    def gap(log_bk):
        bk = np.exp(log_bk)
        return (1 + (b_crit / bk) ** a) - 2 * (1 + (1 / bk) ** a)

    try:
        return float(np.exp(brentq(gap, -20, np.log(b_crit) + 20)))
    except ValueError:
        return b_crit
