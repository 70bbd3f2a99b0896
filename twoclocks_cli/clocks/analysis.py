"""`analyze_sweep`: stored curves -> both clocks per run, per batch size, B_crit three ways.

Input arrives from `store.load_metric` as numpy arrays; no SQL here. The result is a typed
`clocks.result.Analysis` (with every option used); it becomes JSON only when it is stored or
printed (`Analysis.to_json`).
"""

from __future__ import annotations

import json
import math

import numpy as np

from twoclocks_cli.clocks.cost import (
    STEP_TIME_KEY,
    CostFile,
    for_analysis,
    measured_throughput,
    runtime_steps,
    time_clocks,
)
from twoclocks_cli.clocks.curves import smooth_curve
from twoclocks_cli.clocks.options import AnalysisOptions, parse_target
from twoclocks_cli.clocks.perbatch import batch_rows, critical_estimates, progress_by_batch
from twoclocks_cli.clocks.result import (
    Analysis,
    ClipRow,
    Invariance,
    RunRow,
    Target,
    Theory,
    json_numbers,
)
from twoclocks_cli.clocks.runclock import Clock, RunClocks, load_signals, prepare, run_clocks
from twoclocks_cli.clocks.stats import slope_test
from twoclocks_cli.core.errors import AnalysisError, NotFoundError

UNITS = ("samples (one sampled completion); steps, prompts and seconds (cumulated "
         "time_gen_s + time_reward_s + time_update_s, when logged) given beside")


def analyze_sweep(store, sweep: str, options: AnalysisOptions | None = None,
                  cost: CostFile | None = None) -> Analysis:
    """Analyse every run of `sweep` (partial runs included and marked); the clocks in time and
    cost from the runs' time_* metrics, or from `cost` (a cost file) when given."""
    opts = options or AnalysisOptions()
    store.get_sweep(sweep)  # NotFoundError listing the sweeps
    runs = store.list_runs(sweep)
    if not runs:
        raise AnalysisError(f"sweep {sweep!r} has no runs yet: nothing to analyse")
    ids = [r.id for r in runs]
    metric = _pick_metric(store, sweep, ids, opts.metric, runs)
    if opts.drop_metric is not None:
        _check_logged(store, sweep, ids, opts.drop_metric, "--drop-metric")
    signals = load_signals(store, ids, metric, opts)
    warnings: list[str] = []
    curves = {rid: prepare(sig.metric) for rid, sig in signals.items()}
    usable = {rid: c for rid, c in curves.items() if c is not None}
    if not usable:
        raise AnalysisError(f"metric {metric!r} of sweep {sweep!r} has no finite values")
    _data_warnings(signals, metric, opts, warnings)
    smoothed = {rid: smooth_curve(c, opts) for rid, c in usable.items()}
    tau, target = _target(opts, metric, smoothed, warnings)
    family, others = _families(runs)
    if others:
        warnings.append(others)
    _refuse_mixed_settings([r for r in runs if r.id in family])
    run_rows = []
    for r in runs:
        clocks = run_clocks(r.id, signals[r.id], tau, opts, r.group_size)
        run_rows.append(_run_row(r, clocks, r.id in family))
    missing = [r.id for r in runs if r.id not in usable]
    if missing:
        warnings.append(f"run(s) {missing} have no finite {metric} values yet: left out")
    partial = [row.run_id for row in run_rows if row.partial and row.status != "incomplete"]
    if partial:
        warnings.append(f"run(s) {partial} still in progress: analysed as partial (censored)")
    warnings += _import_caveats(runs)
    above = [row.run_id for row in run_rows if row.started_above]
    if above:
        warnings.append(
            f"run(s) {above} started at or above the target {tau:.4g}: no progress clock "
            "(left out of E(B); give a higher --target)"
        )
    warnings += _eval_resolution(signals, target, metric)
    rng = np.random.default_rng(opts.seed)
    rows_in = [row for row in run_rows if row.analysed and row.in_family]
    batches = batch_rows(rows_in, rng, opts)
    per_batch_prog = progress_by_batch(rows_in, batches)
    theory = _theory(runs, tau, metric, opts, warnings)
    crit = critical_estimates(per_batch_prog, rows_in, theory, rng, opts.bootstrap)
    invariance = _invariance(rows_in, opts)
    if all(row.progress.censored for row in rows_in):
        warnings.append(f"every run is censored: none reached the target {tau:.4g}")
    result = json_numbers(Analysis(
        sweep=sweep,
        options=opts,
        metric=metric,
        target=target,
        units=UNITS,
        runs=run_rows,
        batches=batches,
        critical=crit,
        invariance=invariance,
        clipping=_clipping_table([r for r in run_rows if r.analysed]),
        warnings=warnings,
    ))
    result.time = json_numbers(_time_clocks(store, result, signals, opts, cost))
    if opts.stability:
        from twoclocks_cli.clocks.stability import measure

        result.stability = json_numbers(measure(result, opts.stability, opts.seed).to_json())
    return result


def _time_clocks(store, result: Analysis, signals, opts, cost: CostFile | None):
    """Both clocks in time and cost: the throughput measured at each batch from its runs'
    time_* metrics (else the seconds per step a tracker logged, TRL's `step_time`; own random
    stream, so no other interval moves), or the cost file's."""
    rng = np.random.default_rng(opts.seed)
    untimed = [r.run_id for r in result.runs if r.in_family and r.analysed
               and r.run_id in signals and not signals[r.run_id].times]
    per_step = store.load_metric(untimed, STEP_TIME_KEY) if untimed else {}
    per_step.update(runtime_steps(store, [r for r in untimed if r not in per_step]))
    tps = {}
    for b in result.batches:
        times = [signals[r.run_id].times or ([per_step[r.run_id]] if r.run_id in per_step
                                             else [])
                 for r in result.runs_at(b.batch_samples) if r.run_id in signals]
        tp = measured_throughput(b.batch_samples, [t for t in times if t], rng, opts.bootstrap)
        if tp is not None:
            tps[b.batch_samples] = tp
    measured = time_clocks(result.batches, tps, "measured")
    if cost is None:
        return measured
    result.time = measured
    out = for_analysis(result, cost)
    if out is None:
        result.warnings.append("the cost file gives a price but no timings, and no run logged "
                               "time_* metrics: no time or cost clock")
    return out


def _check_logged(store, sweep, ids, key: str, option: str) -> None:
    """A metric an option names must be logged by some run of the sweep (NotFoundError)."""
    keys = store.metric_keys(ids)
    if key not in keys:
        known = ", ".join(keys) if keys else "none"
        raise NotFoundError(f"{option} {key!r}: not logged by any run of {sweep!r}; metrics: "
                            f"{known}")


def _pick_metric(store, sweep, ids, wanted, runs) -> str:
    """The progress metric: the one asked for, else eval_accuracy when logged, else reward_mean.
    The name an imported run's own log used (verl's `critic/score/mean`) stands for the store
    key it was imported as (`reward_mean`)."""
    from twoclocks_cli.ingest.mapping import store_key_of

    candidates = [wanted] if wanted else ["eval_accuracy", "reward_mean"]
    keys = store.metric_keys(ids)
    for c in candidates:
        if c in keys:
            return c
    alias = store_key_of([r.config for r in runs], wanted) if wanted else None
    if alias in keys:
        return alias
    shown = wanted or "eval_accuracy or reward_mean"
    known = ", ".join(keys) if keys else "none: no run has logged anything yet"
    raise NotFoundError(f"metric {shown!r} not logged by any run of {sweep!r}; metrics: {known}")


def _data_warnings(signals, metric, opts, warnings) -> None:
    nan_runs = [
        rid
        for rid, s in signals.items()
        if s.metric is not None and np.isnan(s.metric.values).any()
    ]
    if nan_runs:
        warnings.append(f"NaN values of {metric} ignored in run(s) {nan_runs}")
    for rid, sig in signals.items():
        s = sig.metric
        if s is not None and (np.diff(s.steps) <= 0).any():
            warnings.append(f"run {rid}: duplicate or unsorted steps, last value per step kept")
    checks = (
        ("drift", opts.drift_key, opts.drift_threshold is not None, "drift"),
        ("entropy", opts.entropy_key,
         opts.entropy_low is not None or opts.entropy_high is not None, "entropy"),
        ("length", "resp_len_mean", opts.length_max is not None, "length"),
        ("length", "truncated_frac", opts.truncated_max is not None, "truncated"),
    )
    for rule, key, on, attr in checks:
        if on and not any(getattr(s, attr) is not None for s in signals.values()):
            warnings.append(f"{rule} rule is on but no run logged {key!r}: it cannot fire")


def _target(opts, metric, smoothed, warnings) -> tuple[float, Target]:
    kind, x = parse_target(opts.target)
    initial = float(np.median([sm[0] for sm in smoothed.values()]))
    best = float(max(sm.max() for sm in smoothed.values()))
    rose = max(float(sm.max() - sm[0]) for sm in smoothed.values())
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
    return tau, Target(spec=opts.target, value=tau, initial=initial, best=best)


# keys of a cell config that vary between seeds or with the batch under a scaling rule
_PER_SEED = {"seed", "sample_budget", "ingest"}  # ingest: provenance, not a setting
_PER_BATCH = {"prompts_per_batch", "samples_per_batch", "lr", "adam_beta1", "adam_beta2",
              "adam_epsilon"}
_SIM_PER_BATCH = {"beta1", "beta2", "adam_eps"}


def _setting(run) -> str:
    """The run's setting apart from seed and batch (trainer overrides, clip, sim table...)."""
    cfg = dict(run.config or {})
    out = {k: v for k, v in cfg.items() if k not in _PER_SEED | _PER_BATCH}
    if isinstance(out.get("sim"), dict):
        out["sim"] = {k: v for k, v in out["sim"].items() if k not in _SIM_PER_BATCH}
    out["clip"] = (run.clip_low, run.clip_high)
    return json.dumps(out, sort_keys=True, default=str)


def _families(runs) -> tuple[set[int], str | None]:
    """Runs of the setting with the most runs (B_crit and the schedule read only those), and a
    warning naming what the other settings differ in."""
    groups: dict[str, list] = {}
    for r in runs:
        groups.setdefault(_setting(r), []).append(r)
    if len(groups) == 1:
        return {r.id for r in runs}, None
    main = max(groups.values(), key=len)
    ref = json.loads(_setting(main[0]))
    diff = set()
    for key in groups:
        other = json.loads(key)
        diff |= {k for k in set(ref) | set(other) if ref.get(k) != other.get(k)}
    left = sorted(r.id for rs in groups.values() if rs is not main for r in rs)
    return {r.id for r in main}, (
        f"the sweep mixes {len(groups)} settings (differing in {', '.join(sorted(diff))}): "
        f"per-batch clocks, B_crit and the schedule use the {len(main)} run(s) of the largest "
        f"one; run(s) {left} are analysed per run and in the clipping table only"
    )


def _refuse_mixed_settings(runs) -> None:
    """Within one setting, a batch must have one lr: otherwise the sweep was re-run with another
    reference lr (or rule), and pooling those runs as seeds would be wrong."""
    lrs: dict[float, set] = {}
    for r in runs:
        if r.batch_samples is not None and r.lr is not None and not (r.config or {}).get("phases"):
            lrs.setdefault(r.batch_samples, set()).add(float(f"{r.lr:.6g}"))
    mixed = {b: sorted(v) for b, v in lrs.items() if len(v) > 1}
    if mixed:
        shown = "; ".join(f"B={b:g}: lr {', '.join(f'{x:.4g}' for x in v)}"
                          for b, v in sorted(mixed.items()))
        raise AnalysisError(
            f"runs at the same batch size have different learning rates ({shown}): the sweep "
            "mixes settings (re-run under the same name with another reference_lr or rule?); "
            "they cannot be pooled as seeds; give each setting its own sweep name"
        )


def _import_caveats(runs) -> list[str]:
    """What an import found doubtful about a run's log, repeated where its clocks are read: a
    log without its end (incomplete), a resumed run's log without its start."""
    out = []
    cut = [r.id for r in runs if r.status == "incomplete"]
    if cut:
        out.append(f"run(s) {cut} incomplete: the imported log has no end (the run was killed "
                   "or still going when it was written): analysed as partial (censored)")
    for r in runs:
        ingest = (r.config or {}).get("ingest")
        for caveat in (ingest.get("caveats") or []) if isinstance(ingest, dict) else []:
            out.append(f"run {r.id} ({r.name}): {caveat}")
    return out


def _run_row(run, clocks: RunClocks | None, in_family: bool) -> RunRow:
    """The run's identity and status beside its clocks."""
    from twoclocks_cli.store.models import RunStatus

    finished = (
        RunStatus(run.status).finished if run.status in RunStatus._value2member_map_ else True
    )
    identity = {
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
        "in_family": in_family,
    }
    if clocks is None:
        return RunRow(
            **identity,
            points=0,
            progress=Clock(None, True, reason="no finite values"),
            failure=Clock(None, True, reason="no finite values"),
        )
    return RunRow(
        **identity,
        points=clocks.points,
        first_samples=clocks.first_samples,
        last_samples=clocks.last_samples,
        initial=clocks.initial,
        final=clocks.final,
        best=clocks.best,
        progress=clocks.progress,
        failure=clocks.failure,
        started_above=clocks.started_above,
        noise_scale=clocks.noise_scale,
        sign_noise_scale=clocks.sign_noise_scale,
    )


def _invariance(rows: list[RunRow], opts) -> Invariance:
    """Slope of log N_fail on log B with an equivalence margin (not "0 inside the interval")."""
    fail_pts = [
        (r.batch_samples, r.failure.samples)
        for r in rows
        if r.failure.samples is not None and r.batch_samples
        and not r.failure.at_eval_resolution
    ]
    early = sum(1 for r in rows if r.failure.at_eval_resolution)
    if not fail_pts:
        fit = {"slope": None, "low": None, "high": None, "n": 0,
               "verdict": "no run failed: every failure clock is censored"
               if not early else "inconclusive: every failure is at eval resolution"}
    else:
        fit = slope_test([b for b, _ in fail_pts], [f for _, f in fail_pts], opts.invariance_margin)
    notes = []
    cens = sum(1 for r in rows if r.failure.censored)
    if fail_pts and cens:
        notes.append(f"{cens} censored run(s) left out of the slope")
    if early:
        notes.append(f"{early} failure(s) at eval resolution left out")
    return Invariance(**fit, note="; ".join(notes) if notes else None,
                      margin=opts.invariance_margin)


def _eval_resolution(signals, target: Target, metric) -> list[str]:
    """Warn when the eval set is too small to resolve the target gap (binomial SE)."""
    if metric != "eval_accuracy":
        return []
    sizes = [s.eval_n for s in signals.values() if s.eval_n is not None]
    if not sizes:
        return []
    n = min(sizes)
    p = min(max(target.value, 0.0), 1.0)
    se = math.sqrt(max(p * (1 - p), 1e-12) / n)
    gap = target.value - target.initial
    if gap < 3 * se:
        return [
            f"eval set of {n:g} problems: standard error {se:.3g} per eval against a target gap "
            f"of {gap:.3g} (target {target.value:.4g} - initial {target.initial:.4g}); "
            "crossings are at the eval noise level: use a larger eval set"
        ]
    return []


def _theory(runs, tau, metric, opts, warnings) -> Theory | None:
    """The local quadratic model's B_crit for a sim sweep (its lr rule, cap and this target)."""
    if not opts.theory or not runs or any(r.backend != "sim" for r in runs):
        return None
    from twoclocks_cli.core.errors import ConfigError
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
        return Theory.from_json(
            {"b_crit": None, "note": f"target {tau:.4g} outside (0, 1): no theory prediction"})
    cap = cfg.cap_for(ref.clip_low, ref.clip_high)
    pred = predict_critical_batch(cfg, ref.lr, ref.batch_samples, tau, alpha, cap)
    pred.update(
        alpha=alpha,
        lr0=ref.lr,
        b0=ref.batch_samples,
        cap=cap,
        note=f"theory for target p={tau:.4g} on the noise-free progress ({metric} estimates p)",
    )
    return Theory.from_json(pred)


def _clipping_table(rows: list[RunRow]) -> list[ClipRow] | None:
    """Median clocks per (clip range, batch) when the sweep varies the clip range."""
    keys = {(r.clip_low, r.clip_high) for r in rows if r.analysed}
    if len(keys) < 2:
        return None
    out = []
    for lo, hi in sorted(keys, key=lambda k: (k[0] or 0, k[1] or 0)):
        for b in sorted({r.batch_samples for r in rows if r.batch_samples}):
            at = [
                r
                for r in rows
                if r.analysed and r.batch_samples == b and (r.clip_low, r.clip_high) == (lo, hi)
            ]
            if not at:
                continue
            out.append(
                ClipRow(
                    clip_low=lo,
                    clip_high=hi,
                    batch_samples=b,
                    n_runs=len(at),
                    progress_median=_med([r.progress.samples for r in at]),
                    failure_median=_med([r.failure.samples for r in at]),
                )
            )
    return out


def _med(vals):
    x = np.array([np.inf if v is None else v for v in vals], float)
    m = float(np.median(x))
    return m if np.isfinite(m) else None
