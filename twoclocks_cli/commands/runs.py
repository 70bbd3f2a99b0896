"""`twoclocks runs`: list runs, show one run's config, history and metrics, delete runs."""

import json
from typing import Annotated

import typer

from twoclocks_cli.core.numbers import num as fmt
from twoclocks_cli.options import (
    DbOption,
    ForceOption,
    JsonOption,
    KeysOption,
    YesOption,
    parse_keys,
)
from twoclocks_cli.render.jsonout import print_json
from twoclocks_cli.render.tables import console

app = typer.Typer(help="Runs in the store.", no_args_is_help=True)


@app.command("list")
def list_(
    sweep: Annotated[str | None, typer.Option("--sweep", help="Only runs of this sweep.")] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """List runs (all, or those of one sweep)."""
    from twoclocks_cli.store import Store
    from twoclocks_cli.store.records import run_record

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
    from twoclocks_cli.store.records import show_record

    store = Store.open(db)
    rec = show_record(store, store.find_run(run_ref), parse_keys(keys))
    if as_json:
        print_json(rec)
        return
    out = console()
    for table in _show_tables(rec):
        out.print(table)


# -- runs delete ----------------------------------------------------------------------------


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
    from twoclocks_cli.launch import delete as deletion
    from twoclocks_cli.render import deletion as say
    from twoclocks_cli.store import Store

    store = Store.open(db)
    runs = list({r.id: r for r in (store.find_run(ref) for ref in run_refs)}.values())
    busy = deletion.prepare(store, runs, force)
    ids = [r.id for r in runs]
    what = f"run {ids[0]}" if len(ids) == 1 else f"{len(ids)} runs ({', '.join(map(str, ids))})"
    say.confirm(what, {"metrics": store.count_metrics_of(ids)}, yes)
    notes, counts = deletion.execute(store, busy, lambda refuse: store.delete_runs(ids, refuse))
    say.report(what, notes, counts, as_json)
