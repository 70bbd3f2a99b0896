"""`twoclocks ingest PATH --follow`: import a log that is still being written, incrementally.

Each time the file changes, it is parsed again: only complete lines count (a partial last line
waits for its newline, see the parsers' cut-last-line rule; once the file is finished — idle,
or its writer exited — a last line without its newline is taken if it is whole) and only steps
whose values are new or changed are upserted, so any number of followers of one file — or a
follower restarted — never duplicates a row. A file that shrinks was rewritten or truncated:
its run is imported afresh. The run is `running` while followed and `completed` once the file
has not changed for `idle` seconds. The run is identified by the file's path (`--identity
path`). A W&B run directory or a TensorBoard run folder is followed as one file: it changed when
its logs' total size or newest change did.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from twoclocks_cli.ingest import base, detect
from twoclocks_cli.ingest.importer import (
    IngestResult,
    _resolve,
    _upsert_run,
    _write,
    parse_file,
    with_format,
)


@dataclasses.dataclass
class _Followed:
    """What the follower knows of the file and its run between polls."""

    size: int | None = None
    mtime: float | None = None
    run_id: int | None = None
    written: dict = dataclasses.field(default_factory=dict)  # step -> (samples, values)
    last: IngestResult | None = None
    opts: base.IngestOptions | None = None  # with the file's format, once it is known
    fmt_from: str = "option"
    unknown: detect.FormatUnknownError | None = None  # the content does not tell its format yet


def follow_file(store, path: Path, opts: base.IngestOptions, idle: float = 30.0,
                poll: float = 1.0, echo: Callable[[str], None] | None = None,
                clock: Callable[[], float] = time.monotonic,
                pid: int | None = None) -> IngestResult:
    """Follow `path` until it has not changed for `idle` seconds (or, with `pid`, until that
    process — the one writing it — has exited and the last change is read)."""
    state = _Followed(opts=dataclasses.replace(opts, identity="path", finished=False))
    quiet_since = clock()
    while True:
        stat = _signature(path)
        changed = stat is not None and stat != (state.size, state.mtime)
        if changed:
            shrank = state.size is not None and stat[0] < state.size
            state.size, state.mtime = stat
            quiet_since = clock()
            n = _sync(store, path, state, fresh=shrank)
            if echo and n:
                echo(f"{path}: run {state.run_id}: {n} new step(s), "
                     f"{len(state.written)} in all" + (" (the file was rewritten)" if shrank
                                                       else ""))
        elif clock() - quiet_since >= idle or (pid is not None and not _alive(pid)):
            break
        time.sleep(poll)
    # the writer is done (idle, or its process exited): a last line without its newline is no
    # longer being written, so it is taken now if it is whole
    state.opts = dataclasses.replace(state.opts, finished=True)
    if (stat := _signature(path)) is not None:
        shrank = state.size is not None and stat[0] < state.size
        n = _sync(store, path, state, fresh=shrank)
        if echo and n:
            echo(f"{path}: run {state.run_id}: {n} new step(s) once the file was finished, "
                 f"{len(state.written)} in all")
    if state.run_id is None and state.unknown is not None:
        raise state.unknown
    if state.run_id is None:
        raise base.NoStepsError(
            f"{path}: no training step appeared within {idle:g} s of the last change "
            "(--idle waits longer)")
    from twoclocks_cli.store.models import RunStatus

    store.set_status(state.run_id, RunStatus.completed,
                     message=f"followed {path}: unchanged for {idle:g} s")
    state.last.action = "followed"
    return state.last


def _signature(path: Path) -> tuple[int, float] | None:
    """(size, mtime) of the file; of a run folder, its logs' total size and newest mtime."""
    if path.is_file():
        stat = path.stat()
        return stat.st_size, stat.st_mtime
    if not path.is_dir():
        return None
    stats = [f.stat() for f in path.rglob("*") if f.is_file() and (
        f.suffix == ".wandb" or f.name.startswith("events.out.tfevents."))]
    return (sum(s.st_size for s in stats), max(s.st_mtime for s in stats)) if stats else None


def _alive(pid: int) -> bool:
    """Whether process `pid` (the writer) still runs: the launcher's own check."""
    from twoclocks_cli.core.process import pid_alive

    return pid_alive(pid)


def _sync(store, path: Path, state: _Followed, fresh: bool) -> int:
    """Parse the file again and upsert what is new; returns the number of steps written."""
    from twoclocks_cli.store.models import RunStatus

    if state.opts.fmt is None:  # told from the content once there is some; kept from then on
        try:
            state.opts, state.fmt_from = with_format(path, state.opts)
        except detect.FormatUnknownError as exc:  # an empty file, a header not written yet
            state.unknown = exc
            return 0
        state.unknown = None
    opts = state.opts
    try:
        plan = _resolve(parse_file(path, opts), opts)
    except base.NoStepsError:
        return 0  # no step yet (the run is starting): wait
    plan.log.fmt_from = state.fmt_from
    run_id, _ = _upsert_run(store, plan, opts.sweep, plan.log.fmt, keep_metrics=not fresh)
    if fresh or run_id != state.run_id:
        state.written = {} if fresh else state.written
    state.run_id = run_id
    # running before its first metric lands: a reader never sees stored steps of a `planned` run
    if store.get_run(run_id).status != RunStatus.running.value:
        store.set_status(run_id, RunStatus.running, message=f"following {path}")
    n = _write(store, run_id, plan, skip=state.written)
    state.written = {s: (plan.samples[s], v) for s, v in plan.log.steps.items() if v}
    log = plan.log
    state.last = IngestResult(
        path=str(path), run=log.run_name or None, format=log.fmt, format_from=log.fmt_from,
        sweep=opts.sweep, run_id=run_id, action="followed",
        steps=len(log.steps), rows=sum(len(v) for v in log.steps.values()),
        params_from=plan.config["ingest"]["params_from"], sources=dict(log.sources),
        unmapped=sorted(log.unmapped), skipped_lines=[[ln, why] for ln, why in log.bad_lines],
        duplicates=log.duplicates, notes=plan.notes, **plan.columns)
    return n
