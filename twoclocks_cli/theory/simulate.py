"""Vectorised simulator of the local quadratic model: many runs (rows) advance one step at a time.

Each row has its own batch size, learning rate and displacement cap, so one loop simulates a whole
batch-size x seed sweep. The state is plain arrays, saved and restored for resumable runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from twoclocks_cli.theory.model import ModelConfig


@dataclass
class StepInfo:
    """What one step measured, per row (arrays of length rows).

    The gradient terms (nan when the step ran with grad_terms=False) come from the micro-batch
    gradient g_b (the first `micro_size` samples of the batch) and the full-batch gradient g_B:
    grad_sq_* are squared L2 norms (McCandlish's B_simple), grad_l1_* the L1 norms,
    grad_sign_dot = <g_B, sign(g_b)> and grad_l1_diff = ||g_b - g_B||_1 (the sign-descent and
    l1 noise scales of twoclocks_cli.clocks.noise).
    """

    loss: np.ndarray
    drift: np.ndarray
    grad_sq_micro: np.ndarray
    grad_sq_full: np.ndarray
    micro_size: np.ndarray
    nonfinite: np.ndarray
    step_norm: np.ndarray
    grad_l1_micro: np.ndarray | None = None
    grad_l1_full: np.ndarray | None = None
    grad_sign_dot: np.ndarray | None = None
    grad_l1_diff: np.ndarray | None = None


@dataclass
class SimState:
    """Parameters, optimizer moments and clocks of `rows` independent runs."""

    cfg: ModelConfig
    theta: np.ndarray
    theta0: np.ndarray
    m: np.ndarray
    v: np.ndarray
    t: np.ndarray  # optimizer steps taken per row
    samples: np.ndarray  # samples consumed per row
    collapsed_at: np.ndarray  # samples at which drift crossed the threshold (nan: not yet)
    rng: np.random.Generator = field(repr=False)

    @classmethod
    def start(cls, cfg: ModelConfig, rows: int, seed: int) -> SimState:
        """Fresh runs: curved coordinates at +-theta0 (random signs), flat ones at 0."""
        rng = np.random.default_rng(seed)
        width = cfg.dim + cfg.flat_dims
        signs = rng.choice([-1.0, 1.0], size=(rows, cfg.dim))
        theta = np.zeros((rows, width))
        theta[:, : cfg.dim] = cfg.theta0 * signs
        return cls(
            cfg=cfg,
            theta=theta,
            theta0=theta.copy(),
            m=np.zeros_like(theta),
            v=np.zeros_like(theta),
            t=np.zeros(rows),
            samples=np.zeros(rows),
            collapsed_at=np.full(rows, np.nan),
            rng=rng,
        )

    def branch(self, rows: int, seed: int) -> SimState:
        """`rows` copies of this one-row state with fresh noise (seeded): branches from here.

        The collapse time keeps its samples axis; callers that count samples from the branch
        point shift both (see theory.sweep.simulate_sweep)."""
        if self.theta.shape[0] != 1:
            raise ValueError("branch() needs a one-row state")

        def rep(a):
            return np.repeat(a, rows, axis=0).copy()

        return SimState(cfg=self.cfg, theta=rep(self.theta), theta0=rep(self.theta0),
                        m=rep(self.m), v=rep(self.v), t=rep(self.t), samples=rep(self.samples),
                        collapsed_at=rep(self.collapsed_at), rng=np.random.default_rng(seed))

    # -- dynamics --------------------------------------------------------------------------

    def step(self, batch, lr, cap=None, active=None, grad_terms=True) -> StepInfo:
        """Advance every active row by one optimizer step on a fresh batch of its size.

        `grad_terms=False` skips the micro-batch split (the gradient terms come back as nan): one
        draw.
        """
        cfg = self.cfg
        rows, width = self.theta.shape
        batch = np.broadcast_to(np.asarray(batch, dtype=float), (rows,))
        lr = np.broadcast_to(np.asarray(lr, dtype=float), (rows,))
        active = np.ones(rows, bool) if active is None else np.asarray(active, bool)
        h = cfg.h
        # the batch mean noise is assembled from a micro-batch and the rest, so the micro-batch's
        # gradient (for the gradient-noise terms) is exactly a sub-mean of the same batch
        mean_grad = h * self.theta
        if grad_terms:
            micro = np.clip(np.floor(batch * cfg.micro_fraction), 1.0, np.maximum(batch - 1, 1.0))
            rest = batch - micro  # 0 for a batch of one sample: no split
            z_micro = (
                self.rng.standard_normal((rows, width)) * (cfg.sigma / np.sqrt(micro))[:, None]
            )
            z_rest = (
                self.rng.standard_normal((rows, width))
                * (cfg.sigma / np.sqrt(np.maximum(rest, 1.0)))[:, None]
            )
            xi = (micro[:, None] * z_micro + rest[:, None] * z_rest) / batch[:, None]
        else:
            micro = np.full(rows, np.nan)
            xi = self.rng.standard_normal((rows, width)) * (cfg.sigma / np.sqrt(batch))[:, None]
        g = mean_grad + xi
        with np.errstate(over="ignore", invalid="ignore"):
            if grad_terms:
                g_micro = mean_grad + z_micro
                g_micro_sq = np.sum(g_micro**2, axis=1)
                g_full_sq = np.sum(g**2, axis=1)
                l1_micro = np.sum(np.abs(g_micro), axis=1)
                l1_full = np.sum(np.abs(g), axis=1)
                sign_dot = np.sum(g * np.sign(g_micro), axis=1)
                l1_diff = np.sum(np.abs(g_micro - g), axis=1)
            else:
                g_micro_sq = g_full_sq = np.full(rows, np.nan)
                l1_micro, l1_full, sign_dot, l1_diff = (np.full(rows, np.nan) for _ in range(4))
            delta = self._update(g, lr, batch, active)
            norm = np.sqrt(np.sum(delta**2, axis=1))
            if cap is not None:
                cap = np.broadcast_to(np.asarray(cap, dtype=float), (rows,))
                scale = np.where(
                    np.isfinite(cap) & (norm > cap), cap / np.maximum(norm, 1e-300), 1.0
                )
                delta = delta * scale[:, None]
                norm = norm * scale
            delta[~active] = 0.0
            self.theta += delta
            self.samples += np.where(active, batch, 0.0)
            loss = 0.5 * np.sum(h * self.theta**2, axis=1)
            drift = np.sqrt(np.sum((self.theta - self.theta0) ** 2, axis=1))
        newly = active & np.isnan(self.collapsed_at) & (drift >= cfg.drift_threshold)
        self.collapsed_at[newly] = self.samples[newly]
        nonfinite = ~np.isfinite(loss) | (grad_terms & ~np.isfinite(g_full_sq))
        return StepInfo(
            loss,
            drift,
            g_micro_sq,
            g_full_sq,
            micro,
            nonfinite,
            norm,
            grad_l1_micro=l1_micro,
            grad_l1_full=l1_full,
            grad_sign_dot=sign_dot,
            grad_l1_diff=l1_diff,
        )

    def _update(self, g, lr, batch, active) -> np.ndarray:
        """The optimizer's displacement for gradient estimate g (rows not active: unchanged)."""
        cfg = self.cfg
        if cfg.optimizer == "sgd":
            return -lr[:, None] * g
        if cfg.optimizer == "normalized":
            return -(lr * np.sqrt(batch) / cfg.sigma)[:, None] * g
        b1, b2 = cfg.beta1, cfg.beta2
        if active.all():
            self.m = b1 * self.m + (1 - b1) * g
            self.v = b2 * self.v + (1 - b2) * g * g
        else:
            a = active[:, None]
            self.m = np.where(a, b1 * self.m + (1 - b1) * g, self.m)
            self.v = np.where(a, b2 * self.v + (1 - b2) * g * g, self.v)
        self.t = self.t + active
        t = np.maximum(self.t, 1)[:, None]
        m_hat = self.m / (1 - b1**t)
        v_hat = self.v / (1 - b2**t)
        return -lr[:, None] * m_hat / (np.sqrt(v_hat) + cfg.adam_eps)

    # -- observables -----------------------------------------------------------------------

    def progress(self, loss: np.ndarray) -> np.ndarray:
        """The noise-free progress in [0, 1]: 1 - L/L0, decaying after collapse."""
        cfg = self.cfg
        with np.errstate(invalid="ignore", over="ignore"):
            p = np.clip(1.0 - loss / cfg.loss0, 0.0, 1.0)
            after = np.where(np.isnan(self.collapsed_at), 0.0, self.samples - self.collapsed_at)
            p = p * np.exp(-np.maximum(after, 0.0) / cfg.collapse_samples)
        return np.where(np.isfinite(p), p, 0.0)

    # -- persistence -----------------------------------------------------------------------

    def save(self, path: Path, extra: dict | None = None) -> None:
        """Write the whole state (arrays + RNG) atomically to `path` (.npz)."""
        import json

        tmp = Path(str(path) + ".tmp.npz")
        np.savez(
            tmp,
            theta=self.theta,
            theta0=self.theta0,
            m=self.m,
            v=self.v,
            t=self.t,
            samples=self.samples,
            collapsed_at=self.collapsed_at,
            rng=np.array(json.dumps(self.rng.bit_generator.state)),
            extra=np.array(json.dumps(extra or {})),
        )
        tmp.replace(path)

    @classmethod
    def load(cls, cfg: ModelConfig, path: Path) -> tuple[SimState, dict]:
        import json

        with np.load(path) as z:
            rng = np.random.default_rng()
            rng.bit_generator.state = json.loads(str(z["rng"]))
            state = cls(
                cfg=cfg,
                theta=z["theta"],
                theta0=z["theta0"],
                m=z["m"],
                v=z["v"],
                t=z["t"],
                samples=z["samples"],
                collapsed_at=z["collapsed_at"],
                rng=rng,
            )
            return state, json.loads(str(z["extra"]))
