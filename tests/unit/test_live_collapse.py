"""The live drop rule against curves whose dips and collapse are known: it finds the falls the
offline rule finds on the same (trailing) smoothing, declares a collapse a fixed number of
evaluations after the offline rule dates it, never on a dip within its patience, and the
adaptive controller's guard acts on it and resumes exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trainer.adaptive.config import AdaptiveConfig
from twoclocks_cli.adaptive.controller import Controller
from twoclocks_cli.clocks import collapse
from twoclocks_cli.clocks.curves import smooth

K, PATIENCE, WINDOW = 3, 3, 5  # the drop rule's k, the live patience, both smoothings' window
EVERY = 1024.0  # samples between evaluations
COLLAPSE = 40  # the evaluation at which the truth collapses


def _truth(n=60, dips=((14, 3), (26, 3)), collapse_at=COLLAPSE, noise=0.02, seed=0):
    """Rises 0.1 -> 0.6 over 8 evaluations, dips to 0.3 for (start, length) evaluations,
    collapses to 0.1 at `collapse_at` (None: never); seeded gaussian eval noise."""
    i = np.arange(n)
    y = np.minimum(0.6, 0.1 + 0.5 * i / 8)
    for start, length in dips:
        y = np.where((i >= start) & (i < start + length), 0.3, y)
    if collapse_at is not None:
        y = np.where(i >= collapse_at, 0.1, y)
    return y + np.random.default_rng(seed).normal(0, noise, n)


def _live(x, y, patience=PATIENCE) -> tuple[collapse.LiveFalls, int | None]:
    """Feed the curve point by point: the rule, and the index at which it declared a collapse."""
    live, declared = collapse.LiveFalls(window=WINDOW, k=K, patience=patience), None
    for i, (at, value) in enumerate(zip(x, y, strict=True)):
        if live.push(at, value):
            declared = i
    return live, declared


def _offline(x, y, sm) -> list[collapse.Fall]:
    return collapse.falls(x, sm, float(sm[0]), k=K, raw=y)


def _index(x, at: float) -> int:
    return int(np.flatnonzero(x == at)[0])


def test_a_collapse_is_declared_a_fixed_lag_after_the_offline_rule_dates_it(record_property):
    """k 3, patience 3: declared k - 1 + patience = 5 evaluations after `falls` dates it on the
    trailing mean (by construction) and at most k + patience = 6 after the analysis's centred
    mean dates it, never before; 100 seeds of a curve with two dips before the collapse."""
    lags = []
    for seed in range(100):
        y = _truth(seed=seed)
        x = (np.arange(y.size) + 1) * EVERY
        live, declared = _live(x, y)
        causal = [f for f in _offline(x, y, collapse.trailing(y, WINDOW)) if not f.dip]
        centred = [f for f in _offline(x, y, smooth(y, "ma", WINDOW)) if not f.dip]
        assert declared is not None and len(causal) == len(centred) == 1, seed
        assert live.collapsed_at == x[declared] and live.falls()[-1] == causal[0]
        assert declared - _index(x, causal[0].at) == K - 1 + PATIENCE, seed
        lag = declared - _index(x, centred[0].at)
        assert 0 <= lag <= K + PATIENCE, (seed, lag)
        lags.append(lag)
    record_property("figure: live collapse lag after the centred offline date, evaluations "
                    "(min, median, max)", (min(lags), float(np.median(lags)), max(lags)))


def test_a_dip_within_the_patience_never_triggers_the_live_rule(record_property):
    """Two dips of 3 evaluations (to 0.3 under a 0.6 peak, eval noise 0.02), no collapse, 200
    seeds: the offline rule calls them falls that recover, the live rule declares nothing."""
    dips, triggers = 0, 0
    for seed in range(200):
        y = _truth(collapse_at=None, seed=seed)
        x = (np.arange(y.size) + 1) * EVERY
        live, declared = _live(x, y)
        found = _offline(x, y, collapse.trailing(y, WINDOW))
        assert all(f.dip for f in found), seed
        dips += len(found)
        triggers += declared is not None
    record_property("figure: dips (offline, trailing mean) and live false triggers over 200 "
                    "seeds", (dips, triggers))
    assert triggers == 0 and dips >= 390


def test_a_dip_longer_than_the_patience_is_a_collapse_to_the_live_rule():
    """The rule cannot wait for the rest of the run: a dip of 8 evaluations is declared, and
    the offline rule, which sees the recovery, calls it a dip."""
    y = _truth(dips=((14, 8),), collapse_at=None, noise=0.0)
    x = (np.arange(y.size) + 1) * EVERY
    live, declared = _live(x, y)
    assert declared is not None and declared < 14 + 8  # while the data are still down
    assert [f.dip for f in _offline(x, y, collapse.trailing(y, WINDOW))] == [True]
    assert live.falls()[0].dip  # it too sees the recovery afterwards; the declaration stays


@pytest.mark.parametrize("noise", [0.02, 0.12])
def test_the_live_rule_is_the_offline_rule_on_every_prefix(noise):
    """Fed point by point, after each point its falls are `falls` on the trailing mean of the
    data so far: dips, collapse, dates and recoveries (at 0.12 noise some falls wait for a raw
    point below their floor to be dated, as `falls` dates them)."""
    for seed in range(20):
        y = _truth(seed=seed, noise=noise)
        x = (np.arange(y.size) + 1) * EVERY
        live = collapse.LiveFalls(window=WINDOW, k=K, patience=PATIENCE)
        for n in range(1, y.size + 1):
            live.push(x[n - 1], y[n - 1])
            want = _offline(x[:n], y[:n], collapse.trailing(y[:n], WINDOW))
            assert live.falls() == want, (seed, n)


def test_the_live_state_round_trips_through_json_mid_fall():
    y = _truth(seed=7)
    x = (np.arange(y.size) + 1) * EVERY
    whole, declared = _live(x, y)
    live = collapse.LiveFalls(window=WINDOW, k=K, patience=PATIENCE)
    got = None
    for i in range(y.size):
        if i == COLLAPSE + 2:  # between the fall's start and its declaration
            live = collapse.LiveFalls(**json.loads(json.dumps(live.to_dict())))
        if live.push(x[i], y[i]):
            got = i
    assert got == declared and live.to_dict() == whole.to_dict()


def test_trailing_is_causal_and_the_centred_average_is_not():
    y = _truth(seed=1)
    assert np.array_equal(collapse.trailing(y[:30], WINDOW), collapse.trailing(y, WINDOW)[:30])
    assert not np.array_equal(smooth(y[:30], "ma", WINDOW)[-2:], smooth(y, "ma", WINDOW)[28:30])


# -- the adaptive controller's guard ---------------------------------------------------------

G = 4


def _ctl(**kw) -> Controller:
    cfg = AdaptiveConfig(**{"batch_max": 64, "adapt_every": 4096, "kappa": 0.01,
                            "collapse_patience": PATIENCE, **kw})
    return Controller(cfg, G, run_prompts=4, run_lr=0.01)


def _steps(y, every_steps=4):
    """Steps of 256 samples, an evaluation of `y` every `every_steps` steps (1,024 samples)."""
    for i in range(len(y) * every_steps):
        signals = {"drift_rel": 0.0}
        if (i + 1) % every_steps == 0:
            signals["eval_accuracy"] = float(y[(i + 1) // every_steps - 1])
        yield i + 1, 256.0 * (i + 1), signals


def _drive(ctl, y, split=None):
    """Run the controller over the curve; with `split`, checkpoint and restore it (through
    JSON) before that step. Each step's (prompts, lr, decision reason)."""
    out = []
    for step, samples, signals in _steps(y):
        if step == split:
            ctl = Controller(ctl.cfg, G, 4, 0.01, state=json.loads(json.dumps(ctl.to_dict())))
        d = ctl.observe(step, samples, signals)
        out.append((ctl.prompts, ctl.lr, ctl.state.mode, None if d is None else d.reason))
    return out


def test_the_guard_fires_on_a_collapse_at_the_declaring_evaluation():
    y = _truth(seed=3)
    x = (np.arange(y.size) + 1) * EVERY
    _, declared = _live(x, y)
    rows = _drive(_ctl(), y)
    fired = [i for i, r in enumerate(rows) if r[3] and "collapsed" in r[3]]
    assert len(fired) == 1 and 256.0 * (fired[0] + 1) == x[declared]
    assert rows[fired[0]][:3] == (64, pytest.approx(0.04), "guard")
    assert all(r[2] == "progress" for r in rows[:fired[0]])
    assert all(r[:3] == (64, pytest.approx(0.04), "guard") for r in rows[fired[0]:])
    assert "eval_accuracy collapsed" in rows[fired[0]][3]


def test_the_guard_holds_through_dips_and_without_the_metric():
    y = _truth(collapse_at=None, seed=3)
    assert all(r[2] == "progress" for r in _drive(_ctl(), y))
    # collapse_key "none": the drift guard alone, as before
    assert all(r[2] == "progress" for r in _drive(_ctl(collapse_key="none"), _truth(seed=3)))


def test_the_guard_fires_during_the_drift_warm_up():
    """The warm-up is the drift projection's; a collapse is observed, not projected."""
    rows = _drive(_ctl(adapt_every=10**9, guard_warmup=10**6), _truth(seed=3))
    assert rows[-1][2] == "guard"


@pytest.mark.parametrize("split", [8, COLLAPSE * 4 + 6, COLLAPSE * 4 + 40])
def test_a_controller_restored_mid_run_continues_identically(split):
    """Checkpointed before the collapse, mid-fall (before the declaration) and after it."""
    y = _truth(seed=5)
    assert _drive(_ctl(), y, split=split) == _drive(_ctl(), y)
    mid = _ctl()
    _drive(mid, y[:COLLAPSE + 4])  # fired at COLLAPSE + 3, declared at COLLAPSE + 6
    assert isinstance(mid.to_dict()["live"], dict) and mid.state.live.down is not None


def test_a_checkpoint_without_the_live_rule_still_loads():
    """A state saved before the live rule existed has no `live`: it starts one."""
    ctl = _ctl()
    state = ctl.to_dict()
    del state["live"]
    restored = Controller(ctl.cfg, G, 4, 0.01, state=state)
    assert restored.state.live is None
    restored.observe(1, 256.0, {"eval_accuracy": 0.1})
    assert restored.state.live is not None


def test_a_bad_collapse_key_is_one_line():
    from twoclocks_cli.adaptive.controller import schedule_of
    from twoclocks_cli.core.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        schedule_of({"batch_schedule": "adaptive",
                     "adaptive": {"batch_max": 8, "collapse_key": "loss"}})
    assert "adaptive.collapse_key = 'loss'" in str(err.value) and "\n" not in str(err.value)
