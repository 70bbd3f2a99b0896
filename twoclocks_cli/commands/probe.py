"""`twoclocks probe RUN --at SAMPLES`: the local critical batch size at one point of a run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from twoclocks_cli.core.limits import INT32_MAX, INT64_MAX
from twoclocks_cli.options import (
    COUNT,
    SAMPLES,
    SEED,
    DbOption,
    JsonOption,
    parse_numbers,
    within,
)
from twoclocks_cli.render.jsonout import print_json
from twoclocks_cli.render.probe import render_grpo_probe, render_sim_probe, stage_text


def probe(
    run_id: Annotated[int, typer.Argument(metavar="RUN", help="The run id to branch.")],
    at: Annotated[float, typer.Option("--at", help="Branch at this many samples of the run.",
                                      callback=within(0, INT64_MAX))],
    batches: Annotated[str, typer.Option(
        "--batches", help="Batch sizes of the branches, in samples (e.g. 8,16,32,64,128).")],
    branch_samples: Annotated[float, typer.Option(
        "--branch-samples", help="Samples each branch may spend.", callback=SAMPLES)],
    seeds: Annotated[int, typer.Option(help="Branches per batch size.", callback=COUNT)] = 3,
    seed: Annotated[int, typer.Option(help="Seed of the sim branches' noise and of the "
                                      "bootstrap.", callback=SEED)] = 0,
    truth: Annotated[bool, typer.Option(
        "--truth/--no-truth", help="Also the theory model's local B_crit from the same state "
        "(sim runs; a dense simulation, seconds to a minute).")] = False,
    eval_every: Annotated[int | None, typer.Option(
        "--eval-every", help="grpo: evaluate each branch every this many samples (default "
        "--branch-samples / 8).", callback=COUNT)] = None,
    window: Annotated[int, typer.Option(
        "--window", help="grpo: moving-average window over a branch's evaluations.",
        callback=COUNT)] = 3,
    target_frac: Annotated[float, typer.Option(
        "--target-frac", help="grpo: the gain target as a share of the best batch's median "
        "gain.", callback=within(0, 1, low_open=True))] = 0.5,
    executor: Annotated[str | None, typer.Option(
        "--executor", help="grpo: local, slurm, debug or auto (default: the run's sweep's).")
    ] = None,
    wait: Annotated[bool, typer.Option(
        "--wait", help="grpo: follow the replay and the branches until they end.")] = False,
    retry_failed: Annotated[bool, typer.Option(
        "--retry-failed", help="grpo: resubmit failed and cancelled cells too.")] = False,
    workdir: Annotated[Path | None, typer.Option(
        "--workdir", help="grpo: folder for the probe sweep's cells (default: beside the "
        "run's sweep, else ./twoclocks-probe).")] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Branch a run at one point over several batch sizes and measure its local B_crit.

    sim runs branch in this process. grpo runs branch real training: a replay of the run to
    --at, then the branches from its checkpoint, as cells of the sweep probe-RUN-atSAMPLES
    through the run's executor; rerun the same command to continue (or pass --wait).
    """
    from twoclocks_cli.core.errors import ConfigError
    from twoclocks_cli.store import Store

    sizes = parse_numbers(batches, "--batches", 1, INT32_MAX)
    store = Store.open(db)
    run = store.get_run(run_id)
    if run.backend == "sim":
        _sim(store, run_id, at, sizes, branch_samples, seeds, seed, truth, as_json)
    elif run.backend == "grpo":
        _grpo(store, run, db, at, sizes, branch_samples, seeds, seed, eval_every, window,
              target_frac, executor, wait, retry_failed, workdir, as_json)
    else:
        why = ("TRL keeps its own checkpoints, which the probe does not branch"
               if run.backend == "trl" else "an imported or external run has no state here")
        raise ConfigError(f"run {run_id} is a {run.backend} run: probe branches sim and grpo "
                          f"runs ({why})")


def _sim(store, run_id, at, sizes, branch_samples, seeds, seed, truth, as_json) -> None:
    """Branch a sim run here; its clocks and local B_crit as tables or --json."""
    import json

    from twoclocks_cli.adaptive.probe.sim import probe_run

    result = probe_run(store, run_id, at, sizes, branch_samples, seeds=seeds, seed=seed,
                       truth=truth)
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=2, allow_nan=False))
        return
    render_sim_probe(result, run_id)


def _grpo(store, run, db, at, sizes, branch_samples, seeds, seed, eval_every, window,
          target_frac, executor, wait, retry_failed, workdir, as_json) -> None:
    """Plan or advance a grpo run's probe (its replay, then its branches, as cells of a sweep);
    once every branch ended, its result."""
    from twoclocks_cli.adaptive.probe import grpo
    from twoclocks_cli.core.errors import LaunchError
    from twoclocks_cli.launch import probe as launch
    from twoclocks_cli.launch.sweeps import absolute_db_url
    from twoclocks_cli.render.jsonout import stdout_to_stderr
    from twoclocks_cli.render.status import follow, wait_quietly
    from twoclocks_cli.store.engine import resolve_url

    probe = grpo.plan(store, run, at, sizes, branch_samples, seeds, eval_every, window,
                      target_frac, workdir)
    ex = launch.executor(probe.parent_sweep_config, executor, probe.sweep)
    url = absolute_db_url(db or resolve_url(None))
    source = f"probe of run {run.id} at {probe.at_samples} samples"
    with stdout_to_stderr(as_json):  # debug cells run here: their output is not the JSON
        stage = launch.advance(store, probe, ex, url, wait, retry_failed, source,
                               follow=wait_quietly if as_json else follow)
    if not stage.done:
        if (bad := launch.failed_branches(store, probe, stage)) is not None:
            raise LaunchError(bad)
        _say_stage(probe, stage, ex.name, as_json)
        return
    result = grpo.result(store, probe, stage.runs, seed=seed)
    if as_json:
        print_json({"state": "done", **result.to_json()})
        return
    render_grpo_probe(result)


def _say_stage(probe, stage, executor: str, as_json: bool) -> None:
    """Where an unfinished probe stands, and how to continue it."""
    if as_json:
        print_json({"state": "running", "run_id": probe.run_id, "sweep": probe.sweep,
                    "at_samples": probe.at_samples, "replay": stage.replay,
                    "branches": stage.branches, "submitted": stage.submitted})
        return
    typer.echo(stage_text(probe, stage, executor))
