"""The run row of `twoclocks train`: a new row and its workdir, or the row a workdir's run.json
names (a resume, checked before anything is written); its status while it trains; its --json
summary. The command parses, calls these and renders; the bookkeeping lives here, beside the
sweep jobs' (`launch.sweeps`, `launch.owner`)."""

from __future__ import annotations

import os
from pathlib import Path


def check_calibration(store, cfg, workdir: Path | None, source: str) -> None:
    """A fresh adaptive run calibrates from `adaptive.from_sweep` in this store when it starts:
    the sweep and its analysis must be there (a resumed run carries its calibration in its
    checkpoint)."""
    from trainer import checkpoint
    from twoclocks_cli.launch.sweeps import check_calibration as check_cells

    if workdir is not None and Path(workdir).exists() and checkpoint.latest(workdir) is not None:
        return
    check_cells(store, [cfg.model_dump(mode="json")], source, "adaptive.from_sweep")


def _owned_run(store, workdir: Path):
    """The run `workdir/run.json` names, in this store and still there; else one ConfigError."""
    from trainer.ownership import describe
    from twoclocks_cli.core.errors import ConfigError, NotFoundError
    from twoclocks_cli.launch import owner
    from twoclocks_cli.store.engine import store_identity

    rec = owner.read(workdir) or {}
    here = store_identity(store.engine.url)
    where = f"--workdir {workdir}"
    if rec.get("store") is None:
        raise ConfigError(f"{where}: its {owner.RUN_FILE} names no store (written by an older "
                          "twoclocks): resume refused; use another --workdir")
    if rec.get("store") != here:
        raise ConfigError(f"{where} belongs to {describe(rec)}, not to a run of {here}: "
                          "resume refused; use another --workdir")
    try:
        run = store.get_run(int(rec["run_id"]))
    except (NotFoundError, KeyError, TypeError, ValueError):
        run = None
    if run is None or run.cell_id != rec.get("cell_id"):
        raise ConfigError(f"{where} belongs to {describe(rec)} (cell {rec.get('cell_id')}), "
                          f"which that store no longer holds: resume refused; use another "
                          "--workdir")
    return run


def resume_row(store, cfg, workdir: Path, extend: bool) -> int:
    """The run `workdir/run.json` names, checked: same store, the run still there, the same
    config (or only a larger sample_budget with `extend`, then stored), its checkpoint its own.
    Every refusal is one ConfigError, raised before anything is written."""
    from trainer import checkpoint
    from trainer.ownership import CheckpointOwner, config_refusal
    from twoclocks_cli.core.errors import ConfigError
    from twoclocks_cli.store.engine import store_identity

    run = _owned_run(store, workdir)
    config = cfg.model_dump(mode="json")
    why = config_refusal(run.config, config, extend)
    if why:
        raise ConfigError(f"--workdir {workdir}: run {run.id}: {why}")
    ckpt = checkpoint.latest(workdir)
    if ckpt is not None:
        why = CheckpointOwner(config, store_identity(store.engine.url), run.id).refusal(
            ckpt, extend)
        if why:
            raise ConfigError(why)
    if config != run.config:  # --extend: the run row says what the run is now trained to
        store.set_run_config(run.id, config)
    return run.id


def _new_row(store, cfg, name: str, workdir: Path | None) -> tuple[int, Path]:
    """A new run row and its workdir (default: a fresh ./twoclocks-train/run-<id>-<uuid> that no
    other store's run can share), the workdir's run.json naming it."""
    import uuid

    from trainer.ownership import config_hash
    from twoclocks_cli.launch import owner

    config = cfg.model_dump(mode="json")
    uid = uuid.uuid4().hex[:8]
    phase = cfg.phase_at(0)[1]
    cell_id = f"train-{config_hash(config)}-{uid}"
    run_id = store.create_run(cell_id, name, "grpo", config, {
        "batch_prompts": phase.prompts_per_batch, "group_size": cfg.group_size,
        "batch_samples": phase.prompts_per_batch * cfg.group_size, "lr": phase.lr,
        "clip_low": phase.clip_eps_low, "clip_high": phase.clip_eps_high, "seed": cfg.seed})
    workdir = workdir if workdir is not None else Path("twoclocks-train") / f"run-{run_id}-{uid}"
    owner.write(workdir, owner.run_record(store.engine.url, run_id, cell_id, config))
    return run_id, workdir


def run_row(store, cfg, name: str, workdir: Path | None, extend: bool = False
            ) -> tuple[int, Path]:
    """(run id, workdir): the run `workdir` names (a resume), else a new row in `workdir`."""
    from trainer import checkpoint
    from trainer.ownership import describe, read_owner
    from twoclocks_cli.core.errors import ConfigError
    from twoclocks_cli.launch import owner

    if workdir is not None and owner.read(workdir) is not None:
        return resume_row(store, cfg, workdir, extend), workdir
    if workdir is not None and (ckpt := checkpoint.latest(workdir)) is not None:
        rec = read_owner(ckpt) or {}
        raise ConfigError(f"--workdir {workdir} holds a checkpoint of {describe(rec)} but "
                          f"no {owner.RUN_FILE}: resume refused; use another --workdir")
    if extend:
        raise ConfigError("--extend continues a run: give the --workdir of the run to extend")
    return _new_row(store, cfg, name, workdir)


def start(store, run_id: int, message: str):
    """Mark the run running on this host; its metric writer."""
    from twoclocks_cli.store.models import RunStatus

    store.set_status(run_id, RunStatus.running, host=os.uname().nodename, message=message)
    return store.metric_writer(run_id)


def finish(store, writer, run_id: int, returned) -> None:
    """Close the writer; the run's status from what training returned."""
    from twoclocks_cli.launch.job import returned_status

    writer.close()
    store.set_status(run_id, returned_status(returned))


def fail(store, writer, run_id: int, err: BaseException) -> None:
    """Close the writer; the run failed (or was cancelled), with the error's one line."""
    from twoclocks_cli.core.errors import TwoclocksError
    from twoclocks_cli.launch.job import failed_status, one_line

    writer.close()
    text = str(err) if isinstance(err, TwoclocksError) else one_line(err)
    store.set_status(run_id, failed_status(err), message=text[:500], error=text[:2000])


def summary(store, run_id: int, workdir: Path) -> dict:
    """The --json summary of `train`: the run's id, name, status, last step and samples, the
    last value of each metric key, and its newest complete checkpoint."""
    from trainer import checkpoint
    from twoclocks_cli.store.engine import mask_url

    run = store.get_run(run_id)
    metrics = store.metric_summary(run_id)
    ckpt = checkpoint.latest(workdir) if Path(workdir).exists() else None
    return {"run_id": run.id, "name": run.name, "status": run.status,
            "steps": max((m["last_step"] for m in metrics.values()), default=0),
            "samples": max((m.get("last_samples") or 0 for m in metrics.values()), default=0),
            "metric_rows": store.count_metrics(run_id),
            "metrics": {k: m.get("last") for k, m in metrics.items()},
            "checkpoint": str(ckpt) if ckpt is not None else None,
            "checkpoint_step": checkpoint_step(workdir), "workdir": str(workdir),
            "db": mask_url(store.url)}


def checkpoint_step(workdir: Path) -> int | None:
    """The step of the newest complete checkpoint in `workdir`, or None."""
    from trainer import checkpoint

    path = checkpoint.latest(workdir) if Path(workdir).exists() else None
    try:
        return int(path.name.split("-")[-1]) if path is not None else None
    except ValueError:
        return None


def samples_at(store, run_id: int, step: int | None) -> int:
    """Samples the run had consumed at `step`, from its stored metrics (0 when unknown)."""
    if not step or store is None:
        return 0
    s = store.load_metric([run_id], "batch_samples").get(run_id)
    if s is None:
        return 0
    hit = [int(x) for st, x in zip(s.steps, s.samples, strict=True) if st == step]
    return hit[-1] if hit else 0
