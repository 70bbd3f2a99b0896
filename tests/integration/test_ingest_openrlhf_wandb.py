"""OpenRLHF runs imported as its W&B logger writes them: real W&B offline runs (its WandbLogger's
`define_metric` calls, its config dict: the flat argparse one and the later nested one), from
tests/support/trackers.py. Every value, step, sample count, lr and seed checked is the one the
writer wrote. Writing them starts W&B's service process; the TensorBoard side is
tests/unit/test_ingest_openrlhf.py's."""

from __future__ import annotations

import json

import pytest

from tests.support import trackers as tk
from tests.support.openrlhf_read import EVAL_STEPS, STEPS, assert_written, ingest, logs
from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.ingest import IngestOptions
from twoclocks_cli.ingest.importer import parse_source
from twoclocks_cli.store import Store

NESTED = {"prompts": 16, "group": 8, "lr": 2.0 ** -20, "seed": 5}
pytestmark = pytest.mark.subprocess  # wandb.init starts W&B's service process


@pytest.fixture(scope="module")
def wandb_folder(tmp_path_factory):
    """Three OpenRLHF runs: `one` (one eval source, eval rows on eval/global_step), `two` (two
    eval sources, its PPO logger's eval/epoch axis, seed 7), `three` (dotted options)."""
    root = tmp_path_factory.mktemp("openrlhf-wandb")
    return tk.write_openrlhf_wandb(root, [
        {"name": "one", "config": tk.openrlhf_config(), "steps": tk.openrlhf_steps(),
         "eval_axis": "eval/global_step"},
        {"name": "two", "config": tk.openrlhf_config(seed=7), "eval_axis": "eval/epoch",
         "steps": tk.openrlhf_steps(("gsm8k", "math"))},
        {"name": "three", "nested": True, "eval_axis": "eval/epoch",
         "config": tk.openrlhf_nested_config(**NESTED), "steps": tk.openrlhf_steps()},
    ])


def test_wandb_evaluations_join_training_on_the_global_step(wandb_folder):
    log = logs(wandb_folder)["one"]
    assert_written(log)
    assert log.sources["eval_accuracy"] == "eval/eval_gsm8k_pass1"
    assert log.sources["step"] == "train/global_step"
    assert not any("not steps" in n for n in log.notes), log.notes  # no row left out
    # the step axes and the sample table's fields are no metrics
    assert not {"eval/global_step", "train/global_step"} & log.unmapped
    assert not any(k.startswith("train/generated_samples") for k in log.unmapped)
    assert "eval/eval_gsm8k_pass4" in log.unmapped and "train/score" in log.unmapped
    assert log.duplicates == 0


def test_wandb_config_gives_batch_lr_seed_and_samples(wandb_folder, tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    result = ingest(wandb_folder, "--run", "one", "--db", url, "--json")
    assert result.exit_code == 0, result.output
    [out] = json.loads(result.stdout)
    assert out["params_from"] == {
        "batch_prompts": "W&B config (rollout_batch_size)",
        "group_size": "W&B config (n_samples_per_prompt)",
        "lr": "W&B config (actor_learning_rate)", "seed": "W&B config (seed)"}
    store = Store.open(url)
    try:
        [run] = store.list_runs("imported")
        assert (run.batch_prompts, run.group_size, run.batch_samples, run.lr, run.seed) == (
            tk.ORLHF_PROMPTS, tk.ORLHF_GROUP, tk.ORLHF_PROMPTS * tk.ORLHF_GROUP, tk.ORLHF_LR,
            tk.ORLHF_SEED)
        batch = tk.ORLHF_PROMPTS * tk.ORLHF_GROUP
        reward = store.load_metric([run.id], "reward_mean")[run.id]
        assert list(reward.steps) == STEPS
        assert list(reward.samples) == [s * batch for s in STEPS]
        assert list(reward.values) == [tk.openrlhf_train(s)["reward"] for s in STEPS]
        held = store.load_metric([run.id], "eval_accuracy")[run.id]
        assert list(held.steps) == EVAL_STEPS
        assert list(held.samples) == [s * batch for s in EVAL_STEPS]
        assert list(held.values) == [tk.openrlhf_eval(s)["eval_gsm8k_pass1"] for s in EVAL_STEPS]
    finally:
        store.close()


def test_wandb_several_eval_sources_pick_none_and_a_map_picks_one(wandb_folder):
    log = logs(wandb_folder, runs=("two",))["two"]
    assert all("eval_accuracy" not in v for v in log.steps.values())
    assert any("2 eval sources log a pass@1 (eval/eval_gsm8k_pass1, eval/eval_math_pass1)" in n
               and "--map eval_accuracy=KEY" in n for n in log.notes), log.notes
    assert "eval/epoch" not in log.unmapped  # the PPO logger's eval axis, synced by W&B
    assert log.params["seed"] == 7
    mapped = logs(wandb_folder, runs=("two",),
                   column_map={"eval_accuracy": "eval/eval_math_pass1"})["two"]
    assert_written(mapped, ("gsm8k", "math"))
    assert {s: v["eval_accuracy"] for s, v in mapped.steps.items() if "eval_accuracy" in v} == \
        {s: tk.openrlhf_eval(s, ("gsm8k", "math"))["eval_math_pass1"] for s in EVAL_STEPS}
    assert mapped.sources["eval_accuracy"] == "eval/eval_math_pass1"


def test_wandb_dotted_options_config_is_read_from_its_namespaces(wandb_folder):
    log = logs(wandb_folder, runs=("three",))["three"]
    assert log.params == {"batch_prompts": NESTED["prompts"], "group_size": NESTED["group"],
                          "lr": NESTED["lr"], "seed": NESTED["seed"]}
    assert log.params_from["batch_prompts"] == "W&B config (rollout.batch_size)"
    assert log.params_from["lr"] == "W&B config (actor.adam.lr)"
    assert_written(log)


def test_a_map_to_a_missing_key_names_each_key_once_and_writes_nothing(wandb_folder, tmp_path):
    opts = IngestOptions(runs=("one",), column_map={"eval_accuracy": "eval/eval_aime_pass1"})
    with pytest.raises(ConfigError, match="run one has no such key") as err:
        parse_source(wandb_folder, opts)
    listed = str(err.value).split("(keys: ", 1)[1].rstrip(")").split(", ")
    assert len(listed) == len(set(listed)), listed
    assert {"eval/eval_gsm8k_pass1", "train/reward", "train/actor_lr"} <= set(listed)
    url = f"sqlite:///{tmp_path / 's.db'}"
    result = ingest(wandb_folder, "--run", "one", "--map", "eval_accuracy=eval/eval_aime_pass1",
                  "--db", url)
    assert result.exit_code == 2 and "Traceback" not in result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "eval_accuracy=eval/eval_aime_pass1" in lines[0], lines
    store = Store.open(url)
    try:
        assert store.list_runs() == []
    finally:
        store.close()
