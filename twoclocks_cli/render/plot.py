"""Every figure twoclocks draws: metric curves with both clock markers, both clocks against the
batch size with the B_crit estimates, and small multiples of the other logged metrics.

`analyze --plot` puts the first two side by side in one PNG; `report` writes each as its own PNG.
All of them read the typed analysis (`clocks.result.Analysis`); curves come from
the store's `load_metric`, read by the command. matplotlib is imported only when a figure is drawn.
"""

from __future__ import annotations

import math

import numpy as np

from twoclocks_cli.clocks.curves import clean, smooth
from twoclocks_cli.clocks.result import Analysis
from twoclocks_cli.core.errors import ConfigError

PROGRESS_COLOUR, FAILURE_COLOUR = "#2e86c1", "#c0392b"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def batch_colours(batches) -> dict:
    """One viridis colour per batch size, spaced in log B."""
    import matplotlib as mpl

    bs = sorted({b for b in batches if b})
    cmap = mpl.colormaps["viridis"]
    if len(bs) <= 1:
        return {b: cmap(0.35) for b in bs}
    lo, hi = math.log(bs[0]), math.log(bs[-1])
    return {b: cmap(0.9 * (math.log(b) - lo) / (hi - lo)) for b in bs}


def _save(fig, path, option: str) -> None:
    plt = _pyplot()
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise ConfigError(f"{option} {path}: {exc.strerror}") from None
    finally:
        plt.close(fig)


# -- panels ---------------------------------------------------------------------------------


def draw_curves(ax, curves: dict, batch_of: dict, metric: str, a: Analysis | None) -> None:
    """The metric against samples per run, coloured by batch; with an analysis, smoothed as it
    was analysed, o at the progress clock, a dotted line at the failure clock, the target."""
    colour = batch_colours(batch_of.values())
    rows = {r.run_id: r for r in a.runs} if a else {}
    opts = a.options if a else None
    seen = set()
    for rid, s in curves.items():
        c = clean(s.steps, s.samples, s.values)
        if c.empty:
            continue
        b = batch_of.get(rid)
        col = colour.get(b, "grey")
        y = (smooth(c.values, opts.smoothing, opts.window, opts.ema_alpha)
             if opts is not None and opts.smoothing else c.values)
        ax.plot(c.samples, y, color=col, lw=1.2, alpha=0.85,
                label=f"B={b:g}" if b is not None and b not in seen else None)
        seen.add(b)
        row = rows.get(rid)
        if row is None:
            continue
        if row.progress.samples is not None and a.target.value is not None:
            ax.plot(row.progress.samples, a.target.value, "o", color=col, mec="black", ms=6)
        if row.failure.samples is not None:
            ax.axvline(row.failure.samples, color=col, ls=":", lw=1)
    if a and a.target.value is not None:
        ax.axhline(a.target.value, color=FAILURE_COLOUR, ls="--", lw=1.2,
                   label=f"target {a.target.value:.3g}")
    ax.set(xlabel="samples (completions)", ylabel=metric,
           title="progress (o = progress clock, dotted = failure clock)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)


def draw_clocks(ax, a: Analysis) -> None:
    """Both clocks per batch (median, 90% interval; censored as open markers with an arrow),
    the linear and power fits, the recommended B_crit (and its interval), theory's B_crit."""
    bs = [b.batch_samples for b in a.batches]
    for clock, marker, colour, dx in (("progress", "o-", PROGRESS_COLOUR, 0.97),
                                      ("failure", "s-", FAILURE_COLOUR, 1.03)):
        pts = [(b.batch_samples * dx, getattr(b, clock)) for b in a.batches]
        shown = [(x, g) for x, g in pts if g.median is not None]
        if shown:
            y = np.array([g.median for _, g in shown])
            lo = np.array([g.low if g.low is not None else g.median for _, g in shown])
            hi = np.array([g.high if g.high is not None else g.median for _, g in shown])
            ax.errorbar([x for x, _ in shown], y, yerr=np.clip([y - lo, hi - y], 0, None),
                        fmt=marker, color=colour, capsize=3, label=f"{clock} clock")
        cens = [(x, g.lower_bound) for x, g in pts if g.median is None and g.lower_bound]
        if cens:
            ax.scatter(*zip(*cens, strict=True), marker=marker[0], facecolors="none",
                       edgecolors=colour, label=f"{clock} clock censored (>=)")
            for x, y in cens:
                ax.annotate("", xy=(x, y * 1.35), xytext=(x, y),
                            arrowprops={"arrowstyle": "->", "color": colour})
    _draw_fits(ax, a, bs)
    ax.set(xscale="log", yscale="log", xlabel="batch (samples)", ylabel="samples",
           title="clocks vs batch size (median, 90% interval)")
    if bs:
        from matplotlib.ticker import NullFormatter

        ax.set_xticks(bs, [f"{b:g}" for b in bs])
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)


def _draw_fits(ax, a: Analysis, bs: list[float]) -> None:
    crit = a.critical
    lin, pw, rec = crit.mccandlish, crit.power, crit.recommended
    grid = np.geomspace(min(bs), max(bs), 50) if bs else None
    if grid is not None and lin.b_crit and lin.e_min is not None and not lin.bound:
        ax.plot(grid, lin.e_min + lin.e_min / lin.b_crit * grid, "k--", lw=1,
                label="linear fit E_min + S_min B")
    if grid is not None and pw.b_crit and pw.exponent and pw.e_min:
        # E0 (1 + (B/B_k)^a) with E(1) = e_min and E(b_crit) = 2 e_min (the estimate's terms)
        bk = _power_bk(pw.b_crit, pw.exponent)
        e0 = pw.e_min / (1 + (1 / bk) ** pw.exponent)
        ax.plot(grid, e0 * (1 + (grid / bk) ** pw.exponent), "c-.", lw=1,
                label=f"power fit (a = {pw.exponent:.2f})")
    if rec is not None and rec.b_crit:
        ax.axvline(rec.b_crit, color="r", lw=1, label=f"B_crit {rec.text()} ({rec.source})")
        if rec.low is not None and not rec.bound:
            ax.axvspan(rec.low, rec.high or max(bs or [rec.b_crit]), color="r", alpha=0.08)
    if crit.theory_b_crit:
        ax.axvline(crit.theory_b_crit, color="m", ls=":", lw=1,
                   label=f"theory B_crit = {crit.theory_b_crit:.3g}")


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


# -- figures --------------------------------------------------------------------------------


def plot_analysis(curves: dict, a: Analysis, path: str) -> None:
    """`analyze --plot`: (1) metric vs samples ({run_id: Series}), clocks marked; (2) clocks vs
    B, log-log."""
    batch_of = {r.run_id: r.batch_samples for r in a.runs}
    fig, (ax1, ax2) = _pyplot().subplots(1, 2, figsize=(13, 5))
    draw_curves(ax1, curves, batch_of, a.metric, a)
    draw_clocks(ax2, a)
    _save(fig, path, "--plot")


def plot_curves(path, curves: dict, batch_of: dict, metric: str, a: Analysis | None,
                title: str) -> bool:
    """The report's curves figure; False when there is nothing to draw."""
    if not curves:
        return False
    fig, ax = _pyplot().subplots(figsize=(9, 5), dpi=100)
    draw_curves(ax, curves, batch_of, metric, a)
    ax.set_title(title)
    _save(fig, path, "--out")
    return True


def plot_clocks(path, a: Analysis | None, title: str) -> bool:
    """The report's clocks-by-batch figure; False without analysed batches."""
    if a is None or not a.batches:
        return False
    fig, ax = _pyplot().subplots(figsize=(9, 5), dpi=100)
    draw_clocks(ax, a)
    ax.set_title(title)
    _save(fig, path, "--out")
    return True


def plot_side(path, curves_by_key: dict, batch_of: dict) -> bool:
    """Small multiples of the other logged metrics (entropy, KL, drift, length...)."""
    keys = [k for k, v in curves_by_key.items() if v]
    if not keys:
        return False
    colour = batch_colours(batch_of.values())
    cols = min(3, len(keys))
    rows = math.ceil(len(keys) / cols)
    fig, axes = _pyplot().subplots(rows, cols, figsize=(4 * cols, 3 * rows), dpi=100,
                                   squeeze=False)
    for ax, key in zip(axes.flat, keys, strict=False):
        for rid, s in curves_by_key[key].items():
            ax.plot(s.samples, s.values, lw=1.2, color=colour.get(batch_of.get(rid), "#555555"))
        ax.set_title(key, fontsize=10)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.supxlabel("samples (completions)", fontsize=9)
    _save(fig, path, "--out")
    return True


def plot_trajectory(path, traj, a: Analysis, clocks: dict, title: str) -> bool:
    """An adaptive or scheduled run's batch over samples (steps), its decisions (o progress,
    s guard) and the local B_crit each acted on (^), against the sweep's per-batch clocks
    (o progress, x failure, median with 90% interval, at their batch's height) and the run's
    own clocks (vertical lines). False when the run logged no batch."""
    if not traj.samples:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 5), dpi=100)
    ax.plot(traj.samples, traj.batch, drawstyle="steps-pre", color="#333333", lw=1.6,
            label=f"run {traj.run_id}: batch")
    for mode, marker, colour in (("progress", "o", "#555555"), ("guard", "s", FAILURE_COLOUR)):
        pts = [(d.samples, d.batch) for d in traj.decisions if d.mode == mode]
        if pts:
            ax.scatter(*zip(*pts, strict=True), marker=marker, s=22, color=colour, zorder=3,
                       label=f"decision ({mode})")
    est = [(d.samples, d.local_b_crit) for d in traj.decisions if d.local_b_crit]
    if est:
        ax.scatter(*zip(*est, strict=True), marker="^", s=26, color=PROGRESS_COLOUR, zorder=3,
                   label="local B_crit at the decision")
    for clock, marker, colour in (("progress", "o", PROGRESS_COLOUR),
                                  ("failure", "x", FAILURE_COLOUR)):
        for b in a.batches:
            g = getattr(b, clock)
            if g.median is None:
                continue
            lo = g.low if g.low is not None else g.median
            hi = g.high if g.high is not None else g.median
            ax.errorbar([g.median], [b.batch_samples], xerr=[[g.median - lo], [hi - g.median]],
                        fmt=marker, color=colour, alpha=0.6, capsize=3)
        mine = (clocks.get(clock) or {}).get("samples")
        if mine is not None:
            ax.axvline(mine, color=colour, ls="-" if clock == "progress" else ":",
                       label=f"run's {clock} clock ({mine:,.0f})")
    ax.errorbar([], [], fmt="o", color=PROGRESS_COLOUR, alpha=0.6,
                label="sweep: progress clock per batch")
    ax.errorbar([], [], fmt="x", color=FAILURE_COLOUR, alpha=0.6,
                label="sweep: failure clock per batch")
    ax.set(xlabel="samples (completions)", ylabel="batch (samples)", title=title)
    ax.set_yscale("log", base=2)
    from matplotlib.ticker import NullFormatter

    ticks = sorted(set(traj.batch) | {b.batch_samples for b in a.batches})
    ax.set_yticks(ticks, [f"{b:g}" for b in ticks])
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="best")
    _save(fig, path, "--out")
    return True
