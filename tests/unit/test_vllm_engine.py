"""The vLLM engine's decisions that need no model, checked without vLLM (the main venv has none).

trainer/rollout/vllm_inputs.py holds what trainer/rollout/vllm.py sends to vLLM or builds from
its outputs: here its prefill runs, placement and launcher environment, sleep plan, request
seeds, RNG guards and option checks, with vLLM's log-probs stood in for by objects of the same
shape (tests/support/vllm_outputs.py). Its decisions on the real tiny model's tokenizer,
generation config, weights and sampled completions are
tests/integration/test_vllm_engine_tiny.py's; what only a running vLLM can show is tests/vllm/'s
job, run in `.venv-vllm` with vLLM's CPU build (`make test-vllm`).
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from tests.support.vllm_outputs import Logprob
from trainer.config import TrainConfig
from trainer.rng import cuda_devices, preserved_rng, private_torch_rng
from trainer.rollout import vllm_inputs as V
from twoclocks_cli.core.errors import ConfigError


# --- sampler log-probs --------------------------------------------------------------------------
def test_missing_logprob_entries_become_nan():
    assert V.sampled_logprobs([4, 5], None) == pytest.approx([math.nan] * 2, nan_ok=True)
    lps = [{4: Logprob(-0.5)}, None]
    assert V.sampled_logprobs([4, 5], lps) == pytest.approx([-0.5, math.nan], nan_ok=True)


# --- 1, 4, 5, 7. engine arguments, ranks, lengths ------------------------------------------------
def test_prefill_runs_keep_every_prompt_whole_within_one_step():
    """128 chat prompts of 44-46 tokens (5,760 tokens) do not fit vLLM's 4,096-token step: two
    runs, in order, each within both budgets, together every request once."""
    lengths = [46, 45, 44, 44] * 32
    runs = V.prefill_runs(lengths, 4096, 256)
    assert [i for r in runs for i in r] == list(range(128))
    assert [len(r) for r in runs] == [91, 37]  # 91 prompts: 4,073 tokens; a 92nd would not fit
    assert all(sum(lengths[i] for i in r) <= 4096 for r in runs)
    assert V.prefill_runs(lengths, 4096, 50) == [range(0, 50), range(50, 100), range(100, 128)]
    assert V.prefill_runs([10, 5000, 10], 4096, 256) == [range(0, 1), range(1, 2), range(2, 3)]
    assert V.prefill_runs([], 4096, 256) == []


def test_placement_and_launcher_env():
    place = V.placement_from_env({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"})
    assert place == V.Placement(3, 1, 4) and place.device == "cuda:1"
    env = V.launcher_env(place, {"MASTER_ADDR": "node7", "MASTER_PORT": "29500"})
    assert env == {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "node7",
                   "MASTER_PORT": "29500", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    alone = V.placement_from_env({})
    assert alone == V.Placement(0, 0, 1)
    env = V.launcher_env(alone, {}, port=lambda: 41234)
    assert env["MASTER_PORT"] == "41234" and env["MASTER_ADDR"] == "127.0.0.1"
    with pytest.raises(ConfigError, match="MASTER_PORT is not set"):
        V.launcher_env(V.Placement(0, 0, 2), {})
    with pytest.raises(ConfigError, match="LOCAL_RANK = 'x'"):
        V.placement_from_env({"LOCAL_RANK": "x"})
    with pytest.raises(ConfigError, match="RANK = 2, LOCAL_RANK = 2, WORLD_SIZE = 2"):
        V.placement_from_env({"RANK": "2", "WORLD_SIZE": "2"})
    assert 0 < V.free_port() < 65536
    assert V.check_device(place, "cuda", 2) == "cuda:1"
    with pytest.raises(ConfigError, match="LOCAL_RANK = 1 but this node shows 1 CUDA"):
        V.check_device(place, "cuda", 1)
    assert V.check_device(place, "cpu", 0) == "cpu"  # vLLM's CPU build: no GPU needed
    with pytest.raises(ConfigError, match="platform here is 'tpu'.*cuda or cpu"):
        V.check_device(place, "tpu", 0)


def test_sleep_mode_is_refused_on_the_cpu_platform_only():
    on = TrainConfig(vllm_enable_sleep_mode=True, vllm_sleep_level=2)
    with pytest.raises(ConfigError, match="vllm_enable_sleep_mode = true: vLLM's CPU platform"):
        V.check_sleep_mode(on, "cpu")
    V.check_sleep_mode(on, "cuda")
    V.check_sleep_mode(TrainConfig(), "cpu")


def test_threads_and_their_setter_survive_a_body_that_replaces_them():
    before = torch.get_num_threads()
    with V.preserved_threads():  # what vLLM's CPU worker does at start-up
        torch.set_num_threads(1)
        torch.set_num_threads = lambda n: None
    assert torch.get_num_threads() == before
    torch.set_num_threads(before + 1)
    assert torch.get_num_threads() == before + 1
    torch.set_num_threads(before)


def test_launcher_variables_are_set_for_the_start_up_only(monkeypatch):
    import os

    monkeypatch.setenv("MASTER_ADDR", "node7")
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with V.environment({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "41234"}):
        assert os.environ["MASTER_ADDR"] == "127.0.0.1" and os.environ["MASTER_PORT"] == "41234"
    assert os.environ["MASTER_ADDR"] == "node7" and "MASTER_PORT" not in os.environ


def test_request_seeds_follow_torchs_generator():
    torch.manual_seed(4)
    a = V.request_seeds(5)
    torch.manual_seed(4)
    assert V.request_seeds(5) == a and len(set(a)) == 5
    assert V.request_seeds(5) != a
    assert all(0 <= s < 2**63 for s in a)


# --- 7. sleep/wake around the update ----------------------------------------------------------
class SimulatedMemory:
    """What vLLM's GPU holds, per vLLM's documented sleep levels: level 1 offloads the weights
    to CPU (kept), level 2 drops them; the KV cache is dropped either way."""

    def __init__(self, level):
        self.level, self.weights, self.weights_on, self.kv_on = level, "disk", True, True
        self.prefix_of = "disk"  # the weights the prefix cache's keys/values came from

    def apply(self, steps, model_version):
        for step in steps:
            if step == "sleep":
                self.weights_on = self.kv_on = False
                if self.level == 2:
                    self.weights = "garbage"
            elif step == "wake_weights":
                self.weights_on = True
            elif step == "wake_kv_cache":
                self.kv_on = True
            elif step in ("push", "reload"):
                assert self.weights_on, "weights written while asleep"
                self.weights = model_version if step == "push" else "disk"
            elif step == "reset_prefix_cache":
                self.prefix_of = self.weights


@pytest.mark.parametrize("level", [None, 1, 2])
def test_sleep_plan_keeps_the_weights_current_at_every_generation(level):
    """The loop's order (eval at step 0, then per step: generate, update, sync, sometimes eval):
    every generation runs awake, on the trainer's latest weights (the checkpoint's before the
    first sync), with no prefix cache from older weights; vLLM sleeps through each update."""
    plan, mem = V.SleepPlan(level), SimulatedMemory(level)
    version = "disk"

    def generate():
        mem.apply(plan.before_generate(), version)
        assert mem.weights_on and mem.kv_on and mem.weights == version
        assert mem.prefix_of == version
        mem.apply(plan.after_generate(), version)
        assert mem.weights_on is (level is None)  # asleep through the update and reward

    generate()  # eval before step 1
    for step in range(1, 5):
        generate()
        version = f"v{step}"  # the update
        mem.apply(plan.sync(), version)
        assert mem.weights == version and mem.prefix_of == version
        if step % 2 == 0:
            generate()  # eval
    if level == 2:  # the first generation after a level-2 sleep before any sync read the disk
        assert V.SleepPlan(2).before_generate() == []
        fresh = V.SleepPlan(2)
        fresh.after_generate()
        assert fresh.before_generate() == ["wake_weights", "reload", "reset_prefix_cache",
                                           "wake_kv_cache"]


# --- RNG: vLLM's reseeding and eval's private stream -------------------------------------------
def _draws():
    return random.random(), float(np.random.random()), float(torch.rand(()))


def test_a_reseeding_start_up_leaves_the_trainers_generators_alone():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    expected = _draws()
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    with preserved_rng():  # what vLLM's worker does at start-up (set_random_seed)
        random.seed(0), np.random.seed(0), torch.manual_seed(0)
    assert _draws() == expected


def test_private_eval_stream_restores_the_cpu_generator():
    """On CPU only the call shape and the CPU generator can be checked: cuda_devices() is the
    device list given to fork_rng (the current CUDA device on a GPU machine, none here)."""
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    with private_torch_rng(123):
        inside = torch.rand(3)
    assert torch.equal(torch.rand(3), expected)
    torch.manual_seed(123)
    assert torch.equal(torch.rand(3), inside)
    assert cuda_devices() == ([torch.cuda.current_device()] if torch.cuda.is_available() else [])


# --- config and the engine's refusal without vLLM ------------------------------------------------
def test_vllm_options_are_validated():
    with pytest.raises(ConfigError, match="vllm_sleep_level"):
        TrainConfig.from_dict({"vllm_sleep_level": 3})
    with pytest.raises(ConfigError, match="vllm_max_prompt_tokens"):
        TrainConfig.from_dict({"vllm_max_prompt_tokens": 0})
    cfg = TrainConfig.from_dict({"vllm_enable_sleep_mode": True, "vllm_sleep_level": 2})
    assert cfg.vllm_sleep_level == 2
