"""What `twoclocks runs list` and `runs show` print: the runs table, and one run's fields,
config, status history and metrics."""

from __future__ import annotations

import json

import typer

from twoclocks_cli.core.numbers import num as fmt
from twoclocks_cli.render.tables import console


def render_runs(runs: list, url: str, sweep: str | None) -> None:
    """One row per run (store.models.Run) of the store at `url` (or of one sweep)."""
    from rich.table import Table

    table = Table(title=f"runs in {url}" + (f" (sweep {sweep})" if sweep else ""))
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


def render_run(rec: dict) -> None:
    """`runs show`'s tables of one run (a store.records.show_record)."""
    out = console()
    for table in _show_tables(rec):
        out.print(table)


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
