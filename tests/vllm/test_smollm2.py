"""vLLM's CPU engine on a real chat model: SmolLM2-135M-Instruct (`builtin:smollm2-135m`) on the
shipped example's task, two GRPO steps as a sweep job runs them. The trainer's own forward is the
truth for the log-probs vLLM reports for the tokens it sampled (fp32 both)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from tests.support.cells import finish, run_cell, step_metrics, store_run
from tests.vllm.conftest import FIGURES
from twoclocks_cli.core.process import cpu_share_for, node_memory_bytes

# a SmolLM2 run's process held 3.16 GiB when vLLM started (the model, its initial copy, vLLM's
# weights): on CPU the engine's share of the node must cover that plus the KV cache
SHARE = cpu_share_for(5)


def test_vllm_samples_smollm2_with_the_trainers_logprobs(tmp_path):
    example = tomllib.loads((Path(__file__).parents[2] / "examples" / "smollm2-train.toml")
                            .read_text())
    cell = {**example, "rollout_engine": "vllm", "vllm_gpu_memory_utilization": SHARE,
            "prompts_per_batch": 4, "group_size": 8, "sample_budget": 64, "lr": 1e-5,
            "eval_every_samples": 0, "checkpoint_every_steps": 0, "tis_cap": 2.0}
    url = f"sqlite:///{tmp_path / 's.db'}"
    run_id = store_run(url, cell)
    finish(run_cell(url, run_id, tmp_path / "run"))
    m = step_metrics(url, run_id)
    gap = [m[(s, "sampler_abs_logratio")][1] for s in (1, 2)]
    rewards = [m[(s, "reward_mean")][1] for s in (1, 2)]
    FIGURES["SmolLM2 sampler_abs_logratio (steps 1, 2)"] = ", ".join(f"{g:.2e}" for g in gap)
    FIGURES["SmolLM2 reward_mean (steps 1, 2)"] = ", ".join(f"{r:.3f}" for r in rewards)
    assert all(0 < g < 1e-4 for g in gap), gap
    assert any(r > 0 for r in rewards), rewards


def test_a_share_the_process_already_fills_is_refused_in_one_line(tmp_path):
    """A share over the 1 GiB the config check asks for, but under what a SmolLM2 run's process
    holds when vLLM starts (the model, its initial copy, vLLM's weights): vLLM's worker refuses
    it, and the run ends on one line naming the key, what the process holds and the share to
    use, not on vLLM's traceback. (vLLM's own log lines come before it on stderr.)"""
    from tests.support.cli import twoclocks

    share = round(1.05 * 2**30 / node_memory_bytes(), 4)
    config = tmp_path / "share.toml"
    config.write_text('model = "builtin:smollm2-135m"\nrollout_engine = "vllm"\n'
                      f'vllm_gpu_memory_utilization = {share}\nsample_budget = 32\n'
                      'prompts_per_batch = 4\ngroup_size = 8\neval_every_samples = 0\n')
    proc = twoclocks("train", str(config), "--db", f"sqlite:///{tmp_path / 's.db'}",
                     cwd=tmp_path)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "vllm_gpu_memory_utilization" in last and "GiB this process holds" in last, last
    need = float(last.rsplit("use at least ", 1)[1])
    assert share < need <= 0.9, last
