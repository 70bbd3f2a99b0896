"""The adaptive controller in real GRPO on `builtin:tiny-arith`: a run completes with its batch
trajectory and decisions stored (metrics and run events), and kill -9 + resume is exact (the
controller's state is in the checkpoint): every metric row and every decision event equal an
uninterrupted run's."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest

from tests.support.cells import TIMING, run_cell, step_metrics, store_run

pytestmark = [pytest.mark.slow, pytest.mark.tiny_model]


CELL = dict(
    prompts_per_batch=4,  # the reference batch of the lr rule
    group_size=8,
    lr=1e-4,
    sample_budget=640,
    seed=3,
    eval_every_samples=256,
    eval_size=32,
    checkpoint_every_steps=3,
    micro_batch_size=32,
    max_new_tokens=12,
    threads=2,
    batch_schedule="adaptive",
    # decisions every 64 samples; no guard warm-up, so the guard (threshold far below any
    # drift) fires at the first decision; rule guard holds batch_min until then, and the lr
    # stays batch_min's after the jump (grow_lr hold)
    adaptive={"rule": "guard", "grow_lr": "hold", "batch_min": 2, "batch_max": 8,
              "adapt_every": 64, "drift_threshold": 1e-3, "lookahead": 64, "safety": 1.0,
              "guard_warmup": 0},
)


def _events(url, run_id):
    from twoclocks_cli.store import Store

    return [e.message for e in Store.open(url).events(run_id)
            if e.message and e.message.startswith("adaptive decision")]


def test_adaptive_run_stores_its_decisions_and_resumes_exactly(tiny_model, tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    ref_id = store_run(url, CELL)
    ref = run_cell(url, ref_id, tmp_path / "ref")
    killed_id = store_run(url, CELL)
    victim = run_cell(url, killed_id, tmp_path / "killed")
    from twoclocks_cli.store import Store

    store = Store.open(url)
    deadline = time.monotonic() + 900
    while (store.max_step(killed_id) or 0) < 5 and victim.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    victim.send_signal(signal.SIGKILL)  # past checkpoint 3, between checkpoints
    victim.wait()
    assert victim.returncode == -signal.SIGKILL
    resumed = run_cell(url, killed_id, tmp_path / "killed")
    out, err = resumed.communicate(timeout=900)
    assert "STATUS completed" in out, err[-2000:]
    out, err = ref.communicate(timeout=900)
    assert "STATUS completed" in out, err[-2000:]

    a, b = step_metrics(url, ref_id), step_metrics(url, killed_id)
    assert set(a) == set(b)
    diff = [(k, a[k], b[k]) for k in a if k[1] not in TIMING and a[k] != b[k]]
    assert not diff, diff[:5]

    # the trajectory: a batch per step, a decision every 64 samples, each one an event
    batch = store.load_metric([ref_id], "batch_samples")[ref_id]
    decided = store.load_metric([ref_id], "adaptive_decision")[ref_id]
    total = float(batch.samples[-1])
    assert total >= CELL["sample_budget"]
    assert decided.values.tolist() == list(range(1, len(decided.values) + 1))
    assert len(decided.values) == int(total // 64)  # every crossing of a multiple of 64
    # each step's batch is the previous decision's choice (the first: batch_min)
    nxt = store.load_metric([ref_id], "adaptive_next_prompts")[ref_id]
    chosen = {int(s): int(v) for s, v in zip(nxt.steps, nxt.values, strict=True)}
    prompts = {int(s): int(v) for s, v in zip(batch.steps, batch.values / 8, strict=True)}
    want, current = {}, CELL["adaptive"]["batch_min"]
    for s in sorted(prompts):
        want[s] = current
        current = chosen.get(s, current)
    assert prompts == want
    # the guard (threshold far below the first drift) fires at the first decision and holds
    mode = store.load_metric([ref_id], "adaptive_mode")[ref_id]
    assert mode.values[0] == 0 and set(np.unique(mode.values)) == {0.0, 1.0}
    assert prompts[max(prompts)] == CELL["adaptive"]["batch_max"]
    lr = store.load_metric([ref_id], "lr")[ref_id].values
    assert np.allclose(lr, CELL["lr"] * (2 / 4) ** 0.5, rtol=1e-6)  # batch_min's, held
    ev_a, ev_b = _events(url, ref_id), _events(url, killed_id)
    assert ev_a == ev_b and len(ev_a) == len(decided.values)  # replayed decisions: not repeated
    assert "failure guard" in ev_a[0] and "drift_rel" in ev_a[0]
