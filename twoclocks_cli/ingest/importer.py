"""Turn parsed foreign logs into store runs: one completed Run per file, metrics upserted.

Every file is parsed and checked before anything is written, so a bad file leaves the store as it
was. A run's identity is a hash of the format and the file's content (or its resolved path, with
`identity="path"`) within its sweep: importing the same file again finds the same run, and since
metrics upsert on (run, step, key), nothing changes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from twoclocks_cli.core.codec import Document
from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.core.limits import NAME_CHARS
from twoclocks_cli.ingest import (
    base,
    detect,
    mlflow_store,
    tabular,
    tensorboard,
    trl,
    verl,
    wandb_csv,
    wandb_offline,
)
from twoclocks_cli.ingest.base import IngestOptions, ParsedLog

PARSERS = {"trl": trl.parse, "verl": verl.parse, "csv": tabular.parse, "jsonl": tabular.parse}
# sources that hold several runs: each parser returns one ParsedLog per run selected
MULTI_PARSERS = {"wandb": wandb_offline.parse_runs, "wandb-csv": wandb_csv.parse_runs,
                 "mlflow": mlflow_store.parse_runs, "tensorboard": tensorboard.parse_runs}


@dataclass
class IngestResult(Document):
    """What one file became (the --json schema of `twoclocks ingest`, one object per file)."""

    path: str
    format: str
    format_from: str  # "option" (--format) or "detected: <what the content showed>"
    sweep: str
    run_id: int | None  # None when the file was skipped
    action: str  # created | updated | unchanged | skipped
    steps: int
    rows: int
    batch_prompts: int | None
    group_size: int | None
    batch_samples: int | None
    lr: float | None
    seed: int | None
    params_from: dict[str, str]
    sources: dict[str, str]
    unmapped: list[str]
    skipped_lines: list[list]
    duplicates: int
    notes: list[str] = field(default_factory=list)
    run: str | None = None  # the run's name within a source holding several (W&B, MLflow, ...)


@dataclass
class _Plan:
    """A parsed file with its resolved run columns and per-step samples, ready to write."""

    log: ParsedLog
    cell_id: str
    columns: dict
    config: dict
    samples: dict[int, int]
    notes: list[str]


def with_format(path: Path | str, opts: IngestOptions) -> tuple[IngestOptions, str]:
    """`opts` with the source's format: --format's, else told from the content (an
    `mlflow:URI` names its own); and which."""
    if isinstance(path, str) and path.startswith(mlflow_store.PREFIX):
        if opts.fmt not in (None, "mlflow"):
            raise ConfigError(f"{path}: an MLflow tracking URI, not --format {opts.fmt}")
        return dataclasses.replace(opts, fmt="mlflow"), "option"
    if opts.fmt is None:
        with _readable(path):
            fmt, why = detect.detect(Path(path), opts.max_bytes, finished=opts.finished)
        return dataclasses.replace(opts, fmt=fmt), f"detected: {why}"
    if opts.fmt not in PARSERS and opts.fmt not in MULTI_PARSERS:
        raise ConfigError(f"--format {opts.fmt!r}: allowed are {', '.join(base.FORMATS)}")
    return opts, "option"


def parse_source(path: Path | str, opts: IngestOptions,
                 skipped: list[tuple[str, str]] | None = None) -> list[ParsedLog]:
    """Every run a source holds (one for a log file), each checked: bad lines, known metrics.
    With `skipped` (--skip-bad), a source of several runs that can leave out a run with no
    step lists it there, (run, why), and returns the others."""
    opts, how = with_format(path, opts)
    if opts.fmt not in MULTI_PARSERS and opts.runs:
        raise ConfigError(f"{path}: --run selects runs of a W&B, MLflow or TensorBoard "
                          f"source; a {opts.fmt} log is one run")
    logs = _read_source(path, opts, skipped)
    for log in logs:
        log.fmt_from = how
        base.require_clean(log, opts.skip_bad)
        if not any(log.steps.values()):
            seen = ", ".join(sorted(log.unmapped)[:20]) or "none"
            raise ConfigError(
                f"{log.where}: no metric this tool knows was found (numeric keys seen: "
                f"{seen}); name them with --map STORE_KEY=COLUMN"
            )
    return logs


def _read_source(path: Path | str, opts: IngestOptions,
                 skipped: list[tuple[str, str]] | None = None) -> list[ParsedLog]:
    """The runs a source holds, read with the libraries' own logging quiet; a file the OS will
    not let us read, or a record claiming more bytes than memory holds, is one line."""
    import inspect

    from twoclocks_cli.ingest.quiet import quiet_libraries

    with _readable(path), quiet_libraries():
        if opts.fmt in MULTI_PARSERS:
            parser = MULTI_PARSERS[opts.fmt]
            where = path if isinstance(path, str) else Path(path)
            if skipped is not None and "skipped" in inspect.signature(parser).parameters:
                return parser(where, opts, skipped=skipped)
            return parser(where, opts)
        return [PARSERS[opts.fmt](Path(path), opts)]


@contextlib.contextmanager
def _readable(path: Path | str):
    """A file the OS will not let us read (mode 000, a name too long, gone meanwhile), or a
    record claiming more bytes than memory holds, as one line."""
    try:
        yield
    except MemoryError:
        raise ConfigError(f"{path}: a record claims more bytes than memory holds (a corrupt "
                          "file?); nothing was written") from None
    except OSError as exc:
        raise ConfigError(f"{exc.filename or path}: cannot read ({exc.strerror or exc}); "
                          "nothing was written") from None


def parse_file(path: Path | str, opts: IngestOptions) -> ParsedLog:
    """The one run of a log file, or of a source holding exactly one run (`--follow`)."""
    logs = parse_source(path, opts)
    if len(logs) != 1:
        names = ", ".join(log.run_name for log in logs[:8])
        raise ConfigError(f"{path}: holds {len(logs)} runs ({names}); --follow follows one: "
                          "name it with --run NAME or give its own folder")
    return logs[0]


def _resolve(log: ParsedLog, opts: IngestOptions) -> _Plan:
    """Run columns (options override the log) and the samples axis (logged, else step × P×G)."""
    params, origin, notes = dict(log.params), dict(log.params_from), list(log.notes)
    for name in ("batch_prompts", "group_size", "lr", "seed"):
        given = getattr(opts, name)
        if given is None:
            continue
        if name in params and params[name] != given:
            notes.append(f"--{name.replace('_', '-')} {given} overrides {params[name]} "
                         f"from the {origin[name]}")
        params[name], origin[name] = given, "option"
    base.check_params(params, log.where)
    p, g = params.get("batch_prompts"), params.get("group_size")
    if params.get("lr") is None:
        notes.append("the run's lr was not found in the log (pass --lr): its lr column stays "
                     "empty, and analyze cannot tell its setting from another lr's")
    batch = int(p) * int(g) if p is not None and g is not None else None
    samples = dict(log.samples)
    missing = [s for s in log.steps if s not in samples]
    if missing and batch is None:
        need = [f"--{n}" for n, v in (("batch-prompts", p), ("group-size", g)) if v is None]
        raise ConfigError(
            f"{log.where}: samples are not logged and the batch size is unknown; pass "
            f"{' and '.join(need)} (samples = step × prompts × group size)"
            + (f"; {log.batch_hint}" if log.batch_hint else "")
        )
    for s in missing:
        samples[s] = (s + log.step_offset) * batch
    base.check_axis(log, samples)
    digest = hashlib.sha256(log.fmt.encode() + b"\0")
    if log.run_key:  # one run of a source holding several
        digest.update(log.run_key.encode() + b"\0")
    if opts.identity == "path":
        digest.update(str(log.path.resolve()).encode())
    elif opts.identity == "content":
        digest.update(log.sha256.encode())
    else:
        raise ConfigError(f"--identity {opts.identity!r}: allowed are content, path")
    columns = {
        "batch_prompts": int(p) if p is not None else None,
        "group_size": int(g) if g is not None else None,
        "batch_samples": batch,
        "lr": float(params["lr"]) if params.get("lr") is not None else None,
        "seed": int(params["seed"]) if params.get("seed") is not None else None,
    }
    config = {
        "prompts_per_batch": columns["batch_prompts"],
        "group_size": columns["group_size"],
        "lr": columns["lr"],
        "seed": columns["seed"],
        "ingest": {
            "format": log.fmt, "path": str(log.path.resolve()), "sha256": log.sha256,
            **({"run": log.run_key} if log.run_key else {}),
            "bytes": log.size, "identity": opts.identity, "params_from": origin,
            "sources": log.sources, "map": opts.column_map,
            "skipped_lines": [line for line, _ in log.bad_lines],
            **({"caveats": log.caveats} if log.caveats else {}),
            **({"unfinished": log.unfinished} if log.unfinished else {}),
        },
    }
    return _Plan(log, digest.hexdigest()[:32], columns, config, samples, notes)


def _run_name(log: ParsedLog) -> str:
    """The run's name: the tracker's, else the log's folder/file; the end the column holds."""
    if log.run_name:  # one run of a source holding several: the tracker's own name
        return log.run_name[-NAME_CHARS:]
    path = log.path
    name = f"{path.parent.name}/{path.name}" if path.parent.name else path.name
    return name[-NAME_CHARS:]


def _upsert_run(store, plan: _Plan, sweep_name: str, fmt: str,
                keep_metrics: bool = False) -> tuple[int, str]:
    """Find or create the sweep and the run; returns (run id, created|updated|unchanged).

    An updated run loses its metrics (the mapping may have changed) unless `keep_metrics`
    (`--follow`: the same file grew; its values are upserted)."""
    return store.upsert_import_run(sweep_name, fmt, base.FORMATS, plan.cell_id,
                                   _run_name(plan.log), plan.config, plan.columns,
                                   keep_metrics)


def _write(store, run_id: int, plan: _Plan, skip: dict | None = None) -> int:
    """Upsert every value in batches (bounded memory), but the steps whose values `skip` already
    holds as they are; returns the steps written. The caller marks a failure."""
    n, at = 0, plan.log.samples_at
    with store.metric_writer(run_id) as writer:
        for step in sorted(plan.log.steps):
            values = plan.log.steps[step]
            if values and (skip is None or skip.get(step) != (plan.samples[step], values)):
                writer.log(step, plan.samples[step],
                           {k: v for k, v in values.items() if (step, k) not in at})
                for k in values:
                    if (step, k) in at:
                        writer.log(step, at[step, k], {k: values[k]})
                n += 1
    return n


def _skipped(path: Path | str, opts: IngestOptions, how: str, run: str, why: str
             ) -> IngestResult:
    """What a file, or a run of a source holding several, left out by --skip-bad became."""
    return IngestResult(
        path=str(path), run=run or None, format=opts.fmt, format_from=how, sweep=opts.sweep,
        run_id=None, action="skipped", steps=0, rows=0, batch_prompts=None, group_size=None,
        batch_samples=None, lr=None, seed=None, params_from={}, sources={}, unmapped=[],
        skipped_lines=[], duplicates=0, notes=[why])


def ingest_files(store, paths: list[Path | str], opts: IngestOptions) -> list[IngestResult]:
    """Parse every source (refusing the lot if one is bad), then write one run per file, or
    per run of a source holding several (a W&B folder, an MLflow store, TensorBoard runs)."""
    from twoclocks_cli.store.models import RunStatus

    plans, results = [], []
    for p in paths:
        p = p if isinstance(p, str) else Path(p)
        file_opts, how = with_format(p, opts)
        skipped: list[tuple[str, str]] = []
        try:
            for log in parse_source(p, file_opts, skipped if opts.skip_bad else None):
                log.fmt_from = how
                plans.append(_resolve(log, file_opts))
        except base.NoStepsError as exc:  # --skip-bad: skip the file, import the others
            if not opts.skip_bad:
                raise
            skipped.append(("", str(exc)))
        results.extend(_skipped(p, file_opts, how, run, why) for run, why in skipped)
    if not plans and results:
        raise base.NoStepsError(f"every file was skipped: {results[0].notes[0]}")
    seen: dict[str, IngestResult] = {}
    for plan in plans:
        log = plan.log
        if plan.cell_id in seen:
            seen[plan.cell_id].notes.append(f"{log.where} is the same run; imported once")
            continue
        run_id, action = _upsert_run(store, plan, opts.sweep, log.fmt)
        rows = sum(len(v) for v in log.steps.values())
        if action != "unchanged":  # unchanged: same file, same options, completed: all written
            try:
                _write(store, run_id, plan)
            except Exception as exc:
                store.set_status(run_id, RunStatus.failed, message="ingest failed",
                                 error=str(exc))
                raise
            status = RunStatus.incomplete if log.unfinished else RunStatus.completed
            store.set_status(run_id, status, message=f"ingested {log.where}")
        results.append(IngestResult(
            path=str(log.path), run=log.run_name or None, format=log.fmt,
            format_from=log.fmt_from, sweep=opts.sweep, run_id=run_id, action=action,
            steps=len(log.steps), rows=rows, params_from=plan.config["ingest"]["params_from"],
            sources=dict(log.sources), unmapped=sorted(log.unmapped),
            skipped_lines=[[line, why] for line, why in log.bad_lines],
            duplicates=log.duplicates, notes=plan.notes, **plan.columns,
        ))
        seen[plan.cell_id] = results[-1]
    return results
