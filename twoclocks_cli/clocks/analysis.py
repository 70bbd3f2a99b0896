"""`analyze_sweep`: stored curves -> both clocks per run, per batch size, B_crit three ways.

Input arrives from `store.load_metric` as numpy arrays; no SQL here. The result is a plain,
JSON-ready dict (with every option used) wrapped in `AnalysisResult`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from twoclocks_cli.clocks import collapse
from twoclocks_cli.clocks.curves import clean, first_crossing, smooth
from twoclocks_cli.clocks.options import AnalysisOptions, parse_target
from twoclocks_cli.clocks.stats import aggregate, mccandlish, noise_scale, slope_test
from twoclocks_cli.errors import AnalysisError, NotFoundError

GRAD_KEYS = ("grad_sq_micro", "grad_sq_full", "grad_micro_size", "grad_full_size")
TIME_KEYS = ("time_gen_s", "time_reward_s", "time_update_s")  # summed: wall-clock per step


@dataclass
class AnalysisResult:
    """The complete analysis of one sweep (`data` is the --json document)."""

    data: dict

    def to_json(self) -> dict:
        return self.data

    def dumps(self) -> str:
        return json.dumps(self.data, indent=2, allow_nan=False, default=_jsonable)


def _jsonable(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _clean_json(obj):
    """Replace NaN/inf floats by None, numpy scalars by Python ones (strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): _clean_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean_json(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


def _load(store, run_ids, key):
    return store.load_metric(run_ids, key) if key else {}


def _run_curve(series, opts: AnalysisOptions):
    if series is None:
        return None
    c = clean(series.steps, series.samples, series.values)
    if c.empty:
        return None
    return c, smooth(c.values, opts.smoothing, opts.window, opts.ema_alpha)


def _interp_steps(curve, samples):
    if samples is None:
        return None
    return float(np.interp(samples, curve.samples, curve.steps))


def _seconds_at(times: list, samples):
    """Training seconds spent up to `samples` (cumulated time_* metrics), None if not logged."""
    if samples is None or not times:
        return None
    total = 0.0
    for s in times:
        ok = np.isfinite(s.values)
        if ok.any():
            total += float(np.interp(samples, s.samples[ok], np.cumsum(s.values[ok])))
    return total


def analyze_sweep(store, sweep: str, options: AnalysisOptions | None = None) -> AnalysisResult:
    """Analyse every run of `sweep` (partial runs included and marked)."""
    opts = options or AnalysisOptions()
    store.get_sweep(sweep)  # NotFoundError listing the sweeps
    runs = store.list_runs(sweep)
    if not runs:
        raise AnalysisError(f"sweep {sweep!r} has no runs yet: nothing to analyse")
    ids = [r.id for r in runs]
    metric = opts.metric
    curves = {}
    if metric is None:
        for candidate in ("eval_accuracy", "reward_mean"):
            curves = _load(store, ids, candidate)
            if curves:
                metric = candidate
                break
    else:
        curves = _load(store, ids, metric)
    if not curves:
        keys = store.metric_keys(ids)
        wanted = metric or "eval_accuracy or reward_mean"
        known = ", ".join(keys) if keys else "none: no run has logged anything yet"
        raise NotFoundError(
            f"metric {wanted!r} not logged by any run of {sweep!r}; metrics: {known}"
        )
    warnings: list[str] = []
    prepared = {rid: _run_curve(curves.get(rid), opts) for rid in ids}
    usable = {rid: p for rid, p in prepared.items() if p is not None}
    if not usable:
        raise AnalysisError(f"metric {metric!r} of sweep {sweep!r} has no finite values")
    nan_runs = [rid for rid in ids if rid in curves and np.isnan(curves[rid].values).any()]
    if nan_runs:
        warnings.append(f"NaN values of {metric} ignored in run(s) {nan_runs}")
    for rid in ids:
        s = curves.get(rid)
        if s is not None and (np.diff(s.steps) <= 0).any():
            warnings.append(f"run {rid}: duplicate or unsorted steps, last value per step kept")
    kind, x = parse_target(opts.target)
    initial = float(np.median([sm[0] for _, sm in usable.values()]))
    best = float(max(sm.max() for _, sm in usable.values()))
    rose = max(float(sm.max() - sm[0]) for _, sm in usable.values())
    tau = x if kind == "abs" else initial + x * (best - initial)
    if kind == "frac" and (best <= initial or rose <= 0):
        # no run ever improved: a relative target is undefined; put it just above the best
        # value, so every progress clock is censored (and say why) instead of "crossing" at 0
        tau = best + 1e-9 * max(1.0, abs(best))
        warnings.append(
            f"{metric} never rose above its initial value in any run: the relative target "
            f"{opts.target} is undefined, every progress clock is censored (the progress metric "
            "must increase; give an absolute --target or another --metric)"
        )
    extra = {
        "drift": _load(store, ids, opts.drift_key) if opts.drift_threshold is not None else {},
        "entropy": _load(store, ids, opts.entropy_key)
        if opts.entropy_low is not None or opts.entropy_high is not None
        else {},
        "length": _load(store, ids, "resp_len_mean") if opts.length_max is not None else {},
        "truncated": _load(store, ids, "truncated_frac") if opts.truncated_max is not None else {},
        "nonfinite": _load(store, ids, "nonfinite"),
    }
    for rule, key, on in (
        ("drift", opts.drift_key, opts.drift_threshold is not None),
        (
            "entropy",
            opts.entropy_key,
            opts.entropy_low is not None or opts.entropy_high is not None,
        ),
        ("length", "resp_len_mean", opts.length_max is not None),
        ("length", "truncated_frac", opts.truncated_max is not None),
    ):
        if on and not extra[rule if key != "truncated_frac" else "truncated"]:
            warnings.append(f"{rule} rule is on but no run logged {key!r}: it cannot fire")
    grads = {k: _load(store, ids, k) for k in GRAD_KEYS}
    extra["times"] = [_load(store, ids, k) for k in TIME_KEYS]
    run_rows = [_analyse_run(r, usable.get(r.id), extra, grads, tau, opts) for r in runs]
    missing = [r.id for r in runs if r.id not in usable]
    if missing:
        warnings.append(f"run(s) {missing} have no finite {metric} values yet: left out")
    partial = [row["run_id"] for row in run_rows if row["partial"]]
    if partial:
        warnings.append(f"run(s) {partial} still in progress: analysed as partial (censored)")
    rng = np.random.default_rng(opts.seed)
    batches = _per_batch(run_rows, rng, opts)
    per_batch_prog = {b["batch_samples"]: b["_prog"] for b in batches}
    fit = mccandlish(per_batch_prog, rng, opts.bootstrap)
    fail_pts = [
        (row["batch_samples"], row["failure"]["samples"])
        for row in run_rows
        if row["analysed"] and row["failure"]["samples"] is not None
    ]
    invariance = (
        slope_test([b for b, _ in fail_pts], [f for _, f in fail_pts])
        if fail_pts
        else {
            "slope": None,
            "low": None,
            "high": None,
            "n": 0,
            "verdict": "no run failed: every failure clock is censored",
        }
    )
    n_cens_fail = sum(1 for row in run_rows if row["analysed"] and row["failure"]["censored"])
    if fail_pts and n_cens_fail:
        invariance["note"] = f"{n_cens_fail} censored run(s) left out of the slope"
    if all(row["progress"]["censored"] for row in run_rows if row["analysed"]):
        warnings.append(f"every run is censored: none reached the target {tau:.4g}")
    data = {
        "sweep": sweep,
        "options": opts.to_json(),
        "metric": metric,
        "target": {"spec": opts.target, "value": tau, "initial": initial, "best": best},
        "units": "samples (one sampled completion); steps, prompts and seconds (cumulated "
        "time_gen_s + time_reward_s + time_update_s, when logged) given beside",
        "runs": run_rows,
        "batches": [{k: v for k, v in b.items() if not k.startswith("_")} for b in batches],
        "critical_batch": {
            "mccandlish": fit,
            "noise_scale": _noise_summary(run_rows),
            "theory": _theory(runs, tau, metric, opts, warnings),
        },
        "failure_invariance": invariance,
        "clipping": _clipping_table(run_rows),
        "warnings": warnings,
    }
    for row in data["runs"]:
        row.pop("analysed", None)
    return AnalysisResult(_clean_json(data))


def _analyse_run(run, prepared, extra, grads, tau, opts) -> dict:
    """Both clocks of one run: crossing or censoring, each collapse rule, the earliest."""
    from twoclocks_cli.store.models import RunStatus

    finished = (
        RunStatus(run.status).finished if run.status in RunStatus._value2member_map_ else True
    )
    row = {
        "run_id": run.id,
        "name": run.name,
        "batch_samples": run.batch_samples,
        "batch_prompts": run.batch_prompts,
        "group_size": run.group_size,
        "lr": run.lr,
        "clip_low": run.clip_low,
        "clip_high": run.clip_high,
        "seed": run.seed,
        "status": run.status,
        "partial": not finished,
        "analysed": prepared is not None,
    }
    if prepared is None:
        row.update(
            points=0,
            last_samples=None,
            progress={"samples": None, "censored": True, "censored_at": None},
            failure={
                "samples": None,
                "rule": None,
                "censored": True,
                "censored_at": None,
                "rules": {},
            },
            noise_scale=None,
        )
        return row
    curve, sm = prepared
    last = float(curve.samples[-1])
    n_prog = first_crossing(curve.samples, sm, tau)
    fired = {}
    series = extra["nonfinite"].get(run.id)
    fired["nonfinite"] = collapse.nonfinite_rule(series.samples, series.values) if series else None
    if opts.drop:
        fired["drop"] = collapse.drop_rule(
            curve.samples, sm, float(sm[0]), opts.drop_rho, opts.drop_delta, opts.drop_k
        )
    if opts.drift_threshold is not None:
        s = extra["drift"].get(run.id)
        fired["drift"] = (
            collapse.above_rule(s.samples, s.values, opts.drift_threshold) if s else None
        )
    if opts.entropy_low is not None or opts.entropy_high is not None:
        s = extra["entropy"].get(run.id)
        fired["entropy"] = (
            collapse.band_rule(s.samples, s.values, opts.entropy_low, opts.entropy_high)
            if s
            else None
        )
    if opts.length_max is not None or opts.truncated_max is not None:
        hits = []
        for key, bound in (("length", opts.length_max), ("truncated", opts.truncated_max)):
            s = extra[key].get(run.id)
            if bound is not None and s:
                hits.append(collapse.above_rule(s.samples, s.values, bound))
        fired["length"] = min([h for h in hits if h is not None], default=None)
    n_fail, rule = collapse.earliest(fired)
    if n_prog is not None and n_fail is not None and n_fail < n_prog:
        n_prog = None  # collapsed before reaching the target: progress is censored at collapse
    g = [grads[k].get(run.id) for k in GRAD_KEYS]
    b_simple = None
    if all(s is not None for s in g) and len({s.values.size for s in g}) == 1:
        series_b = noise_scale(*(s.values for s in g), ema_alpha=opts.noise_ema)
        at = n_prog if n_prog is not None else last
        idx = int(np.searchsorted(g[0].samples, at, side="left"))
        idx = min(idx, series_b.size - 1)
        b_simple = float(series_b[idx]) if np.isfinite(series_b[idx]) else None
    group = run.group_size or 1
    times = [t[run.id] for t in extra["times"] if run.id in t]
    row.update(
        points=int(curve.values.size),
        last_samples=last,
        progress={
            "samples": n_prog,
            "steps": _interp_steps(curve, n_prog),
            "prompts": n_prog / group if n_prog is not None else None,
            "seconds": _seconds_at(times, n_prog),
            "censored": n_prog is None,
            "censored_at": last if n_prog is None else None,
        },
        failure={
            "samples": n_fail,
            "steps": _interp_steps(curve, n_fail),
            "prompts": n_fail / group if n_fail is not None else None,
            "seconds": _seconds_at(times, n_fail),
            "rule": rule,
            "censored": n_fail is None,
            "censored_at": last if n_fail is None else None,
            "rules": fired,
        },
        noise_scale=b_simple,
    )
    return row


def _per_batch(run_rows, rng, opts) -> list[dict]:
    out = []
    for b in sorted({r["batch_samples"] for r in run_rows if r["batch_samples"] is not None}):
        rows = [r for r in run_rows if r["batch_samples"] == b and r["analysed"]]
        if not rows:
            continue
        prog = [r["progress"]["samples"] for r in rows]
        fail = [r["failure"]["samples"] for r in rows]
        out.append(
            {
                "batch_samples": b,
                "batch_prompts": sorted({r["batch_prompts"] for r in rows if r["batch_prompts"]}),
                "lr": sorted({r["lr"] for r in rows if r["lr"] is not None}),
                "n_runs": len(rows),
                "partial": any(r["partial"] for r in rows),
                "progress": aggregate(
                    prog,
                    [r["progress"]["censored_at"] for r in rows if r["progress"]["censored"]],
                    rng,
                    opts.bootstrap,
                ).to_json(),
                "failure": aggregate(
                    fail,
                    [r["failure"]["censored_at"] for r in rows if r["failure"]["censored"]],
                    rng,
                    opts.bootstrap,
                ).to_json(),
                "_prog": prog,
            }
        )
    return out


def _noise_summary(run_rows) -> dict:
    vals = [r["noise_scale"] for r in run_rows if r.get("noise_scale") is not None]
    if not vals:
        return {
            "b_simple": None,
            "n_runs": 0,
            "note": "no gradient-noise terms logged (grad_sq_micro/full, sizes)",
        }
    return {
        "b_simple": float(np.median(vals)),
        "low": float(np.min(vals)),
        "high": float(np.max(vals)),
        "n_runs": len(vals),
        "note": "median over runs of B_simple at each run's progress crossing (range: min-max)",
    }


def _theory(runs, tau, metric, opts, warnings) -> dict | None:
    """The local quadratic model's B_crit for a sim sweep (its lr rule, cap and this target)."""
    if not opts.theory or not runs or any(r.backend != "sim" for r in runs):
        return None
    from twoclocks_cli.errors import ConfigError
    from twoclocks_cli.theory import ModelConfig, predict_critical_batch

    ref = min(runs, key=lambda r: r.batch_samples or np.inf)
    try:
        cfg = ModelConfig.from_dict((ref.config or {}).get("sim"))
    except ConfigError as exc:
        warnings.append(f"theory skipped: {exc}")
        return None
    pts = {(r.batch_samples, r.lr) for r in runs if r.batch_samples and r.lr}
    bs = np.log([p[0] for p in pts])
    alpha = (
        float(np.polyfit(bs, np.log([p[1] for p in pts]), 1)[0]) if np.unique(bs).size > 1 else 0.5
    )
    if not 0 < tau < 1:
        return {"b_crit": None, "note": f"target {tau:.4g} outside (0, 1): no theory prediction"}
    cap = cfg.cap_for(ref.clip_low, ref.clip_high)
    pred = predict_critical_batch(cfg, ref.lr, ref.batch_samples, tau, alpha, cap)
    pred.update(
        alpha=alpha,
        lr0=ref.lr,
        b0=ref.batch_samples,
        cap=cap,
        note=f"theory for target p={tau:.4g} on the noise-free progress ({metric} estimates p)",
    )
    return pred


def _clipping_table(run_rows) -> list[dict] | None:
    keys = {(r["clip_low"], r["clip_high"]) for r in run_rows if r["analysed"]}
    if len(keys) < 2:
        return None
    out = []
    for lo, hi in sorted(keys, key=lambda k: (k[0] or 0, k[1] or 0)):
        for b in sorted({r["batch_samples"] for r in run_rows if r["batch_samples"]}):
            rows = [
                r
                for r in run_rows
                if r["analysed"]
                and r["batch_samples"] == b
                and (r["clip_low"], r["clip_high"]) == (lo, hi)
            ]
            if not rows:
                continue
            prog = [r["progress"]["samples"] for r in rows]
            fail = [r["failure"]["samples"] for r in rows]
            out.append(
                {
                    "clip_low": lo,
                    "clip_high": hi,
                    "batch_samples": b,
                    "n_runs": len(rows),
                    "progress_median": _med(prog),
                    "failure_median": _med(fail),
                }
            )
    return out


def _med(vals):
    x = np.array([np.inf if v is None else v for v in vals], float)
    m = float(np.median(x))
    return m if np.isfinite(m) else None
