"""The HTML report of one sweep: one self-contained page with its PNGs beside it.

No server, no CDN, no script: inline CSS, `<img src="NAME.png">` relative to the page, and every
string that came from the store (run names are file names when runs were ingested) HTML-escaped.
It draws a `gather.report.ReportData` (the runs, the analysis and schedule, the curves) and
never reads the store. When the analysis cannot answer (one batch size, nothing crossed yet) the
page says why and still shows the runs and their curves.
"""

from __future__ import annotations

import html
import json
from datetime import datetime, timezone
from pathlib import Path

from twoclocks_cli.clocks.result import RunRow
from twoclocks_cli.clocks.stats import Aggregate
from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.core.numbers import num
from twoclocks_cli.gather.report import ReportData

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


def _e(v) -> str:
    return html.escape(num(v) if not isinstance(v, str) else v)


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


def _clock_text(agg: Aggregate) -> str:
    """'15,104 [7,016, 23,193]', '≥ 32,768 (censored)' or '—' for one clock at one batch."""
    if agg.median is not None:
        text = num(agg.median)
        if agg.low is not None or agg.high is not None:
            hi = num(agg.high) if agg.high is not None else "censored"
            text += f" [{num(agg.low)}, {hi}]"
        return text
    if agg.lower_bound is not None:
        return f"≥ {num(agg.lower_bound)} (censored)"
    return "—"


def _run_clock(row: RunRow | None, clock: str) -> str:
    """One run's clock: its samples (and rule), or '≥ N (censored)' as in the batch table."""
    c = getattr(row, clock) if row else None
    if c is None:
        return "—"
    if c.samples is not None:
        return num(c.samples) + (f" ({c.rule})" if clock == "failure" and c.rule else "")
    if c.censored_at is not None:
        return f"≥ {num(c.censored_at)} (censored)"
    return "—"


def _summary(data: ReportData) -> str:
    a = data.analysis
    if a is None:
        return f'<p class="warn">No analysis: {html.escape(data.analysis_error or "")}</p>'
    crit, inv = a.critical, a.invariance
    mc, ns = crit.mccandlish, crit.noise_scale
    rec = crit.recommended
    theory_note = crit.theory.note if crit.theory is not None else None
    cards = [
        ("progress metric", f"{a.metric} → {num(a.target.value)}", f"target {a.target.spec}"),
        ("B_crit (recommended)", rec.text(), f"{rec.source or ''}: {rec.why}"),
        ("B_crit (linear fit)", mc.text(), mc.note),
        ("B_simple (noise)", num(ns.value), ns.note),
        ("B_crit (theory)", num(crit.theory_b_crit), theory_note or "sim sweeps only"),
        ("failure-clock slope", num(inv.slope),
         f"[{num(inv.low)}, {num(inv.high)}] {inv.verdict}"),
    ]
    out = ['<div class="cards">']
    for title, big, small in cards:
        out.append(f'<div class="card">{html.escape(title)}<b>{html.escape(big)}</b>'
                   f"<small>{html.escape(str(small))}</small></div>")
    out.append("</div>")
    return "".join(out)


SETTING_KEYS = ("model", "dataset", "eval_dataset", "eval_size", "reward", "max_new_tokens")
TINY_EVAL = 200  # held-out problems below which one eval's binomial SE exceeds ~0.035


def run_setting(run) -> dict[str, str]:
    """What a run trained on, in words: model, data, eval set, reward (defaults filled in from the
    trainer's config; ingested and simulated runs say where they came from)."""
    cfg = run.config or {}
    if run.backend == "sim":
        return {"model": "the theory model (sim backend)", "dataset": "-", "reward": "-",
                "eval_size": str((cfg.get("sim") or {}).get("eval_samples", "default"))}
    if isinstance(cfg.get("ingest"), dict):
        ing = cfg["ingest"]
        return {"model": f"imported {ing.get('format')} log", "dataset": str(ing.get("path")),
                "reward": "as logged", "eval_size": "as logged"}
    from trainer.config import TrainConfig

    fields = TrainConfig.model_fields
    out = {}
    for key in SETTING_KEYS:
        value = cfg.get(key, fields[key].default if key in fields else None)
        if value is not None:
            out[key] = str(value)
    return out


def _setting_html(data: ReportData) -> str:
    """The distinct settings across runs (one row per key), and a warning on a tiny eval set."""
    values: dict[str, list[str]] = {}
    for run in data.runs:
        for k, v in run_setting(run).items():
            values.setdefault(k, [])
            if v not in values[k]:
                values[k].append(v)
    if not values:
        return "<p>—</p>"
    rows = [[k, ", ".join(v)] for k, v in values.items()]
    out = _table(["setting", "value (every distinct one across runs)"], rows, left=2)
    sizes = [int(v) for v in values.get("eval_size", []) if v.isdigit()]
    if sizes and min(sizes) < TINY_EVAL:
        se = 0.5 / min(sizes) ** 0.5
        out += (f'<p class="warn">warning: an eval set of {min(sizes)} problems: one evaluation\'s '
                f"standard error is up to {se:.3f}; gains smaller than ~3x that are noise "
                "(a larger eval_size makes the clocks readable)</p>")
    return out


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
    a = data.analysis
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
    for w in a.warnings if a else []:
        out.append(f'<p class="warn">warning: {html.escape(w)}</p>')
    out.append("<h2>Plots</h2>")
    titles = {"curves": "Progress metric by run", "clocks": "Both clocks by batch size",
              "side": "Other logged metrics"}
    for name, file in images.items():
        if name not in titles:
            continue  # a run's trajectory: in its own section
        out.append(f"<h3>{titles[name]}</h3><img src='{html.escape(file)}' "
                   f"alt='{html.escape(titles[name])}'>")
    if not images:
        out.append("<p class='warn'>No metric has been logged yet: nothing to plot.</p>")
    out += ["<h2>What was trained</h2>", _setting_html(data)]
    out += _clock_tables(data)
    out.append("<h2>Fits</h2>")
    out.append(f"<pre>{html.escape(json.dumps(a.critical.to_json(), indent=2))}</pre>"
               if a else f"<p class='warn'>{html.escape(data.analysis_error or 'no fit')}</p>")
    if a:
        out.append("<p>Failure-clock invariance (slope of log N_fail on log B):</p><pre>"
                   + html.escape(json.dumps(a.invariance.to_json(), indent=2)) + "</pre>")
    if a and a.clipping:
        out.append("<p>Clipping:</p>" + _table(
            ["clip low", "clip high", "batch", "runs", "progress median", "failure median"],
            [[c.clip_low, c.clip_high, c.batch_samples, c.n_runs,
              c.progress_median, c.failure_median] for c in a.clipping]))
    out.append("<h2>Schedule</h2>")
    out.append(_schedule_html(data))
    if data.compared or data.compared_error:
        out.append("<h2>Adaptive and scheduled runs</h2>")
        out += _compared_html(data, images)
    out.append("<h2>Options used</h2>")
    out.append(f"<pre>{html.escape(json.dumps(data.options, indent=2))}</pre>")
    out.append("</body></html>")
    return "\n".join(out)


def _compared_html(data: ReportData, images: dict[str, str]) -> list[str]:
    """Per --run: the verdict, its clocks beside the constants', its decisions, its figure."""
    if data.compared_error:
        return [f"<p class='warn'>{html.escape(data.compared_error)}</p>"]
    out = []
    for c in data.compared:
        run = c["schedule"]
        rid = run["run_id"]
        out.append(f"<h3>Run {rid} ({_e(run['name'])})</h3>")
        out += [f"<p>{html.escape(line)}</p>" for line in c["verdict"]]
        rows = [[f"constant {k['batch_samples']}", _clock_text_json(k["progress"]),
                 _clock_text_json(k["failure"])] for k in c["constant"]]
        rows.append([f"run {rid}", _one_clock(run["progress"]), _one_clock(run["failure"])])
        head = ["", "progress clock", "failure clock"]
        if c.get("time"):  # the same rows in hours, at the analysis's throughput
            timed = {b["batch_samples"]: b for b in c["time"]["batches"]}
            spent = [timed.get(k["batch_samples"]) for k in c["constant"]] + [c["time"]["schedule"]]
            for row, t in zip(rows, spent, strict=True):
                row += [_spent_hours(t and t["progress"]), _spent_hours(t and t["failure"])]
            head += ["time to target", "time to failure"]
        out.append(_table(head, rows, left=1))
        traj = data.trajectories[rid]
        if traj.decisions:
            out.append(_table(
                ["decision", "samples", "batch", "next batch", "mode", "local B_crit", "read from"],
                [[i + 1, d.samples, d.batch, d.next_batch, d.mode, d.local_b_crit, d.how]
                 for i, d in enumerate(traj.decisions)], left=2))
        file = images.get(f"run-{rid}")
        if file:
            out.append(f"<img src='{html.escape(file)}' alt='run {rid}: batch over samples'>")
    return out


def _spent_hours(sp: dict | None) -> str:
    """A clock of compare's JSON in hours: median [interval], or ≥ its bound when censored."""
    if sp is None:
        return "—"
    if sp["seconds"] is None and sp["lower_bound"] is not None:
        return f"≥ {sp['lower_bound'] / 3600:.3g} h (censored)"
    low = None if sp["low"] == sp["high"] else sp["low"]  # an exact throughput: no interval
    return _hours(sp["seconds"], low, sp["high"])


def _clock_text_json(agg: dict) -> str:
    """A per-batch clock of compare's JSON as the clock table writes it."""
    from dataclasses import fields

    from twoclocks_cli.clocks.stats import Aggregate

    return _clock_text(Aggregate(**{f.name: agg.get(f.name) for f in fields(Aggregate)}))


def _one_clock(clock: dict) -> str:
    """One run's clock of compare's JSON: samples, or censored at."""
    if clock.get("samples") is not None:
        return num(clock["samples"])
    at = clock.get("censored_at")
    return f"≥ {num(at)} (censored)" if at is not None else "unknown"


def _hours(seconds, low=None, high=None) -> str:
    """Seconds as hours, with the interval when there is one."""
    if seconds is None:
        return "—"
    text = f"{seconds / 3600:.3g} h"
    if low is None:
        return text
    return f"{text} [{low / 3600:.3g}–{'censored' if high is None else f'{high / 3600:.3g}'}]"


def _rate(tp) -> str:
    """Seconds per sample with its interval (none for a cost file's exact figure)."""
    if tp.low is None or tp.high is None or tp.low == tp.high:
        return num(tp.seconds_per_sample)
    return f"{num(tp.seconds_per_sample)} [{num(tp.low)}–{num(tp.high)}]"


def _money(sp) -> str:
    """A clock in money with its interval, when it has one."""
    if sp.cost is None or sp.cost_low is None or sp.cost_low == sp.cost_high:
        return num(sp.cost)
    high = "censored" if sp.cost_high is None else num(sp.cost_high)
    return f"{num(sp.cost)} [{num(sp.cost_low)}–{high}]"


def _time_table(a) -> list[str]:
    """Both clocks per batch in hours (and money with a price), and B_crit in time."""
    tc = a.time
    priced = tc.price_per_hour is not None
    head = ["batch (samples)", "seconds per sample", "time to target", "time to failure"]
    head += ["cost to target", "cost to failure"] if priced else []
    rows = []
    for b in tc.batches:
        row = [num(b.batch_samples), _rate(b.throughput),
               _hours(b.progress.seconds, b.progress.low, b.progress.high),
               _hours(b.failure.seconds, b.failure.low, b.failure.high)
               if b.failure.seconds is not None or b.failure.lower_bound is None
               else f"≥ {b.failure.lower_bound / 3600:.3g} h (censored)"]
        row += [_money(b.progress), _money(b.failure)] if priced else []
        rows.append(row)
    where = "none" if tc.b_crit_time is None else (
        ("≥ " if tc.b_crit_time_bound == "lower" else "") + num(tc.b_crit_time))
    return [f"<h2>Clocks in time ({html.escape(tc.source)} throughput"
            + (f", {tc.price_per_hour:g} per hour" if priced else "") + ")</h2>",
            _table(head, rows),
            f"<p>B_crit in time: {where} — {html.escape(tc.note)}</p>"]


def _clock_tables(data: ReportData) -> list[str]:
    """The per-batch clock table and the per-run table (one notation for censored values)."""
    a = data.analysis
    out = ["<h2>Clock table</h2>"]
    if a and a.batches:
        out.append(_table(
            ["batch (samples)", "prompts", "lr", "runs", "progress clock [90%]",
             "failure clock [90%]"],
            [[b.batch_samples, ", ".join(map(str, b.batch_prompts)),
              ", ".join(num(x) for x in b.lr), b.n_runs,
              _clock_text(b.progress), _clock_text(b.failure)] for b in a.batches]))
    else:
        out.append(f"<p class='warn'>{html.escape(data.analysis_error or 'no batches')}</p>")
    if a and a.time is not None:
        out += _time_table(a)
    out.append("<h2>Runs</h2>")
    rows = {r.run_id: r for r in a.runs} if a else {}
    out.append(_table(
        ["id", "name", "backend", "status", "batch", "prompts×group", "lr", "seed",
         "progress clock", "failure clock"],
        [[r.id, r.name, r.backend, r.status, r.batch_samples,
          f"{r.batch_prompts or '?'}×{r.group_size or '?'}", r.lr, r.seed,
          _run_clock(rows.get(r.id), "progress"), _run_clock(rows.get(r.id), "failure")]
         for r in data.runs], left=4))
    return out


def _draw_all(data: ReportData, out: Path) -> dict[str, str]:
    """The report's PNGs (render.plot), {section: file name}; stale ones of an earlier report
    are removed so the page never shows a plot of other data."""
    from twoclocks_cli.render import plot

    batch_of = {r.id: r.batch_samples for r in data.runs}
    side = {k: v for k, v in data.curves.items() if k != data.metric}
    draws = {
        "curves": lambda f: plot.plot_curves(
            f, data.curves.get(data.metric) or {}, batch_of, data.metric, data.analysis,
            f"{data.sweep}: {data.metric} (o = progress clock, dotted = failure clock)"),
        "clocks": lambda f: plot.plot_clocks(
            f, data.analysis, f"{data.sweep}: progress and failure clocks by batch size"),
        "side": lambda f: plot.plot_side(f, side, batch_of),
    }
    for rid, traj in data.trajectories.items():
        clocks = next(c["schedule"] for c in data.compared if c["schedule"]["run_id"] == rid)
        draws[f"run-{rid}"] = (lambda f, t=traj, c=clocks: plot.plot_trajectory(
            f, t, data.analysis, c, f"run {t.run_id}: batch over samples against "
            f"{data.sweep}'s clocks"))
    for stale in out.glob("run-*.png"):
        if stale.stem not in draws:
            stale.unlink()
    images = {}
    for name, draw in draws.items():
        file = out / f"{name}.png"
        if draw(file):
            images[name] = file.name
        elif file.exists():
            file.unlink()
    return images


def write_report(data: ReportData, out: Path) -> Path:
    """Draw and write `index.html`, the PNGs and `analysis.json` into `out` (made here, in an
    existing parent: a typo must not grow a tree)."""
    out = Path(out)
    try:
        out.mkdir(exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot create the folder ({exc.strerror})") from None
    images = _draw_all(data, out)
    (out / "analysis.json").write_text(json.dumps(
        {"analysis": data.analysis.to_json() if data.analysis else None,
         "analysis_error": data.analysis_error,
         "schedule": data.schedule, "schedule_error": data.schedule_error,
         "runs_compared": data.compared, "runs_compared_error": data.compared_error,
         "options": data.options}, indent=2, default=str))
    page = out / "index.html"
    page.write_text(render_html(data, images), encoding="utf-8")
    return page
