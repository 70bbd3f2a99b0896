"""A branch that diverges in real GRPO on the tiny model loses its decision instead of ending the
run: the run continues from the other branch, and the diverged one is charged its whole
allowance. Only when every branch diverges is the run diverged.

A divergence cannot be provoked in one branch alone by a setting (the branches differ only in
batch and a sqrt-scaled lr), so it is injected: the training step raises the trainer's own
`Diverged`, the exception a non-finite loss, gradient or sampling distribution raises, for the
chosen batch sizes while a decision is branching. Everything else is the real trainer."""

from __future__ import annotations

import pytest

from tests.support.training import load_tiny
from trainer import loop
from trainer.adaptive import inrun
from trainer.config import TrainConfig
from trainer.update import Diverged

pytestmark = [pytest.mark.slow, pytest.mark.tiny_model]


class _Sink:
    """Rows with their sample axis, and the run's events."""

    def __init__(self):
        self.rows: dict[int, tuple[int, dict]] = {}
        self.events: list[str] = []

    def log(self, step, samples, values):
        self.rows.setdefault(step, (samples, {}))[1].update(values)

    def flush(self):
        pass

    def event(self, text):
        self.events.append(text)


def _train(tmp_path, monkeypatch, diverging: set[int]):
    """Train with one branching decision at 16 samples (branches of 2 and 4 prompts, 64
    samples each) where the branches at `diverging` prompts raise Diverged."""
    from twoclocks_cli.adaptive import controller

    branching = []
    real_brancher, real_step = inrun.brancher, loop._train_step

    def brancher(run, out, steps):
        inner = real_brancher(run, out, steps)

        def run_branches(tried, each):
            branching.append(True)
            try:
                return inner(tried, each)
            finally:
                branching.pop()
        return run_branches

    def train_step(run, phase, phase_index):
        if branching and phase.prompts_per_batch in diverging:
            raise Diverged("injected: non-finite loss")
        return real_step(run, phase, phase_index)

    monkeypatch.setattr(inrun, "brancher", brancher)
    monkeypatch.setattr(loop, "_train_step", train_step)
    cfg = TrainConfig(model=str(load_tiny()[0]), prompts_per_batch=2, group_size=8,
                      max_new_tokens=12, lr=2e-4, sample_budget=160, eval_every_samples=16,
                      eval_size=16, checkpoint_every_steps=0, seed=3, noise_every=0,
                      batch_schedule="adaptive",
                      adaptive={"rule": "branch", "batch_min": 2, "batch_max": 4,
                                "adapt_every": 16, "branch_samples": 64})
    sink = _Sink()

    def make(state):
        return controller.start(cfg.adaptive, 8, 2, 2e-4, state=state)

    status = loop.train(cfg, sink, tmp_path, controller=make)
    return status, sink


def test_the_other_branch_is_kept_and_the_diverged_one_charged(tmp_path, monkeypatch):
    status, sink = _train(tmp_path, monkeypatch, diverging={4})
    assert status == "completed"
    assert "the branch at 4 prompts diverged: 2 kept" in sink.events[0]
    assert not any("samples each" in e for e in sink.events[1:])  # one branching decision
    samples, first = sink.rows[1]
    assert samples == 16 and first["adaptive_next_prompts"] == 2
    # a non-finite measurement is not logged: the diverged branch has no gain row
    assert "adaptive_branch_gain_b" in first and "adaptive_branch_gain_2b" not in first
    # the kept branch's four steps of 16 samples, each behind the diverged branch's 64
    assert [sink.rows[s][0] for s in (2, 3, 4, 5)] == [16 + 64 + 16 * k for k in (1, 2, 3, 4)]
    assert all(sink.rows[s][1]["batch_samples"] == 16 for s in (2, 3, 4, 5))
    last = max(sink.rows)
    assert sink.rows[last][0] >= 160 and sink.rows[last][1]["nonfinite"] == 0.0


def test_the_run_diverges_when_every_branch_does(tmp_path, monkeypatch):
    status, sink = _train(tmp_path, monkeypatch, diverging={2, 4})
    assert status == "diverged"
    last = max(sink.rows)
    assert last == 1 and sink.rows[last][1]["nonfinite"] == 1.0
