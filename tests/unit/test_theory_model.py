"""The local quadratic model: closed forms vs the simulator, and the failure-clock exponents."""

import numpy as np
import pytest

from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.theory import (
    ModelConfig,
    SimState,
    curvature_critical_batch,
    curvature_penalty_per_sample,
    expected_loss,
    failure_clock,
    failure_exponent,
    first_order_drift_per_sample,
    scaled_lr,
    simulate_sweep,
    stationary_floor,
    step_constant,
)


def test_expected_loss_recurrence_matches_simulation_of_normalised_steps():
    cfg = ModelConfig(dim=8, flat_dims=0, optimizer="normalized", h_min=0.2, h_max=1.0)
    lr0, b0, batch, samples = 0.02, 16, 32, 3200
    lr = float(scaled_lr(lr0, b0, batch))
    state = SimState.start(cfg, rows=2000, seed=1)
    for _ in range(samples // batch):
        info = state.step(batch, lr)
    c = step_constant(lr0, cfg.sigma, b0)
    predicted = expected_loss(c, cfg.sigma, cfg.h[: cfg.dim], cfg.theta0, batch, samples)
    assert abs(info.loss.mean() / predicted - 1) < 0.05


def test_first_order_drift_invariant_and_curvature_batch():
    c, h = 0.003, np.array([0.1, 1.0])
    assert np.allclose(first_order_drift_per_sample(c, h), c * h)
    # one step of x = c B h: contraction per sample ~ c h for every B while x is small
    for b in (1, 4, 16):
        per_sample = -np.log(1 - c * b * h) / b
        assert np.allclose(per_sample, c * h, rtol=0.05)
    bc = curvature_critical_batch(c, h)
    theta = 0.7
    gain = c * h**2 * theta**2  # first-order loss decrease per sample
    assert np.allclose(curvature_penalty_per_sample(c, h, theta, bc), gain)


def test_stationary_floor_rises_with_batch_and_diverges_at_x_2():
    c, s, h = 0.01, 1.0, 1.0
    floors = stationary_floor(c, s, h, [1, 50, 150, 199])
    assert np.all(np.diff(floors) > 0)
    assert np.isinf(stationary_floor(c, s, h, 200)) and np.isinf(stationary_floor(c, s, h, 300))


def test_failure_exponents_per_rule():
    assert failure_exponent("adam", 0.5) == 0.0  # sqrt: invariant per sample
    assert failure_exponent("adam", 0.0) == 1.0  # constant lr: invariant per step
    assert failure_exponent("sgd", 1.0) == 0.0  # SGD needs linear scaling for invariance


@pytest.mark.parametrize("optimizer,alpha", [("adam", 0.5), ("adam", 1.0), ("sgd", 0.5)])
def test_simulated_failure_clock_follows_the_predicted_exponent(optimizer, alpha):
    lr0 = 0.01 if optimizer == "adam" else 0.05
    cfg = ModelConfig(dim=0, flat_dims=128, optimizer=optimizer, drift_threshold=3.0)
    batches = np.array([8.0, 32.0])
    lrs = scaled_lr(lr0, 16, batches, alpha)
    pred = failure_clock(optimizer, lrs, batches, cfg.sigma, cfg.flat_dims, cfg.drift_threshold)
    res = simulate_sweep(cfg, batches, lrs, 4, float(pred.max()) * 3, target=2.0)
    _, sim = res.median_by_batch("n_fail")
    slope = np.log(sim[1] / sim[0]) / np.log(4)
    assert abs(slope - failure_exponent(optimizer, alpha)) < 0.15, (sim, pred)
    assert np.allclose(sim, pred, rtol=0.25), (sim, pred)


def test_state_save_and_load_continue_identically(tmp_path):
    cfg = ModelConfig(dim=4, flat_dims=4)
    a = SimState.start(cfg, 2, seed=5)
    for _ in range(10):
        a.step(8, 0.01)
    a.save(tmp_path / "s.npz", {"step": 10})
    b, extra = SimState.load(cfg, tmp_path / "s.npz")
    assert extra == {"step": 10}
    for _ in range(5):
        ia, ib = a.step(8, 0.01), b.step(8, 0.01)
    assert np.array_equal(a.theta, b.theta) and np.array_equal(ia.loss, ib.loss)


def test_cap_limits_every_step():
    cfg = ModelConfig(dim=4, flat_dims=60)
    state = SimState.start(cfg, 3, seed=0)
    for _ in range(20):
        info = state.step([4, 64, 1024], 0.05, cap=0.02)
        assert np.all(info.step_norm <= 0.02 + 1e-12)


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="unknown key.*bogus"):
        ModelConfig.from_dict({"bogus": 1})
    with pytest.raises(ConfigError, match="optimizer"):
        ModelConfig.from_dict({"optimizer": "lion"})
    with pytest.raises(ConfigError, match="sigma"):
        ModelConfig.from_dict({"sigma": 0})
    with pytest.raises(ConfigError, match=r"sim.dim = 2.5: .*integer"):
        ModelConfig.from_dict({"dim": 2.5})
    with pytest.raises(ConfigError, match="sim.cap"):
        ModelConfig.from_dict({"cap": [1]})
    assert ModelConfig.from_dict({"dim": "8", "cap": "0.1"}).dim == 8  # TOML/JSON strings


@pytest.mark.slow
def test_critical_batch_prediction_mechanisms():
    from twoclocks_cli.theory import predict_critical_batch

    cfg = ModelConfig()
    capped = predict_critical_batch(cfg, 0.01, 32, 0.9, cap=0.05, seeds=8)
    assert capped["mechanism"].startswith("step cap")
    assert capped["b_crit"] == pytest.approx(capped["e_min"] / capped["s_min"])
    # a larger lr makes the cap bind at smaller batches
    assert (
        predict_critical_batch(cfg, 0.04, 32, 0.9, cap=0.05, seeds=8)["b_crit"] < capped["b_crit"]
    )
    # the idealised normaliser hits the curvature wall: the floor passes a tight target
    wall = predict_critical_batch(ModelConfig(optimizer="normalized"), 0.05, 32, 0.97, seeds=8)
    assert wall["mechanism"].startswith("curvature wall") and wall["b_crit"] >= 1, wall
