"""The HTML report of one sweep: one self-contained page with its PNGs beside it.

No server, no CDN, no script: inline CSS, `<img src="NAME.png">` relative to the page, and every
string that came from the store (run names are file names when runs were ingested) HTML-escaped.
The numbers come from the clocks library (`analyze_sweep`, `make_schedule`); the curves from
`store.load_metric`. When the analysis cannot answer (one batch size, nothing crossed yet) the page
says why and still shows the runs and their curves.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from twoclocks_cli.errors import AnalysisError, TwoclocksError

PROGRESS_KEYS = ("eval_accuracy", "reward_mean", "accuracy")
SIDE_KEYS = ("reward_mean", "accuracy", "entropy", "kl_init", "drift_abs", "resp_len_mean",
             "clip_frac", "grad_norm", "approx_kl", "truncated_frac")

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:24px auto;
max-width:1100px;color:#1d2433;background:#fff;line-height:1.4}
h1{font-size:1.6em;margin-bottom:0}h2{border-bottom:2px solid #3b6fb6;padding-bottom:3px;
margin-top:1.6em}.sub{color:#5b6475;margin-top:2px}
table{border-collapse:collapse;margin:8px 0;font-size:.92em}
th,td{border:1px solid #c9d1de;padding:4px 8px;text-align:right}
th{background:#e8eef8}td.l,th.l{text-align:left}tr:nth-child(even) td{background:#f6f8fc}
img{max-width:100%;border:1px solid #c9d1de;margin:6px 0}
pre{background:#f3f5f9;border:1px solid #c9d1de;padding:8px;overflow-x:auto;font-size:.85em}
.warn{color:#8a4b00}.cards{display:flex;gap:12px;flex-wrap:wrap}
.card{border:1px solid #c9d1de;border-left:6px solid #3b6fb6;padding:8px 12px;min-width:200px}
.card b{display:block;font-size:1.3em}
"""


@dataclass
class ReportOptions:
    """What `twoclocks report` was asked for (echoed on the page)."""

    sweep: str
    out: Path
    safety: float = 0.8  # schedule: switch at this fraction of the small batch's failure clock
    budget: float | None = None  # schedule: total samples (None: the longest run's)
    # AnalysisOptions fields for a fresh analysis ({} = defaults); None reuses the sweep's latest
    # stored analysis while it is current (see clocks.saved.analysis_for)
    analysis: dict | None = None


@dataclass
class ReportData:
    """Everything the page shows, gathered before anything is drawn."""

    sweep: str
    runs: list
    analysis: dict | None
    analysis_error: str | None
    schedule: dict | None
    schedule_error: str | None
    schedule_toml: str | None
    metric: str | None
    curves: dict  # key -> {run_id: Series}
    options: dict


def _fmt(v, digits: int = 4) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if v != 0 and (abs(v) >= 1e6 or abs(v) < 1e-3):
            return f"{v:.{digits - 1}e}"
        if abs(v) >= 100:
            return f"{v:,.0f}"
        return f"{v:.{digits}g}"
    return str(v)


def _e(v) -> str:
    return html.escape(_fmt(v) if not isinstance(v, str) else v)


def gather(store, opts: ReportOptions) -> ReportData:
    """Runs, the analysis and the schedule (or why not), and the curves to draw."""
    store.get_sweep(opts.sweep)  # NotFoundError naming the sweeps that exist
    runs = store.list_runs(opts.sweep)
    if not runs:
        raise AnalysisError(f"sweep {opts.sweep!r} has no runs yet: nothing to report")
    from twoclocks_cli.clocks.options import AnalysisOptions
    from twoclocks_cli.clocks.saved import analysis_for

    analysis = schedule = toml = None
    a_err = s_err = source = None
    asked = AnalysisOptions(**(opts.analysis or {}))  # ConfigError on a bad value: stop here
    try:
        analysis, source = analysis_for(store, opts.sweep, opts.analysis)
    except AnalysisError as exc:  # the data cannot answer yet: the page says why
        a_err = str(exc)
    used_options = (analysis or {}).get("options") or asked.to_json()
    if analysis is not None:
        try:
            from twoclocks_cli.clocks.schedule import make_schedule, to_toml

            schedule = make_schedule(analysis, budget=opts.budget, safety=opts.safety)
            toml = to_toml(schedule)
        except TwoclocksError as exc:
            s_err = str(exc)
    else:
        s_err = "no analysis, so no schedule"
    ids = [r.id for r in runs]
    keys = set(store.metric_keys(ids))
    metric = (analysis or {}).get("metric") or asked.metric or next(
        (k for k in PROGRESS_KEYS if k in keys), None)
    wanted = [metric] if metric in keys else []
    wanted += [k for k in SIDE_KEYS if k in keys and k != metric][:6]
    curves = {k: store.load_metric(ids, k) for k in wanted}
    options = {"report": {"sweep": opts.sweep, "out": str(opts.out), "safety": opts.safety,
                          "budget": opts.budget},
               "analysis": used_options,
               "analysis_source": {"id": (analysis or {}).get("analysis_id"), "how": source}}
    return ReportData(opts.sweep, runs, analysis, a_err, schedule, s_err, toml, metric, curves,
                      options)


# -- plots ---------------------------------------------------------------------------------


def _batch_colours(runs):
    import matplotlib as mpl
    import numpy as np

    bs = sorted({r.batch_samples for r in runs if r.batch_samples})
    cmap = mpl.colormaps["viridis"]
    if len(bs) <= 1:
        return {b: cmap(0.35) for b in bs}
    lo, hi = np.log(bs[0]), np.log(bs[-1])
    return {b: cmap(0.9 * (np.log(b) - lo) / (hi - lo)) for b in bs}


def plot_curves(data: ReportData, path: Path) -> bool:
    """The progress metric against samples, one line per run coloured by batch size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = data.curves.get(data.metric) or {}
    if not series:
        return False
    colours = _batch_colours(data.runs)
    rows = {r["run_id"]: r for r in (data.analysis or {}).get("runs", [])}
    fig, ax = plt.subplots(figsize=(9, 5), dpi=100)
    seen = set()
    for run in data.runs:
        s = series.get(run.id)
        if s is None:
            continue
        c = colours.get(run.batch_samples, "#555555")
        label = f"B={run.batch_samples}" if run.batch_samples not in seen else None
        seen.add(run.batch_samples)
        ax.plot(s.samples, s.values, color=c, lw=1.6, alpha=0.9, label=label)
        row = rows.get(run.id) or {}
        for clock, marker in (("progress", "o"), ("failure", "X")):
            x = (row.get(clock) or {}).get("samples")
            if x is not None and len(s.samples):
                import numpy as np

                y = float(np.interp(x, s.samples, s.values))
                ax.plot([x], [y], marker=marker, ms=9, color=c, mec="black", ls="none")
    target = ((data.analysis or {}).get("target") or {}).get("value")
    if target is not None:
        ax.axhline(target, color="#c0392b", ls="--", lw=1.2, label=f"target {target:.3g}")
    ax.set_xlabel("samples (completions)")
    ax.set_ylabel(data.metric)
    ax.set_title(f"{data.sweep}: {data.metric} (o = progress clock, X = failure clock)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def plot_clocks(data: ReportData, path: Path) -> bool:
    """Both clocks per batch size (median and interval; censored as lower bounds) and the fit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    batches = (data.analysis or {}).get("batches") or []
    if not batches:
        return False
    fig, ax = plt.subplots(figsize=(9, 5), dpi=100)
    for clock, colour, dx in (("progress", "#2e86c1", 0.97), ("failure", "#c0392b", 1.03)):
        for b in batches:
            agg = b.get(clock) or {}
            x = b["batch_samples"] * dx
            if agg.get("median") is not None:
                lo, hi = agg.get("low"), agg.get("high")
                yerr = None
                if lo is not None and hi is not None:
                    yerr = [[agg["median"] - lo], [hi - agg["median"]]]
                ax.errorbar([x], [agg["median"]], yerr=yerr, fmt="o", color=colour, ms=8,
                            capsize=4)
            elif agg.get("lower_bound") is not None:
                ax.plot([x], [agg["lower_bound"]], marker="^", ms=10, mfc="none", color=colour)
        ax.plot([], [], "o", color=colour, label=f"{clock} clock (median, 90% interval)")
    ax.plot([], [], "^", mfc="none", color="#555", label="censored: at least this")
    fit = ((data.analysis or {}).get("critical_batch") or {}).get("mccandlish") or {}
    if fit.get("e_min") is not None and fit.get("s_min") is not None:
        bs = np.geomspace(min(b["batch_samples"] for b in batches),
                          max(b["batch_samples"] for b in batches), 50)
        ax.plot(bs, fit["e_min"] + fit["s_min"] * bs, color="#2e86c1", lw=1,
                label="fit E(B) = E_min + S_min·B")
    if fit.get("b_crit") is not None:
        ax.axvline(fit["b_crit"], color="#7d3c98", ls=":", label=f"B_crit {fit['b_crit']:.3g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("batch (samples per step)")
    ax.set_ylabel("samples")
    ax.set_title(f"{data.sweep}: progress and failure clocks by batch size")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def plot_side(data: ReportData, path: Path) -> bool:
    """Small multiples of the other logged metrics (entropy, KL, drift, length...)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in data.curves if k != data.metric and data.curves[k]]
    if not keys:
        return False
    colours = _batch_colours(data.runs)
    cols = min(3, len(keys))
    rows_n = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(4 * cols, 3 * rows_n), dpi=100,
                             squeeze=False)
    for ax, key in zip(axes.flat, keys, strict=False):
        for run in data.runs:
            s = data.curves[key].get(run.id)
            if s is not None:
                ax.plot(s.samples, s.values, lw=1.2,
                        color=colours.get(run.batch_samples, "#555555"))
        ax.set_title(key, fontsize=10)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.supxlabel("samples (completions)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


# -- the page ------------------------------------------------------------------------------


def _table(headers: list[str], rows: list[list], left: int = 0) -> str:
    """An HTML table; the first `left` columns are left-aligned text."""
    cls = [' class="l"' if i < left else "" for i in range(len(headers))]
    head = "".join(f"<th{c}>{html.escape(h)}</th>" for h, c in zip(headers, cls, strict=True))
    body = "".join(
        "<tr>" + "".join(f"<td{c}>{_e(v)}</td>" for v, c in zip(r, cls, strict=True)) + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _clock_text(agg: dict | None) -> str:
    agg = agg or {}
    if agg.get("median") is not None:
        text = _fmt(agg["median"])
        if agg.get("low") is not None or agg.get("high") is not None:
            hi = _fmt(agg["high"]) if agg.get("high") is not None else "censored"
            text += f" [{_fmt(agg.get('low'))}, {hi}]"
        return text
    if agg.get("lower_bound") is not None:
        return f"≥ {_fmt(agg['lower_bound'])} (censored)"
    return "—"


def _run_clock(row: dict, clock: str) -> str:
    c = row.get(clock) or {}
    if c.get("samples") is not None:
        rule = f" ({c['rule']})" if clock == "failure" and c.get("rule") else ""
        return _fmt(c["samples"]) + rule
    if c.get("censored_at") is not None:
        return f"> {_fmt(c['censored_at'])} (censored)"
    return "—"


def _bound(est: dict) -> str:
    """'>= 512', '<= 8' or the value of a B_crit estimate."""
    prefix = {"lower": ">= ", "upper": "<= "}.get(est.get("bound") or "", "")
    return prefix + _fmt(est.get("b_crit"))


def _summary(data: ReportData) -> str:
    a = data.analysis
    if a is None:
        return f'<p class="warn">No analysis: {html.escape(data.analysis_error or "")}</p>'
    crit = a.get("critical_batch") or {}
    mc, ns, th = (crit.get("mccandlish") or {}), (crit.get("noise_scale") or {}), crit.get("theory")
    rec = crit.get("recommended") or {}
    inv = a.get("failure_invariance") or {}
    target = a.get("target") or {}
    cards = [
        ("progress metric", f"{a.get('metric')} → {_fmt(target.get('value'))}",
         f"target {target.get('spec')}"),
        ("B_crit (recommended)", _bound(rec),
         f"[{_fmt(rec.get('low'))}, {_fmt(rec.get('high'))}] {rec.get('source') or ''}: "
         f"{rec.get('why') or ''}"),
        ("B_crit (linear fit)", _bound(mc),
         f"[{_fmt(mc.get('low'))}, {_fmt(mc.get('high'))}] {mc.get('note') or ''}"),
        ("B_simple (noise)", _fmt(ns.get("b_simple")), ns.get("note") or ""),
        ("B_crit (theory)", _fmt((th or {}).get("b_crit")),
         (th or {}).get("note") or "sim sweeps only"),
        ("failure-clock slope", _fmt(inv.get("slope")),
         f"[{_fmt(inv.get('low'))}, {_fmt(inv.get('high'))}] {inv.get('verdict') or ''}"),
    ]
    out = ['<div class="cards">']
    for title, big, small in cards:
        out.append(f'<div class="card">{html.escape(title)}<b>{html.escape(big)}</b>'
                   f"<small>{html.escape(str(small))}</small></div>")
    out.append("</div>")
    return "".join(out)


def _schedule_html(data: ReportData) -> str:
    s = data.schedule
    if s is None:
        return f'<p class="warn">No schedule: {html.escape(data.schedule_error or "")}</p>'
    phases = [[i + 1, p.get("until_samples"), p.get("prompts_per_batch"), p.get("lr"),
               p.get("clip_eps_low"), p.get("clip_eps_high")] for i, p in enumerate(s["phases"])]
    pred = s.get("predicted") or {}
    parts = [
        _table(["phase", "until samples", "prompts/batch", "lr", "clip low", "clip high"], phases),
        f"<p>B_small = {_e(s.get('b_small'))}, B_large = {_e(s.get('b_large'))}, switch at "
        f"{_e(s.get('n_switch'))} samples; predicted progress clock "
        f"{_e(pred.get('progress_samples'))}, failure clock {_e(pred.get('failure_samples'))}."
        "</p>",
        "<ul>" + "".join(f"<li>{html.escape(r)}</li>" for r in s.get("rationale", [])) + "</ul>",
        f"<pre>{html.escape(data.schedule_toml or '')}</pre>",
    ]
    return "".join(parts)


def render_html(data: ReportData, images: dict[str, str]) -> str:
    """The page (a string); `images` maps a section to the PNG file name beside it."""
    a = data.analysis or {}
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    from twoclocks_cli import __version__

    out = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>twoclocks report: {html.escape(data.sweep)}</title><style>{CSS}</style>",
        "</head><body>",
        f"<h1>Sweep {html.escape(data.sweep)}</h1>",
        f"<p class='sub'>{len(data.runs)} runs · twoclocks {html.escape(__version__)} · "
        f"generated {now}. Every clock is counted in samples (sampled completions).</p>",
        "<h2>Summary</h2>", _summary(data),
    ]
    for w in a.get("warnings") or []:
        out.append(f'<p class="warn">warning: {html.escape(w)}</p>')
    out.append("<h2>Plots</h2>")
    titles = {"curves": "Progress metric by run", "clocks": "Both clocks by batch size",
              "side": "Other logged metrics"}
    for name, file in images.items():
        out.append(f"<h3>{titles[name]}</h3><img src='{html.escape(file)}' "
                   f"alt='{html.escape(titles[name])}'>")
    if not images:
        out.append("<p class='warn'>No metric has been logged yet: nothing to plot.</p>")
    out.append("<h2>Clock table</h2>")
    batches = a.get("batches") or []
    if batches:
        out.append(_table(
            ["batch (samples)", "prompts", "lr", "runs", "progress clock [90%]",
             "failure clock [90%]"],
            [[b["batch_samples"], ", ".join(map(str, b.get("batch_prompts") or [])),
              ", ".join(_fmt(x) for x in b.get("lr") or []), b.get("n_runs"),
              _clock_text(b.get("progress")), _clock_text(b.get("failure"))] for b in batches]))
    else:
        out.append(f"<p class='warn'>{html.escape(data.analysis_error or 'no batches')}</p>")
    out.append("<h2>Runs</h2>")
    rows = {r["run_id"]: r for r in a.get("runs") or []}
    out.append(_table(
        ["id", "name", "backend", "status", "batch", "prompts×group", "lr", "seed",
         "progress clock", "failure clock"],
        [[r.id, r.name, r.backend, r.status, r.batch_samples,
          f"{r.batch_prompts or '?'}×{r.group_size or '?'}", r.lr, r.seed,
          _run_clock(rows.get(r.id, {}), "progress"), _run_clock(rows.get(r.id, {}), "failure")]
         for r in data.runs], left=4))
    out.append("<h2>Fits</h2>")
    crit = a.get("critical_batch")
    out.append(f"<pre>{html.escape(json.dumps(crit, indent=2))}</pre>" if crit else
               f"<p class='warn'>{html.escape(data.analysis_error or 'no fit')}</p>")
    if a.get("failure_invariance"):
        out.append("<p>Failure-clock invariance (slope of log N_fail on log B):</p><pre>"
                   + html.escape(json.dumps(a["failure_invariance"], indent=2)) + "</pre>")
    if a.get("clipping"):
        out.append("<p>Clipping:</p>" + _table(
            ["clip low", "clip high", "batch", "runs", "progress median", "failure median"],
            [[c["clip_low"], c["clip_high"], c["batch_samples"], c["n_runs"],
              c["progress_median"], c["failure_median"]] for c in a["clipping"]]))
    out.append("<h2>Schedule</h2>")
    out.append(_schedule_html(data))
    out.append("<h2>Options used</h2>")
    out.append(f"<pre>{html.escape(json.dumps(data.options, indent=2))}</pre>")
    out.append("</body></html>")
    return "\n".join(out)


def write_report(store, opts: ReportOptions) -> Path:
    """Gather, draw and write `index.html`, the PNGs and `analysis.json` into `opts.out`."""
    out = Path(opts.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        from twoclocks_cli.errors import ConfigError

        raise ConfigError(f"--out {out}: cannot create the folder ({exc.strerror})") from None
    data = gather(store, opts)
    images = {}
    for name, draw in (("curves", plot_curves), ("clocks", plot_clocks), ("side", plot_side)):
        file = f"{name}.png"
        if draw(data, out / file):
            images[name] = file
        elif (out / file).exists():
            (out / file).unlink()  # a stale plot of an earlier report must not be shown
    (out / "analysis.json").write_text(json.dumps(
        {"analysis": data.analysis, "analysis_error": data.analysis_error,
         "schedule": data.schedule, "schedule_error": data.schedule_error,
         "options": data.options}, indent=2, default=str))
    page = out / "index.html"
    page.write_text(render_html(data, images), encoding="utf-8")
    return page
