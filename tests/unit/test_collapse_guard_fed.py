"""The producers feed the failure guard's live drop rule: the sim backend hands each written
row's evaluation to the controller before it observes the step, and the grpo loop evaluates
before asking it, so a run whose progress metric collapses is sent to batch_max at the
evaluation that declares the collapse (logged as `adaptive_collapse_at`), and one whose guard
watches nothing (`collapse_key = "none"`) is not.

Sim: the theory model collapses when its drift crosses sim.drift_threshold (6.5); its eval
accuracy then decays with an e-fold of 4,000 samples. Rule "guard" without a drift threshold:
only the collapse guard can move the batch. Decisions every 520 samples (130 steps of 4),
rows every 4 steps, so some decisions land on rows of their own."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import sqlalchemy as sa

from trainer.adaptive.config import AdaptiveConfig
from twoclocks_cli.adaptive.controller import Controller
from twoclocks_cli.clocks import collapse
from twoclocks_cli.clocks.curves import smooth

K, WINDOW, PATIENCE = 3, 5, 3  # the live rule's defaults (the analysis's k, its window)
SIM_THRESHOLD = 6.5  # the sim's own collapse drift (ModelConfig's default)
ADAPTIVE = {"rule": "guard", "batch_min": 1, "batch_max": 16, "adapt_every": 520}


def _sim_run(tmp_path, name: str, adaptive: dict, sim: dict | None = None, crash_at=None):
    """One adaptive sim run (1 prompt x 4, lr 0.01, 6,000 samples) in a fresh store; with
    `crash_at` it is stopped by an exception at its first row from that step and rerun from
    its checkpoint. Returns (store, run id)."""
    from twoclocks_cli.backends import run_cell
    from twoclocks_cli.store import Run, RunStatus, Store
    from twoclocks_cli.store.writer import MetricWriter

    store = Store.open(f"sqlite:///{tmp_path / f'{name}.db'}")
    cell = {"prompts_per_batch": 1, "group_size": 4, "lr": 0.01, "seed": 0,
            "sample_budget": 6000, "batch_schedule": "adaptive",
            "sim": {"log_every": 4, **(sim or {})}, "adaptive": {**ADAPTIVE, **adaptive}}
    with store.session() as s:
        r = Run(cell_id=name, name=name, backend="sim", config=cell)
        s.add(r)
        s.flush()
        rid = r.id
    store.set_status(rid, RunStatus.running)
    if crash_at is not None:
        real = MetricWriter.log

        def crash(self, step, samples, values):
            if step >= crash_at:
                raise RuntimeError("crash")
            real(self, step, samples, values)

        with pytest.MonkeyPatch.context() as m:
            m.setattr(MetricWriter, "log", crash)
            with pytest.raises(RuntimeError):
                run_cell(store, rid, tmp_path / name)
    assert run_cell(store, rid, tmp_path / name) == RunStatus.completed
    return store, rid


def _series(store, rid, key):
    s = store.load_metric([rid], key).get(rid)
    return None if s is None else (np.asarray(s.samples, float), np.asarray(s.values, float))


def _reasons(store, rid) -> list[str]:
    return [e.message for e in store.events(rid)
            if (e.message or "").startswith("adaptive decision")]


def _rows(store, rid) -> dict:
    with store.engine.connect() as c:
        return {(s, k): (n, v) for s, k, n, v in c.execute(sa.text(
            "SELECT step, key, samples, value FROM metrics WHERE run_id = :r"), {"r": rid})}


def test_a_sim_collapse_fires_the_guard_at_the_live_rules_declaration(tmp_path,
                                                                      record_property):
    store, rid = _sim_run(tmp_path, "watched", {})
    off, oid = _sim_run(tmp_path, "blind", {"collapse_key": "none"})

    # the guard fired once, on the collapse, and the run then held batch_max
    at = _series(store, rid, "adaptive_collapse_at")
    assert at is not None and at[0].size == 1
    declared, fall_at = float(at[0][0]), float(at[1][0])
    fired = [r for r in _reasons(store, rid) if "eval_accuracy collapsed" in r]
    assert len(fired) == 1 and f"at {declared:,.0f} samples" in fired[0]
    mode = _series(store, rid, "adaptive_mode")
    batch = _series(store, rid, "batch_samples")
    assert set(mode[1][mode[0] <= declared]) == {0.0} and set(mode[1][mode[0] > declared]) == {1.0}
    assert set(batch[1][batch[0] <= declared]) == {4.0} and set(batch[1][batch[0] > declared]) == {
        64.0}

    # blind to the metric: the same run never moves, and up to the declaration both runs
    # wrote the same rows (feeding the evaluations changes nothing until the guard acts)
    assert _series(off, oid, "adaptive_collapse_at") is None
    assert not any("collapsed" in r for r in _reasons(off, oid))
    assert set(_series(off, oid, "batch_samples")[1]) == {4.0}
    a, b = _rows(store, rid), _rows(off, oid)
    early = {k for k, (n, _) in a.items() if n < declared}
    assert early and {k: a[k] for k in early} == {k: b[k] for k in early}

    # the live fall is the offline rule's on the trailing mean of what was logged so far; the
    # sim collapsed (its drift crossed the threshold) before it, the analysis dates it near it
    x, y = _series(store, rid, "eval_accuracy")
    seen = x <= declared
    causal = [f for f in collapse.falls(x[seen], collapse.trailing(y[seen], WINDOW),
                                        y[0], k=K, raw=y[seen]) if not f.dip]
    assert causal and causal[0].at == fall_at
    bx, by = _series(off, oid, "eval_accuracy")
    sm = smooth(by, "ma", WINDOW)
    centred = [f for f in collapse.falls(bx, sm, float(sm[0]), k=K, raw=by) if not f.dip]
    dx, dv = _series(off, oid, "drift_abs")
    crossed = float(dx[np.argmax(dv >= SIM_THRESHOLD)])
    assert (dv >= SIM_THRESHOLD).any() and crossed < fall_at < declared
    lag = int(np.sum((x > fall_at) & (x <= declared)))
    assert lag <= K - 1 + PATIENCE
    record_property("figure: sim collapse (drift crosses 6.5), offline fall on the centred / "
                    "trailing mean, live declaration (samples); evaluations from fall to "
                    "declaration", (crossed, centred[0].at, fall_at, declared, lag))


def test_a_sim_run_resumed_mid_fall_declares_the_same_collapse(tmp_path):
    """Checkpointed every 4 steps and stopped at the declaring step: the checkpoint it resumes
    from holds a fall not yet declared, and the rerun writes every row and decision of the
    uninterrupted run."""
    from twoclocks_cli.theory.simulate import SimState

    sim = {"checkpoint_every": 4}
    store, rid = _sim_run(tmp_path, "whole", {}, sim)
    with store.engine.connect() as c:
        step = c.execute(sa.text("SELECT step FROM metrics WHERE run_id = :r AND key = "
                                 "'adaptive_collapse_at'"), {"r": rid}).scalar_one()

    probe = []
    real_load = SimState.load

    def load(cfg, path):
        state, extra = real_load(cfg, path)
        probe.append(extra)
        return state, extra

    with pytest.MonkeyPatch.context() as m:
        m.setattr(SimState, "load", staticmethod(load))
        resumed, rid2 = _sim_run(tmp_path, "cut", {}, sim, crash_at=step)
    live = probe[0]["controller"]["live"]
    assert live["down"] is not None and live["collapsed_at"] is None  # mid-fall
    assert _rows(store, rid) == _rows(resumed, rid2)
    assert _reasons(store, rid) == _reasons(resumed, rid2)


# -- the grpo loop ---------------------------------------------------------------------------


def _curve(step: int) -> float:
    """Held-out accuracy at a step: rises to 0.8 by step 8, collapses to 0.1 from step 20."""
    return 0.1 if step >= 20 else min(0.8, 0.2 + 0.075 * step)


class _Sink:
    """A metric sink that keeps every row and event."""

    def __init__(self):
        self.rows, self.events = [], []

    def log(self, step, samples, values):
        self.rows.append((step, samples, dict(values)))

    def flush(self):
        pass

    def event(self, message):
        self.events.append(message)


def _grpo(monkeypatch, tmp_path, adaptive: dict, evals: list):
    """The real `trainer.loop.train` on a stand-in run: each step trains 2 prompts x 4 samples
    (drift 0), every step evaluates `_curve` (`evals` records the steps evaluated); no model,
    no checkpoints. Returns the sink and the controller."""
    from trainer import loop
    from trainer.config import TrainConfig
    from trainer.dist import Dist

    cfg = TrainConfig.from_dict({
        "model": "builtin:tiny-arith", "dataset": "builtin:arithmetic", "group_size": 4,
        "prompts_per_batch": 2, "lr": 1e-3, "sample_budget": 8 * 40, "eval_every_samples": 8,
        "checkpoint_every_steps": 0, "batch_schedule": "adaptive",
        "adaptive": {"rule": "guard", "batch_min": 2, "batch_max": 8, "adapt_every": 10**6,
                     **adaptive}})
    sink, made = _Sink(), []
    none = dict.fromkeys(("tok", "model", "rollout_model", "scorer", "net", "ref", "opt",
                          "engine", "reward_fn", "source", "data_rng", "drift"))
    run = loop.Run(cfg, Dist(), tmp_path, sink, None, held=[None] * 16, **none)

    def train_step(run, phase, phase_index):
        run.step += 1
        run.samples += phase.prompts_per_batch * cfg.group_size
        values = {"reward_mean": 0.5, "accuracy": 0.5, "zero_std_frac": 0.0, "drift_rel": 0.0}
        return values, SimpleNamespace(n_all=phase.prompts_per_batch * cfg.group_size,
                                       r_mean=0.5)

    def evaluate(engine, reward_fn, held, cfg, tok, step):
        evals.append(step)
        return _curve(step)

    def controller(saved):
        made.append(Controller(cfg.adaptive, cfg.group_size, cfg.prompts_per_batch, cfg.lr,
                               state=saved))
        return made[-1]

    monkeypatch.setattr(loop, "deterministic_kernels", lambda device: None)
    monkeypatch.setattr(loop, "_claim_checkpoint", lambda *a: None)
    monkeypatch.setattr(loop, "_set_up", lambda *a: run)
    monkeypatch.setattr(loop, "_phase", lambda run: (run.ctl.decisions, SimpleNamespace(
        prompts_per_batch=run.ctl.prompts)))
    monkeypatch.setattr(loop, "_train_step", train_step)
    monkeypatch.setattr(loop, "evaluate", evaluate)
    monkeypatch.setattr(loop, "_save", lambda run: None)
    assert loop.train(cfg, sink, tmp_path, controller=controller, owner=object()) == "completed"
    return sink, made[0]


def test_the_grpo_loop_hands_each_evaluation_to_the_guard_at_its_step(monkeypatch, tmp_path):
    evals: list = []
    sink, ctl = _grpo(monkeypatch, tmp_path, {}, evals)
    assert evals == list(range(sink.rows[-1][0] + 1))  # one evaluation a step, and step 0's
    # the controller's live rule is one fed every logged evaluation (step 0's first, as the
    # analysis's curve starts there) at its samples, and nothing else
    live, declared = collapse.LiveFalls(patience=PATIENCE), []
    for step, samples, values in sink.rows:
        if live.push(samples, values["eval_accuracy"]):
            declared.append((step, samples))
    assert live.to_dict() == ctl.state.live.to_dict() and live.initial == _curve(0)
    # the guard acted at the declaring evaluation's own step: its row carries both
    fired = [(step, samples, v) for step, samples, v in sink.rows if "adaptive_collapse_at" in v]
    assert [(step, samples) for step, samples, _ in fired] == declared
    step, samples, values = fired[0]
    assert values["eval_accuracy"] == _curve(step) and values["adaptive_next_prompts"] == 8
    assert values["adaptive_collapse_at"] == live.falls()[0].at and ctl.state.mode == "guard"
    assert [e for e in sink.events if "eval_accuracy collapsed" in e]


def test_the_grpo_loop_leaves_a_blind_guard_alone(monkeypatch, tmp_path):
    sink, ctl = _grpo(monkeypatch, tmp_path, {"collapse_key": "none"}, [])
    assert ctl.state.live is None and ctl.state.mode == "progress"
    assert not any("adaptive_collapse_at" in v for _, _, v in sink.rows)


def test_inrun_adapt_passes_the_steps_evaluation_to_observe():
    """The hand-over itself: the values `adapt` is given (the evaluation among them) are the
    signals the controller observes; a step without one feeds nothing to the live rule."""
    from trainer.adaptive import inrun

    cfg = AdaptiveConfig(rule="guard", batch_min=2, batch_max=8, adapt_every=10**6)
    ctl = Controller(cfg, 4, 2, 1e-3)
    run = SimpleNamespace(ctl=ctl, step=1, samples=8)
    inrun.adapt(run, {"drift_rel": 0.0}, {}, None)
    assert ctl.state.live is None
    run.step, run.samples = 2, 16
    values = {"drift_rel": 0.0, "eval_accuracy": 0.25}
    assert inrun.adapt(run, values, {}, None) is None
    assert ctl.state.live.last == [[16.0, 0.25, 0.25]] and values["adaptive_mode"] == 0
    restored = Controller(cfg, 4, 2, 1e-3, state=json.loads(json.dumps(ctl.to_dict())))
    assert restored.state.live == ctl.state.live
