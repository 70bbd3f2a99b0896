"""`twoclocks train`'s run row (launch/train_run.py) on a real SQLite store: a new row from the
config, the workdir's run.json naming it, a resume finding it again, and every refusal raised
before anything is written."""

from __future__ import annotations

import json

import pytest

from trainer.config import TrainConfig
from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.launch import train_run
from twoclocks_cli.store import Store


@pytest.fixture
def store(tmp_path):
    return Store.open(f"sqlite:///{tmp_path / 'a.db'}")


def test_a_new_row_carries_the_first_phase_and_its_workdir_names_it(store, tmp_path):
    cfg = TrainConfig(prompts_per_batch=8, group_size=4, lr=3e-5, seed=7)
    run_id, workdir = train_run.run_row(store, cfg, "mine", tmp_path / "wd")
    run = store.get_run(run_id)
    assert (run.name, run.backend, run.batch_prompts, run.batch_samples) == ("mine", "grpo", 8, 32)
    assert (run.lr, run.seed) == (3e-5, 7)
    assert run.config == cfg.model_dump(mode="json")
    record = json.loads((workdir / "run.json").read_text())
    assert (record["run_id"], record["cell_id"]) == (run_id, run.cell_id)
    assert train_run.run_row(store, cfg, "mine", workdir) == (run_id, workdir)  # a resume
    assert len(store.list_runs()) == 1


def test_a_resume_with_another_config_is_refused_unless_only_the_budget_grows(store, tmp_path):
    cfg = TrainConfig()
    run_id, workdir = train_run.run_row(store, cfg, "r", tmp_path / "wd")
    db = tmp_path / "a.db"
    before = db.read_bytes()
    longer = TrainConfig(sample_budget=2 * cfg.sample_budget)
    with pytest.raises(ConfigError, match=r"sample_budget: 32768 -> 65536.*--extend"):
        train_run.run_row(store, longer, "r", workdir)
    with pytest.raises(ConfigError, match="--extend continues a run: give the --workdir"):
        train_run.run_row(store, longer, "r", None, extend=True)
    assert db.read_bytes() == before
    assert train_run.run_row(store, longer, "r", workdir, extend=True) == (run_id, workdir)
    assert store.get_run(run_id).config["sample_budget"] == 2 * cfg.sample_budget


def test_a_workdir_of_another_store_is_refused(store, tmp_path):
    _, workdir = train_run.run_row(store, TrainConfig(), "r", tmp_path / "wd")
    other = Store.open(f"sqlite:///{tmp_path / 'b.db'}")
    with pytest.raises(ConfigError, match="not to a run of .*b.db: resume refused"):
        train_run.run_row(other, TrainConfig(), "r", workdir)
    assert other.list_runs() == []


def test_the_summary_of_a_run_not_trained_yet(store, tmp_path):
    run_id, workdir = train_run.run_row(store, TrainConfig(), "r", tmp_path / "wd")
    rec = train_run.summary(store, run_id, workdir)
    assert rec == {"run_id": run_id, "name": "r", "status": "planned", "steps": 0,
                   "samples": 0, "metric_rows": 0, "metrics": {}, "checkpoint": None,
                   "checkpoint_step": None, "workdir": str(workdir),
                   "db": f"sqlite:///{tmp_path / 'a.db'}"}
