"""OpenRLHF runs imported as its TensorBoard logger writes them: torch's SummaryWriter (its
TensorboardLogger), from tests/support/trackers.py, and its config's namespace reprs. Every value,
step, sample count, lr and seed checked is the one the writer wrote. Its W&B runs (whose writer
starts W&B's service process) are tests/integration/test_ingest_openrlhf_wandb.py's."""

from __future__ import annotations

import pytest

from tests.support import trackers as tk
from tests.support.openrlhf_read import EVAL_STEPS, assert_written, ingest, logs
from twoclocks_cli.ingest import openrlhf
from twoclocks_cli.store import Store


@pytest.fixture(scope="module")
def tb_folder(tmp_path_factory):
    """One OpenRLHF run per folder, as its TensorboardLogger writes them."""
    root = tmp_path_factory.mktemp("openrlhf-tb")
    tk.write_openrlhf_tensorboard(root, "one")
    tk.write_openrlhf_tensorboard(root, "two", sources=("gsm8k", "math"))
    return root


def test_tensorboard_evaluations_are_picked_at_their_global_step(tb_folder):
    log = logs(tb_folder, runs=("one",))["one"]
    assert_written(log)  # values are multiples of 2^-k: exact in TensorBoard's float32
    assert log.sources["eval_accuracy"] == "eval/eval_gsm8k_pass1"
    # OpenRLHF's TensorBoard logger writes no config: the lr is the peak actor_lr logged
    assert log.params == {"lr": tk.ORLHF_LR}
    assert log.params_from["lr"] == "log (peak train/actor_lr logged)"


def test_tensorboard_without_its_batch_asks_for_rollout_batch_size(tb_folder, tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    result = ingest(tb_folder, "--run", "one", "--db", url)
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "rollout_batch_size and n_samples_per_prompt" in lines[0], lines
    result = ingest(tb_folder, "--run", "two", "--db", url, "--batch-prompts", tk.ORLHF_PROMPTS,
                  "--group-size", tk.ORLHF_GROUP, "--seed", 3,
                  "--map", "eval_accuracy=eval/eval_math_pass1")
    assert result.exit_code == 0, result.output
    store = Store.open(url)
    try:
        [run] = store.list_runs("imported")
        assert (run.batch_samples, run.lr, run.seed) == (
            tk.ORLHF_PROMPTS * tk.ORLHF_GROUP, tk.ORLHF_LR, 3)
        held = store.load_metric([run.id], "eval_accuracy")[run.id]
        assert list(held.steps) == EVAL_STEPS
        assert list(held.samples) == [s * run.batch_samples for s in EVAL_STEPS]
        assert list(held.values) == [tk.openrlhf_eval(s, ("gsm8k", "math"))["eval_math_pass1"]
                                     for s in EVAL_STEPS]
    finally:
        store.close()


def test_a_namespace_repr_is_read_as_literals_only():
    config = {"rollout": "namespace(batch_size=8, n_samples_per_prompt=4)",
              "actor": "namespace(adam=namespace(lr=5e-07), path=PosixPath('/x'))",
              "train": "namespace(seed=__import__('os').getpid())"}
    assert openrlhf.expand(config) == {"rollout": {"batch_size": 8, "n_samples_per_prompt": 4},
                                       "actor": {"adam": {"lr": 5e-07}}, "train": {}}
    assert openrlhf.params(config) == (
        {"batch_prompts": 8, "group_size": 4, "lr": 5e-07},
        {"batch_prompts": "rollout.batch_size", "group_size": "rollout.n_samples_per_prompt",
         "lr": "actor.adam.lr"})
