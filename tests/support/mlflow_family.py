"""A nested MLflow sweep written by the real mlflow library into an SQLite store (a parent run
holding params only, runs started under it with `mlflow.start_run(nested=True)` logging metrics
by step, as HF's MLflowCallback does with MLFLOW_NESTED_RUN), and readers of what an import of it
stored."""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import warnings
from pathlib import Path

import pytest

from tests.support.cli import twoclocks_inproc

PARENT = {"num_generations": 8, "learning_rate": 2.0 ** -10, "seed": 7}
# grpo-bs4 logs what HF's MLflowCallback logs for TRL's GRPOConfig (its own lr and seed);
# grpo-bs8, what a hand-written sweep logs: its batch only, the rest in the parent
CHILDREN = {
    "grpo-bs4": {"learning_rate": 2.0 ** -11, "per_device_train_batch_size": 32,
                 "gradient_accumulation_steps": 1, "num_generations": 8,
                 "generation_batch_size": 32, "steps_per_generation": 1, "num_iterations": 1,
                 "seed": 42},
    "grpo-bs8": {"prompts_per_batch": 8},
}
STEPS = {"grpo-bs4": 6, "grpo-bs8": 4, "other": 3}
OTHER = {"prompts_per_batch": 16, "group_size": 4, "learning_rate": 2.0 ** -9}


def reward(run: str, step: int) -> float:
    """The reward a run logs at a step: multiples of 1/1024, exact in every float."""
    return (100 + 7 * step + 3 * len(run)) / 1024


def _log_steps(mlflow, run: str) -> None:
    for s in range(1, STEPS[run] + 1):
        mlflow.log_metrics({"reward": reward(run, s), "loss": s / 1024}, step=s)


def write_family(db: Path) -> Path:
    """`db`, an SQLite MLflow store: experiment 'sweep' with the parent 'hf-sweep' (params only)
    and its two nested runs; experiment 'other' with a plain run also named 'grpo-bs4'."""
    import mlflow
    from mlflow.tracking import fluent
    from mlflow.tracking._tracking_service import utils

    chatty = logging.getLogger("mlflow")
    level = chatty.level
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MLflow's own deprecation notes, writing its store
        # the fluent API's globals, put back after
        for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME",
                    "MLFLOW_RUN_ID"):
            mp.delenv(var, raising=False)
        mp.setattr(utils, "_tracking_uri", utils._tracking_uri)
        mp.setattr(fluent, "_active_experiment_id", None)
        chatty.setLevel(logging.WARNING)
        try:
            mlflow.set_tracking_uri(f"sqlite:///{db}")
            mlflow.set_experiment("sweep")
            with mlflow.start_run(run_name="hf-sweep"):
                mlflow.log_params(PARENT)
                for name, params in CHILDREN.items():
                    with mlflow.start_run(run_name=name, nested=True):
                        mlflow.log_params(params)
                        _log_steps(mlflow, name)
            mlflow.set_experiment("other")
            with mlflow.start_run(run_name="grpo-bs4"):
                mlflow.log_params(OTHER)
                for s in range(1, STEPS["other"] + 1):
                    mlflow.log_metrics({"reward": reward("other", s)}, step=s)
        finally:
            mlflow.set_tracking_uri(None)
            chatty.setLevel(level)
    return db


def ingest(db: Path, url: str, *args: str) -> tuple[int, list[dict], str]:
    """(exit code, the --json results, stderr) of an in-process `twoclocks ingest`."""
    r = twoclocks_inproc("ingest", str(db), "--sweep", "nested", "--db", url, "--json", *args)
    return r.returncode, (json.loads(r.stdout) if r.returncode == 0 else []), r.stderr


def content(url: str) -> dict[str, list]:
    """Every row of every table of a twoclocks SQLite store."""
    con = sqlite3.connect(url[len("sqlite:///"):])
    try:
        tables = [r[0] for r in con.execute("select name from sqlite_master where type='table'")]
        return {t: sorted(map(repr, con.execute(f"select * from {t}"))) for t in tables}
    finally:
        con.close()


def digest(path: Path) -> str:
    """A file's SHA-256 (a source an import only reads keeps it)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()
