"""What `twoclocks report` shows, gathered from the store and the clocks before anything is
drawn: the runs, the analysis and the schedule (or why not), the curves, and each --run's clocks
and trajectory. `render.report` turns a `ReportData` into the page and never reads the store."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from twoclocks_cli.clocks.result import Analysis
from twoclocks_cli.core.errors import AnalysisError, TwoclocksError

PROGRESS_KEYS = ("eval_accuracy", "reward_mean", "accuracy")
SIDE_KEYS = ("reward_mean", "accuracy", "entropy", "kl_init", "drift_abs", "resp_len_mean",
             "clip_frac", "grad_norm", "approx_kl", "truncated_frac")


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
    # adaptive or scheduled runs (ids) to draw against the sweep's per-batch clocks
    runs: tuple[int, ...] = ()


@dataclass
class ReportData:
    """Everything the page shows, gathered before anything is drawn."""

    sweep: str
    runs: list
    analysis: Analysis | None
    analysis_error: str | None
    schedule: dict | None
    schedule_error: str | None
    schedule_toml: str | None
    metric: str | None
    curves: dict  # key -> {run_id: Series}
    options: dict
    compared: list = field(default_factory=list)  # clocks.compare dicts, one per --run
    trajectories: dict = field(default_factory=dict)  # run id -> adaptive.trajectory.Trajectory
    compared_error: str | None = None


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
    used_options = (analysis.options if analysis else asked).to_json()
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
    metric = (analysis.metric if analysis else None) or asked.metric or next(
        (k for k in PROGRESS_KEYS if k in keys), None)
    if metric not in keys:  # a name of the imported runs' own logs stands for its store key
        from twoclocks_cli.ingest.mapping import store_key_of

        metric = store_key_of([r.config for r in runs], metric) or metric
    wanted = [metric] if metric in keys else []
    wanted += [k for k in SIDE_KEYS if k in keys and k != metric][:6]
    curves = {k: store.load_metric(ids, k) for k in wanted}
    options = {"report": {"sweep": opts.sweep, "out": str(opts.out), "safety": opts.safety,
                          "budget": opts.budget},
               "analysis": used_options,
               "analysis_source": {"id": analysis.analysis_id if analysis else None,
                                   "how": source}}
    data = ReportData(opts.sweep, runs, analysis, a_err, schedule, s_err, toml, metric, curves,
                      options)
    _compare_runs(store, opts, data)
    return data


def _compare_runs(store, opts: ReportOptions, data: ReportData) -> None:
    """Each --run's clocks beside the sweep's (as `compare` measures them) and its trajectory."""
    if not opts.runs:
        return
    if data.analysis is None:
        data.compared_error = (f"no analysis of the sweep ({data.analysis_error}): nothing to "
                               "set the runs against")
        return
    from twoclocks_cli.adaptive.trajectory import trajectory
    from twoclocks_cli.clocks.compare import compare_schedule

    name = store.get_sweep(opts.sweep).name
    for rid in opts.runs:
        result = compare_schedule(store, name, rid, data.analysis)
        traj = trajectory(store, rid)
        result["trajectory"] = traj.to_json()
        data.compared.append(result)
        data.trajectories[rid] = traj


def check_runs(store, opts: ReportOptions) -> None:
    """Refuse a --run that does not exist or is not an adaptive or scheduled run of the sweep's
    setting (one line, before anything is written)."""
    from twoclocks_cli.clocks.compare import check_schedule_run

    name = store.get_sweep(opts.sweep).name
    for rid in opts.runs:
        check_schedule_run(store, name, store.get_run(rid))


def check_options(store, opts: ReportOptions) -> None:
    """Refuse an unknown sweep or invalid analysis options before the folder is made."""
    from twoclocks_cli.clocks.options import AnalysisOptions

    store.get_sweep(opts.sweep)
    if opts.analysis is not None:
        AnalysisOptions.from_json(opts.analysis)


def collect(store, opts: ReportOptions) -> ReportData:
    """Check the options and each --run (one line, before anything is written), then gather."""
    check_runs(store, opts)
    check_options(store, opts)
    return gather(store, opts)
