"""A GRPO run on `builtin:tiny-arith` with rollout_engine = "vllm": it completes, a kill -9 and
resume reproduces the uninterrupted run exactly, and the sampler/trainer mismatch it logs (with
truncated importance sampling on) is float rounding.

10 steps of 64 samples (the examples' 64 steps of 128 would take the lane's whole budget on 2
cores); each run is a subprocess with its own engine, one at a time.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.vllm.conftest import CPU_SHARE, FIGURES

TIMING = {"time_gen_s", "time_reward_s", "time_update_s", "tokens_per_s"}
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
RUN_CELL = (
    "import sys; from pathlib import Path; from twoclocks_cli.store import Store; "
    "from twoclocks_cli.backends import run_cell; "
    "print('STATUS', run_cell(Store.open(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])).value)"
)


def _store_run(url: str, cell: dict) -> int:
    from twoclocks_cli.store import Store
    from twoclocks_cli.store.models import Run

    with Store.open(url).session() as s:
        run = Run(cell_id=f"c{time.monotonic_ns()}", name="t", backend="grpo", config=cell)
        s.add(run)
        s.flush()
        return run.id


def _start(url: str, run_id: int, workdir) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", RUN_CELL, url, str(run_id), str(workdir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> None:
    out, err = proc.communicate(timeout=600)
    assert "STATUS completed" in out, err[-3000:]


def _metrics(url: str, run_id: int) -> dict[tuple[int, str], tuple[int, float]]:
    import sqlalchemy as sa

    from twoclocks_cli.store import Store

    with Store.open(url).engine.connect() as c:
        rows = c.execute(sa.text("SELECT step, key, samples, value FROM metrics "
                                 "WHERE run_id = :r"), {"r": run_id}).all()
    out = {(s, k): (n, v) for s, k, n, v in rows}
    assert len(out) == len(rows)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(store url, uninterrupted run id, killed-and-resumed run id), run one after another."""
    tmp = tmp_path_factory.mktemp("runs")
    url = f"sqlite:///{tmp / 's.db'}"
    start = time.monotonic()
    ref = _store_run(url, CELL)
    _finish(_start(url, ref, tmp / "ref"))
    FIGURES[f"{STEPS}-step vLLM GRPO run, engine start-up included (s)"] = (
        f"{time.monotonic() - start:.0f}")
    from twoclocks_cli.store import Store

    store = Store.open(url)
    killed = _store_run(url, CELL)
    victim = _start(url, killed, tmp / "killed")
    deadline = time.monotonic() + 600
    while (store.max_step(killed) or 0) < 6 and victim.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    victim.send_signal(signal.SIGKILL)  # past the checkpoint of step 4, before that of 8
    victim.communicate()
    assert victim.returncode == -signal.SIGKILL
    _finish(_start(url, killed, tmp / "killed"))
    return url, ref, killed


def test_a_vllm_run_completes_and_resumes_exactly_after_kill9(runs):
    url, ref, killed = runs
    a, b = _metrics(url, ref), _metrics(url, killed)
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
    m = _metrics(url, ref)
    steps = range(1, STEPS + 1)
    gap = [m[(s, "sampler_abs_logratio")][1] for s in steps]
    tis = [m[(s, "tis_weight_mean")][1] for s in steps]
    capped = [m[(s, "tis_capped_frac")][1] for s in steps]
    FIGURES["run's sampler_abs_logratio (max over steps)"] = f"{max(gap):.2e}"
    FIGURES["run's tis_weight_mean (min, max); tis_capped_frac max"] = (
        f"{min(tis):.7f}, {max(tis):.7f}; {max(capped)}")
    assert all(0 < g < 1e-5 for g in gap), gap
    assert all(abs(w - 1) < 1e-5 for w in tis) and max(capped) == 0.0
