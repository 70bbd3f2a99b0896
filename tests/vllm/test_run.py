"""A GRPO run on `builtin:tiny-arith` with rollout_engine = "vllm": it completes, a kill -9 and
resume reproduces the uninterrupted run exactly, and the sampler/trainer mismatch it logs (with
truncated importance sampling on) is float rounding.

10 steps of 64 samples (the examples' 64 steps of 128 would take the lane's whole budget on 2
cores); each run is a subprocess with its own engine, one at a time.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.support.cells import TIMING, finish, run_cell, step_metrics, store_run
from tests.vllm.conftest import CPU_SHARE, FIGURES

STEPS = 10
CELL = dict(
    rollout_engine="vllm",
    vllm_gpu_memory_utilization=CPU_SHARE,
    prompts_per_batch=8,
    group_size=8,
    lr=1e-4,
    sample_budget=64 * STEPS,
    seed=5,
    eval_every_samples=256,
    eval_size=32,
    kl_init_every=2,
    checkpoint_every_steps=4,
    num_minibatches=2,
    micro_batch_size=64,
    tis_cap=2.0,
    threads=2,
)
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(store url, uninterrupted run id, killed-and-resumed run id), run one after another."""
    tmp = tmp_path_factory.mktemp("runs")
    url = f"sqlite:///{tmp / 's.db'}"
    start = time.monotonic()
    ref = store_run(url, CELL)
    finish(run_cell(url, ref, tmp / "ref"))
    FIGURES[f"{STEPS}-step vLLM GRPO run, engine start-up included (s)"] = (
        f"{time.monotonic() - start:.0f}")
    from twoclocks_cli.store import Store

    store = Store.open(url)
    killed = store_run(url, CELL)
    victim = run_cell(url, killed, tmp / "killed")
    deadline = time.monotonic() + 600
    while (store.max_step(killed) or 0) < 6 and victim.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    victim.send_signal(signal.SIGKILL)  # past the checkpoint of step 4, before that of 8
    victim.communicate()
    assert victim.returncode == -signal.SIGKILL
    finish(run_cell(url, killed, tmp / "killed"))
    return url, ref, killed


def test_a_vllm_run_completes_and_resumes_exactly_after_kill9(runs):
    url, ref, killed = runs
    a, b = step_metrics(url, ref), step_metrics(url, killed)
    assert sorted({s for s, _ in a}) == list(range(STEPS + 1))  # eval at 0, then every step
    assert set(a) == set(b)
    diff = [(k, a[k], b[k]) for k in a if k[1] not in TIMING and a[k] != b[k]]
    assert not diff, diff[:5]
    assert a[(STEPS, "batch_samples")] == (64 * STEPS, 64)
    evals = [a[(s, "eval_accuracy")][1] for s in range(STEPS + 1) if (s, "eval_accuracy") in a]
    FIGURES["vLLM run eval accuracy by eval"] = ", ".join(f"{v:.3f}" for v in evals)


def test_the_runs_sampler_mismatch_is_rounding_and_tis_weights_are_one(runs):
    """Every step logs sampler_abs_logratio (vLLM's log-probs against the trainer's before the
    update) and, with tis_cap on, the TIS weights' mean and capped share."""
    url, ref, _ = runs
    m = step_metrics(url, ref)
    steps = range(1, STEPS + 1)
    gap = [m[(s, "sampler_abs_logratio")][1] for s in steps]
    tis = [m[(s, "tis_weight_mean")][1] for s in steps]
    capped = [m[(s, "tis_capped_frac")][1] for s in steps]
    FIGURES["run's sampler_abs_logratio (max over steps)"] = f"{max(gap):.2e}"
    FIGURES["run's tis_weight_mean (min, max); tis_capped_frac max"] = (
        f"{min(tis):.7f}, {max(tis):.7f}; {max(capped)}")
    assert all(0 < g < 1e-5 for g in gap), gap
    assert all(abs(w - 1) < 1e-5 for w in tis) and max(capped) == 0.0
