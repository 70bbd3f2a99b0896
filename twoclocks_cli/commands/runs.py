"""`twoclocks runs`: list runs, show one run's config, history and metrics, delete runs."""

import json
from typing import Annotated

import typer

from twoclocks_cli.options import DbOption, JsonOption
from twoclocks_cli.render.jsonout import print_json
from twoclocks_cli.render.tables import console

app = typer.Typer(help="Runs in the store.", no_args_is_help=True)

# table → (one, many) in messages
ROWS = {"metrics": ("metric row", "metric rows"),
        "run_events": ("status event", "status events"), "analyses": ("analysis", "analyses"),
        "runs": ("run", "runs"), "sweeps": ("sweep", "sweeps")}
BUSY = ("submitted", "running")  # statuses a delete refuses unless --force cancels them

KeysOption = Annotated[str | None, typer.Option(
    "--keys", help="Comma-separated metric keys (default: every key the run logged).")]
YesOption = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
ForceOption = Annotated[bool, typer.Option(
    "--force", help="Cancel submitted/running runs first, then delete (runs delete: local "
    "cells only; sweeps delete: the whole sweep, as `twoclocks cancel`).")]


def run_record(run) -> dict:
    """A run as plain JSON-ready values (the --json schema of `runs list`)."""
    return {
        "id": run.id,
        "sweep_id": run.sweep_id,
        "sweep": run.sweep.name if run.sweep is not None else None,
        "cell_id": run.cell_id,
        "name": run.name,
        "backend": run.backend,
        "batch_prompts": run.batch_prompts,
        "group_size": run.group_size,
        "batch_samples": run.batch_samples,
        "lr": run.lr,
        "clip_low": run.clip_low,
        "clip_high": run.clip_high,
        "seed": run.seed,
        "status": run.status,
        "job_id": run.job_id,
        "host": run.host,
        "attempts": run.attempts,
        "error": run.error,
        "created_at": run.created_at.isoformat() if run.created_at else None,
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
    }


def fmt(x) -> str:
    """A number for a table (the shared rule: render.tables.num)."""
    from twoclocks_cli.core.numbers import num

    return num(x)


def parse_keys(text: str | None) -> list[str] | None:
    """`--keys a,b` as a list (None: all keys); an empty list is refused."""
    from twoclocks_cli.core.errors import ConfigError

    if text is None:
        return None
    keys = [k.strip() for k in text.split(",") if k.strip()]
    if not keys:
        raise ConfigError(f"--keys {text!r}: name at least one metric key")
    return list(dict.fromkeys(keys))


def check_keys(store, run_ids: list[int], keys: list[str] | None, what: str) -> list[str]:
    """The keys to use: all logged ones, or `keys` after checking each was logged."""
    from twoclocks_cli.core.errors import NotFoundError

    known = store.metric_keys(run_ids)
    if keys is None:
        return known
    unknown = [k for k in keys if k not in known]
    if unknown:
        shown = ", ".join(known[:30]) + (" ..." if len(known) > 30 else "")
        raise NotFoundError(f"--keys {unknown[0]!r}: not logged by {what} "
                            f"(keys: {shown or 'none'})")
    return keys


@app.command("list")
def list_(
    sweep: Annotated[str | None, typer.Option("--sweep", help="Only runs of this sweep.")] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """List runs (all, or those of one sweep)."""
    from twoclocks_cli.store import Store

    store = Store.open(db)
    runs = store.list_runs(sweep)
    if as_json:
        print_json([run_record(r) for r in runs])
        return
    from rich.table import Table

    table = Table(title=f"runs in {store.url}" + (f" (sweep {sweep})" if sweep else ""))
    for col in ("id", "sweep", "name", "backend", "prompts", "samples/batch", "lr", "seed",
                "status"):
        table.add_column(col)
    for r in runs:
        table.add_row(
            str(r.id), r.sweep.name if r.sweep is not None else "-", r.name, r.backend,
            fmt(r.batch_prompts), fmt(r.batch_samples),
            f"{r.lr:.3g}" if r.lr is not None else "-", fmt(r.seed), r.status,
        )
    console().print(table)
    if not runs:
        typer.echo("no runs yet")


# -- runs show ------------------------------------------------------------------------------


def show_record(store, run, keys: list[str] | None) -> dict:
    """Everything `runs show` prints: the run, its config, status history, metric summary."""
    keys = check_keys(store, [run.id], keys, f"run {run.id}")
    events = [{"at": e.at.isoformat(), "from": e.from_status, "to": e.to_status,
               "message": e.message} for e in store.events(run.id)]
    summary = store.metric_summary(run.id, keys) if keys else {}
    return {"run": run_record(run), "config": run.config or {}, "events": events,
            "metrics": summary}


def _flat(config: dict, prefix: str = "") -> list[tuple[str, str]]:
    """Nested config → (dotted.key, value) rows; lists shown as compact JSON."""
    rows = []
    for k, v in config.items():
        if isinstance(v, dict) and v:
            rows += _flat(v, f"{prefix}{k}.")
        else:
            text = v if isinstance(v, str) else json.dumps(v, default=str)
            rows.append((f"{prefix}{k}", text if len(text) <= 100 else text[:97] + "..."))
    return rows


def _show_tables(rec: dict) -> list:
    """The rich tables of `runs show`: run, config, status history, metrics."""
    from rich.table import Table

    r = rec["run"]
    head = Table(title=f"run {r['id']}: {r['name']}", show_header=False)
    head.add_column("field", style="bold")
    head.add_column("value", overflow="fold")
    batch = (f"{fmt(r['batch_prompts'])} prompts x {fmt(r['group_size'])} = "
             f"{fmt(r['batch_samples'])} samples" if r["batch_samples"] else "-")
    clip = (f"{r['clip_low']:g} / {r['clip_high']:g}" if r["clip_low"] is not None
            and r["clip_high"] is not None else "-")
    for name, value in (
        ("sweep", f"{r['sweep']} (id {r['sweep_id']})" if r["sweep"] else "- (standalone)"),
        ("cell", r["cell_id"]), ("backend", r["backend"]), ("batch", batch),
        ("lr", f"{r['lr']:.4g}" if r["lr"] is not None else "-"), ("clip low/high", clip),
        ("seed", fmt(r["seed"])), ("status", r["status"]), ("job", r["job_id"] or "-"),
        ("host", r["host"] or "-"), ("attempts", fmt(r["attempts"])),
        ("error", r["error"] or "-"), ("created", r["created_at"] or "-"),
        ("started", r["started_at"] or "-"), ("finished", r["finished_at"] or "-"),
    ):
        head.add_row(name, str(value))
    config = Table(title="config")
    config.add_column("key", no_wrap=True)
    config.add_column("value", overflow="fold")
    for k, v in _flat(rec["config"]):
        config.add_row(k, v)
    history = Table(title="status history")
    for col in ("at", "from", "to", "message"):
        history.add_column(col, overflow="fold", no_wrap=col == "at")
    for e in rec["events"]:
        history.add_row(e["at"][:19], e["from"] or "-", e["to"], e["message"] or "")
    metrics = Table(title=f"metrics ({len(rec['metrics'])} keys)")
    for col in ("key", "n", "steps", "samples", "min", "max", "last"):
        metrics.add_column(col, justify="left" if col == "key" else "right", no_wrap=True)
    for key, m in rec["metrics"].items():
        n = fmt(m["n"]) + (f" ({fmt(m['n_nan'])} nan)" if m["n_nan"] else "")
        metrics.add_row(key, n, f"{fmt(m['first_step'])}-{fmt(m['last_step'])}",
                        f"{fmt(m['first_samples'])}-{fmt(m['last_samples'])}", fmt(m["min"]),
                        fmt(m["max"]), fmt(m["last"]))
    return [head, config, history, metrics]


@app.command("show")
def show(
    run_ref: Annotated[str, typer.Argument(metavar="RUN", help="Run id (or a unique run name).")],
    keys: KeysOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show one run: cell parameters, config, status history, and per metric key the number
    of points, first/last step and samples, min/max and last value."""
    from twoclocks_cli.store import Store

    store = Store.open(db)
    rec = show_record(store, store.find_run(run_ref), parse_keys(keys))
    if as_json:
        print_json(rec)
        return
    out = console()
    for table in _show_tables(rec):
        out.print(table)


# -- runs delete ----------------------------------------------------------------------------


def prepare_delete(store, runs: list, force: bool, alone: bool = True) -> list:
    """Reconcile the runs' jobs, then refuse busy runs (unless --force and, with `alone`, each
    can be cancelled by itself). Returns the busy runs; nothing is changed on a refusal."""
    from twoclocks_cli.core.errors import ConfigError, LaunchError
    from twoclocks_cli.launch import runcancel, sweeps

    for name in sorted({r.sweep.name for r in runs if r.sweep is not None}):
        sweeps.refresh(store, name)  # a job that died is not "running" any more
    runs = [store.get_run(r.id) for r in runs]
    busy = [r for r in runs if r.status in BUSY]
    if busy and not force:
        r = busy[0]
        more = f" (and {len(busy) - 1} more)" if len(busy) > 1 else ""
        raise ConfigError(f"run {r.id} ({r.name}) is {r.status}{more}: not deleted; pass "
                          "--force to cancel it first")
    for r in busy if alone else []:
        reason = runcancel.why_not(r)
        if reason is not None:
            raise LaunchError(f"{reason} (nothing deleted)")
    return busy


def confirm(what: str, counts: dict[str, int], yes: bool) -> None:
    """Ask before deleting (unless --yes); 'no' exits 1 with nothing changed."""
    if yes:
        return
    rows = ", ".join(f"{fmt(n)} {ROWS[t][n != 1]}" for t, n in counts.items() if n)
    if not typer.confirm(f"Delete {what} ({rows or 'no rows'})?", default=False, err=True):
        typer.echo("nothing deleted", err=True)
        import click

        raise click.exceptions.Exit(1)  # a plain exit 1 (the CLI reports typer.Exit as a bug)


def do_delete(store, busy: list, delete_fn, cancel=None) -> tuple[list[str], dict[str, int]]:
    """Cancel the busy runs (one by one, or with `cancel()` when given), then run
    `delete_fn(refuse)` (one transaction, refusing any run still busy)."""
    from twoclocks_cli.launch import runcancel

    if cancel is not None and busy:
        notes = cancel()
    else:
        notes = [runcancel.cancel_run(store, r) for r in busy]
    return notes, delete_fn(BUSY)


def report_delete(what: str, notes: list[str], counts: dict[str, int], as_json: bool) -> None:
    """Say what was deleted (a line, or JSON with the per-table row counts)."""
    if as_json:
        print_json({"deleted": what, "cancelled": notes, "rows": counts})
        return
    for note in notes:
        typer.echo(note)
    typer.echo(f"deleted {what}: " + ", ".join(f"{fmt(n)} {ROWS[t][n != 1]}"
                                               for t, n in counts.items()))


@app.command("delete")
def delete(
    run_refs: Annotated[list[str], typer.Argument(metavar="RUN...", help="Run ids (or unique "
                                                  "run names).")],
    yes: YesOption = False,
    force: ForceOption = False,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Delete runs with their metrics, status history and the stored analyses that used them,
    in one transaction. Submitted/running runs are refused unless --force."""
    from twoclocks_cli.store import Store

    store = Store.open(db)
    runs = list({r.id: r for r in (store.find_run(ref) for ref in run_refs)}.values())
    busy = prepare_delete(store, runs, force)
    ids = [r.id for r in runs]
    what = f"run {ids[0]}" if len(ids) == 1 else f"{len(ids)} runs ({', '.join(map(str, ids))})"
    confirm(what, {"metrics": store.count_metrics_of(ids)}, yes)
    notes, counts = do_delete(store, busy, lambda refuse: store.delete_runs(ids, refuse))
    report_delete(what, notes, counts, as_json)
