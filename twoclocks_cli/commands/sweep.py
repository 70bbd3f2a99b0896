"""`twoclocks sweep CONFIG`, `twoclocks cancel SWEEP` (`sweeps list` is in sweeps.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from twoclocks_cli.options import ConfigArg, DbOption, JsonOption
from twoclocks_cli.render.jsonout import print_json, stdout_to_stderr

ExecutorOption = Annotated[
    str | None,
    typer.Option("--executor", help="Override the config's executor: local, slurm, debug, auto."),
]


def sweep(
    config: ConfigArg,
    retry_failed: Annotated[bool, typer.Option(
        "--retry-failed", help="Also resubmit failed and cancelled cells.")] = False,
    wait: Annotated[bool, typer.Option(
        "--wait", help="Follow with a live table; exit 1 if a cell failed.")] = False,
    executor: ExecutorOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Register CONFIG's cells and submit the pending ones as one batch (one job array).

    Re-running submits nothing completed or running; a changed config adds its new cells.
    With --json: one document (counts, and per cell its run id, submitted or skipped, status).
    """
    from twoclocks_cli.config import load_plan
    from twoclocks_cli.launch import sweeps
    from twoclocks_cli.launch.monitor import snapshot, watcher
    from twoclocks_cli.render.status import follow, sweep_table, wait_quietly
    from twoclocks_cli.render.tables import console
    from twoclocks_cli.render.warnings import print_warnings
    from twoclocks_cli.store import Store
    from twoclocks_cli.store.engine import resolve_url

    sweeps.check_executor(executor)
    p = load_plan(config)
    cfg = p.config
    print_warnings(p.warnings)
    ex = sweeps.choose_executor(cfg, executor)
    url = sweeps.absolute_db_url(db or cfg.store or resolve_url(None))
    store = Store.open(url)
    with stdout_to_stderr(as_json):  # a debug cell runs here: its output is not the JSON
        reg = sweeps.register(store, p, str(config))
        runs = sweeps.to_submit(store, reg, retry_failed)
        job_ids = sweeps.submit(store, reg, runs, ex, url)
        typer.echo(f"sweep {cfg.name}: {len(p.cells)} cells ({reg.new} new), submitted "
                   f"{len(job_ids)} via {ex.name}" + (f" to {store.url}" if job_ids else ""),
                   err=as_json)
        if wait:
            watch = watcher(store, cfg.name)
            snap = wait_quietly(watch) if as_json else follow(watch, cfg.name)
        else:
            snap = snapshot(store, cfg.name)
    mine = [r for r in snap["runs"] if r["cell_id"] in reg.runs]
    if as_json:
        print_json(sweep_record(cfg, ex.name, store.url, reg, job_ids, mine, p.warnings, wait))
    elif not wait:
        console().print(sweep_table(snap, cfg.name))
    if wait:
        bad = [r for r in mine if r["status"] in ("failed", "cancelled", "lost")]
        if bad:
            typer.echo(f"{len(bad)} cell(s) failed, were cancelled or lost: "
                       + "; ".join(f"run {r['id']}: {r['error'] or r['status']}" for r in bad[:3]),
                       err=True)
            raise typer.Exit(1)


def sweep_record(cfg, executor: str, url, reg, job_ids: dict, runs: list[dict],
                 warnings: list[str], waited: bool) -> dict:
    """The --json document of `sweep`: what was registered, submitted and skipped; per cell of
    the current plan its run id, parameters, action and status (after --wait: the final one)."""
    from twoclocks_cli.store.engine import mask_url

    cells = [{"run_id": r["id"], "cell_id": r["cell_id"], "name": r["name"],
              "batch_prompts": r["batch_prompts"], "group_size": r["group_size"],
              "batch_samples": r["batch_samples"], "lr": r["lr"], "seed": r["seed"],
              "action": "submitted" if r["id"] in job_ids else "skipped",
              "status": r["status"], "job_id": r["job_id"], "attempts": r["attempts"],
              "last_step": r["last_step"], "error": r["error"]} for r in runs]
    return {"sweep": cfg.name, "backend": cfg.backend, "executor": executor,
            "db": mask_url(url), "folder": reg.folder, "cells": len(cells),
            "registered": {"new": reg.new, "existing": reg.existing},
            "submitted": sum(c["action"] == "submitted" for c in cells),
            "skipped": sum(c["action"] == "skipped" for c in cells),
            "waited": waited, "warnings": list(warnings), "runs": cells}


def cancel(
    sweep_name: Annotated[str, typer.Argument(metavar="SWEEP", help="Sweep to cancel.")],
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel every planned, submitted or running cell of SWEEP (one scheduler call)."""
    from twoclocks_cli.core.errors import LaunchError
    from twoclocks_cli.launch import sweeps
    from twoclocks_cli.store import Store

    store = Store.open(db)
    before = {r.id: r.status for r in store.list_runs(sweep_name)} if as_json else {}
    n, problems = sweeps.cancel(store, sweep_name)
    if as_json:
        print_json(cancel_record(store, sweep_name, n, before, problems))
    else:
        typer.echo(f"sweep {sweep_name}: cancelled {n} cell(s)")
    if problems:
        raise LaunchError("cells marked cancelled, but stopping their jobs failed: "
                          + "; ".join(problems))


def cancel_record(store, sweep: str, n: int, before: dict[int, str], problems: list[str]
                  ) -> dict:
    """The --json document of `cancel`: how many cells were cancelled, and per run of the
    sweep its status before and after."""
    runs = [{"run_id": r.id, "cell_id": r.cell_id, "before": before.get(r.id),
             "status": r.status} for r in store.list_runs(sweep)]
    return {"sweep": sweep, "cancelled": n, "problems": problems, "runs": runs}
