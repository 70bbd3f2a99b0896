"""The rules the W&B, MLflow and TensorBoard importers share, on small inputs: format detection,
the config names a run's settings are read from, tracker key names, --follow's refusals, and
that importing a plain log loads none of the trackers' libraries."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from tests.support.cli import assert_one_line_error, twoclocks_inproc
from twoclocks_cli.ingest import detect, scalars, wandb_csv


@pytest.mark.parametrize("header, panel", [
    (["Step", "bs32 - critic/score/mean", "bs32 - critic/score/mean__MIN"], True),
    (["Step", "a - b - reward"], True),  # a run name with ' - ' in it
    (["trainer/global_step", "bs32 - reward", "bs32 - reward__MAX"], True),
    (["trainer/global_step", "bs32 - reward"], False),  # no __MIN/__MAX and no 'Step'
    (["step", "reward_mean"], False),
    (["Step", "bs32 - reward", "loss"], False),
])
def test_a_wandb_panel_header(header, panel):
    assert wandb_csv.is_panel_header(header) is panel


def test_detection_of_each_source_from_its_content(tmp_path):
    panel = tmp_path / "export.csv"
    panel.write_text('"Step","bs32 - reward","bs32 - reward__MIN","bs32 - reward__MAX"\n'
                     "1,0.5,0.5,0.5\n")
    plain = tmp_path / "plain.csv"
    plain.write_text("step,reward_mean\n1,0.5\n")
    wandb = tmp_path / "run-abc.log"  # named like anything: the header tells
    wandb.write_bytes(b":W&B\xe1\xbe\x00")
    store = tmp_path / "twoclocks.db"
    sqlite3.connect(store).execute("create table runs (id integer)").connection.commit()
    mlflow = tmp_path / "mlflow.db"
    con = sqlite3.connect(mlflow)
    for table in ("experiments", "runs", "metrics", "params"):
        con.execute(f"create table {table} (id integer)")
    con.commit()
    con.close()
    mlruns = tmp_path / "mlruns" / "0"
    mlruns.mkdir(parents=True)
    (mlruns / "meta.yaml").write_text("name: Default\n")
    tb = tmp_path / "tb" / "a" / "b"
    tb.mkdir(parents=True)
    (tb / "events.out.tfevents.1.host.1.0").write_bytes(b"")
    found = {p: detect.detect(p, 1 << 20)[0] for p in
             (panel, plain, wandb, mlflow, mlruns.parent, tmp_path / "tb")}
    assert list(found.values()) == ["wandb-csv", "csv", "wandb", "mlflow", "mlflow",
                                    "tensorboard"]
    with pytest.raises(detect.FormatUnknownError, match="an SQLite database without MLflow"):
        detect.detect(store, 1 << 20)


def test_a_runs_settings_from_its_config():
    verl = {"data": {"train_batch_size": 16, "seed": 1},
            "actor_rollout_ref": {"rollout": {"n": 8}, "actor": {"optim": {"lr": 1e-6}}},
            "critic": {"optim": {"lr": 1e-5}}}
    params, origin = scalars.config_params(verl)
    assert params == {"batch_prompts": 16, "group_size": 8, "lr": 1e-6, "seed": 1}
    assert origin["lr"] == "actor_rollout_ref.actor.optim.lr"
    # MLflow keeps params as strings, verl's logger joins their keys with '/'
    params, _ = scalars.config_params({"data/train_batch_size": "32",
                                       "actor_rollout_ref/rollout/n": "4", "lr": "None"})
    assert params == {"batch_prompts": 32, "group_size": 4}
    # two lrs ending longer keys say nothing; a flat name at the top says it
    params, _ = scalars.config_params({"actor": {"optim": {"lr": 1}}, "critic": {"lr": 2}})
    assert "lr" not in params
    params, origin = scalars.config_params({"learning_rate": 3e-4, "num_generations": 8,
                                            "per_device_train_batch_size": 4})
    assert params == {"lr": 3e-4, "group_size": 8} and origin["group_size"] == "num_generations"


def test_a_trl_runs_prompts_per_step_from_its_grpo_config():
    """What HF's W&B and MLflow callbacks log of a GRPOConfig (its to_dict(): no world size):
    prompts per step = 4 per device x processes x 2 accumulation / 4 generations, the
    processes told by generation_batch_size = 4 per device x processes x steps_per_generation."""
    pytest.importorskip("trl")
    from pathlib import Path

    from trl import GRPOConfig

    from twoclocks_cli.ingest.base import IngestOptions

    config = GRPOConfig(output_dir="unused", per_device_train_batch_size=4,
                        gradient_accumulation_steps=2, num_generations=4, report_to=[],
                        use_cpu=True, bf16=False, learning_rate=3e-6).to_dict()
    assert (config["generation_batch_size"], config["steps_per_generation"]) == (8, 2)
    # one process here; on 2, GRPOConfig would have made generation_batch_size 4 x 2 x 2
    for processes in (1, 2):
        run = scalars.TrackedRun(
            key="r", name="r", sha256="0", size=0,
            config={**config, "generation_batch_size": 8 * processes},
            steps={1: {"reward": 0.5}, 2: {"reward": 0.6}})
        log = scalars.to_log(run, Path("x"), "wandb", IngestOptions())
        assert log.params == {"batch_prompts": 2 * processes, "group_size": 4, "lr": 3e-6,
                              "seed": 42}
        assert log.params_from["batch_prompts"] == "config (TRL's GRPOConfig)"
    run.config["num_iterations"] = 3  # 16 completions a step do not divide by 3: unknown
    assert "batch_prompts" not in scalars.to_log(run, Path("x"), "wandb", IngestOptions()).params


@pytest.mark.parametrize("key, console", [
    ("train/reward", "reward"), ("eval/rewards/acc/mean", "eval_rewards/acc/mean"),
    ("val-core/gsm8k/reward/mean_at_4", "val-core/gsm8k/reward/mean@4"),
    ("critic/score/mean", "critic/score/mean"),
])
def test_tracker_names_as_the_console_names_them(key, console):
    assert scalars.normal_name(key) == console


def test_follow_refuses_a_store_and_a_folder_of_several_runs(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    proc = twoclocks_inproc("ingest", "--from", "mlflow:sqlite:///x.db", "--follow", "--db", url)
    assert_one_line_error(proc, "an MLflow store is imported whole")
    proc = twoclocks_inproc("ingest", "--from", "wandb:./wandb", "--db", url)
    assert_one_line_error(proc, "--from 'wandb:./wandb': expected mlflow:URI")
    proc = twoclocks_inproc("ingest", "--db", url)
    assert_one_line_error(proc, "nothing to import")
    assert not (tmp_path / "s.db").exists()


@pytest.mark.subprocess
def test_a_plain_import_loads_no_tracker_library(tmp_path):
    log = tmp_path / "run.csv"
    log.write_text("step,reward_mean\n1,0.5\n2,0.6\n")
    code = (
        "import sys\n"
        f"sys.argv = ['twoclocks', 'ingest', {str(log)!r}, '--batch-prompts', '2', "
        f"'--group-size', '2', '--db', 'sqlite:///{tmp_path}/a.db']\n"
        "from twoclocks_cli.app import app\n"
        "try:\n    app()\nexcept SystemExit:\n    pass\n"
        "print('LOADED:' + ' '.join(m for m in ('wandb', 'mlflow', 'tensorboard', 'torch',"
        " 'google.protobuf') if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.strip().splitlines()[-1] == "LOADED:", proc.stdout + proc.stderr
