"""Gradient noise scales for sign-like optimizers (signSGD, Signum; Adam once B passes its noise).

McCandlish's B_simple = tr(S)/|G|^2 (`stats.noise_scale`) charges the noise of every
coordinate, including directions without gradient (the flat directions of the theory model:
89% of tr(S) with its defaults), although a step there changes nothing. The estimators here
measure noise the way a sign step feels it. Both work from per-step scalars a trainer can log
from one batch of B samples split into a micro-batch of b samples (gradient g_b) and the rest:

    grad_l1_micro    ||g_b||_1
    grad_l1_full     ||g_B||_1
    grad_sign_dot    <g_B, sign(g_b)>
    grad_l1_diff     ||g_b - g_B||_1      (only `l1_noise_scale` needs it: a copy of g_b)
    grad_micro_size, grad_full_size       b and B, as for B_simple

With G the true gradient, the two-batch terms of one step are

    P = (B <g_B, sign g_b> - b ||g_b||_1) / (B - b) = <g_rest, sign g_b>,
        g_rest the mean gradient of the B - b samples outside the micro-batch, independent of
        g_b; so E[P] = <G, E sign g_b> = sum_i |G_i| (2 Phi(|G_i| sqrt(b)/sigma_i) - 1) for
        Gaussian noise of per-sample std sigma_i: signSGD's expected first-order progress per
        unit step at batch b, unbiased.
    A = ||g_B||_1 - r ||g_b||_1,  r = sqrt(b/B).
        A coordinate that is pure noise has E|g| proportional to 1/sqrt(batch) and drops out
        of E[A] exactly; one that is pure signal leaves (1 - r)|G_i|.

Both are EMA-smoothed (`stats.ema`) before anything is divided, as in `stats.noise_scale`.
The batch sizes should stay fixed within the EMA's memory (true within a phase).
"""

from __future__ import annotations

import numpy as np

from twoclocks_cli.clocks.stats import ema


def sign_terms(l1_micro, l1_full, sign_dot, micro_size, full_size):
    """Per step: P, A, b, r (module docstring) as 1-d float arrays; nan where b >= B."""
    lm, lf, dot, b, bb = np.broadcast_arrays(
        *(
            np.atleast_1d(np.asarray(x, float))
            for x in (l1_micro, l1_full, sign_dot, micro_size, full_size)
        )
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(bb > b, (bb * dot - b * lm) / (bb - b), np.nan)
        r = np.sqrt(b / bb)
        a = lf - r * lm
    return p, a, b, r


def q_squared(p, a, r):
    """(||G||_1 / P)^2 of the fitted curve; inf where the split sees only noise, nan: no signal."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        den = p * p * (1 - r * r) - 2 * r * a * p
        q2 = np.where(den > 0, a * a / den, np.inf)
    q2 = np.where(p > 0, np.maximum(q2, 1.0), np.nan)
    return q2


def sign_noise_scale(
    l1_micro, l1_full, sign_dot, micro_size, full_size, ema_alpha=0.05
) -> np.ndarray:
    """B_sign per step: the noise scale of sign descent, blind to directions without gradient.

    Why: sign descent moves every coordinate by the step size whatever the noise, so with a
    diagonal Hessian its second-order term lr^2 tr(H)/2 does not depend on the batch; all the
    batch dependence is in the expected first-order progress

        P(B) = sum_i |G_i| (2 Phi(|G_i| sqrt(B) / sigma_i) - 1),

    which grows from sqrt(2B/pi) sum_i G_i^2/sigma_i at small B to ||G||_1 as B -> inf. With
    the best step at each batch the loss falls by P(B)^2 / (2 tr H) per step. Written in
    McCandlish's form, P(B)^2 = ||G||_1^2 B / (B + B_sign), that is
    dL_opt(B) = dL_max / (1 + B_sign/B) exactly as for SGD, so B_sign plays B_noise's part:
    the batch at which the samples per unit of progress double. The definition used here is
    that form read off at the micro-batch b,

        B_sign = b (||G||_1^2 / P(b)^2 - 1).

    A coordinate with G_i = 0 adds nothing to P or ||G||_1, however noisy it is (it is in
    tr(S) with sigma_i^2 and in `l1_noise_scale` with sigma_i). With lr scaled as sqrt(B)
    instead of tuned per batch, the same form doubles the samples (first-order progress) at
    3 B_sign.

    Estimator: P is unbiased (module docstring). ||G||_1 is F(0), F(t) = E||g||_1 at
    t = 1/sqrt(batch); for any noise whose batch mean scales as t times a fixed law,
    F(t) - t F'(t) = E[<G, sign g>] = P(t) exactly. Under the McCandlish form that makes
    F(t) = c t + ||G||_1 sqrt(1 + B_sign t^2) (the c t part: pure-noise coordinates), and the
    smoothed A and P pin it down in closed form:

        q^2 = (||G||_1 / P)^2 = A^2 / (P^2 (1 - r^2) - 2 r A P),   B_sign = b (q^2 - 1).

    Exact when P(B) has the McCandlish form. In expectation, on gradients spread over one to
    several decades (the theory model's; log-uniform and log-normal spectra) it lands within
    about a third of the definition (26% low on a log-uniform 1.5 decades); for a single
    coordinate, whose erf curve is steeper than the form, 1.8x high. It resolves B_sign up to
    a few times b: as the micro-batch's signs turn to noise, A/P approaches its limit and the
    estimate runs off to inf. It is far noisier than B_simple, because every noisy coordinate
    still adds variance to P and A: on the theory model (B = 64, 256 flat directions) 64
    pooled steps leave an interquartile range of -30%/+50%, 256 steps about +-15%, where
    B_simple's terms are within +-2% after 64. Smooth over well over 100 steps (ema_alpha of
    0.01 or less) or pool seeds.

    On the theory model with Adam (tests/unit/test_noise_scales.py) B_sign at halfway to the
    target is 4-11x below the measured critical batch: the aggregate sign step saturates
    early, and the scale keeps growing as the fast directions finish (to ~60 by the target,
    where the remaining samples are spent on small-gradient directions); B_simple lands at
    0.8-2x there only because the flat noise inflates it ~9x (without flat directions
    B_simple drops ~9x, the truth and B_sign move by under 10%). Adam is also not signSGD
    below its noise scale: with beta2 = 0.999 its denominator averages G^2 + sigma^2/B over
    many steps instead of |g| of one.

    Source: derived here from signSGD's expected progress (the wrong-sign probabilities of
    Bernstein et al. 2018, "signSGD: compressed optimisation for non-convex problems", taken
    exactly for Gaussian noise). Naganuma et al. 2026 ("Adaptive Batch Sizes Using
    Non-Euclidean Gradient Noise Scales for Stochastic Sign and Spectral Descent") define
    the signSGD noise scale from the l_inf/l_1 dual norms instead, ||sigma||_1^2 / ||G||_1^2
    (`l1_noise_scale`), which counts every noisy coordinate, flat or not.

    Returns per step: nan where the smoothed P <= 0 (no signal yet) or a term is not finite,
    inf where A/P reaches (1 - r^2)/(2r) (the micro-batch's sign is all noise: B_sign >> b,
    beyond what this split resolves), 0 where A/P <= 1 - r (no measurable noise).
    """
    p, a, b, r = sign_terms(l1_micro, l1_full, sign_dot, micro_size, full_size)
    ok = np.isfinite(p) & np.isfinite(a) & np.isfinite(r)
    out = np.full(ok.size, np.nan)
    if not ok.any():
        return out
    ep, ea, eb, er = (ema(x[ok], ema_alpha) for x in (p, a, b, r))
    with np.errstate(invalid="ignore"):
        out[ok] = eb * (q_squared(ep, ea, er) - 1.0)
    return out


def l1_noise_scale(
    l1_micro, l1_full, sign_dot, l1_diff, micro_size, full_size, ema_alpha=0.05
) -> np.ndarray:
    """B_l1 = ||sigma||_1^2 / ||G||_1^2 per step: Naganuma et al.'s noise scale for signSGD.

    Source: Naganuma, Gupta, Briki, Mitliagkas, Rish, Raman, Shi, "Adaptive Batch Sizes Using
    Non-Euclidean Gradient Noise Scales for Stochastic Sign and Spectral Descent" (ICML 2026,
    arXiv 2602.03001): the gradient noise scale in signSGD's dual norm, variance as the
    squared l1 norm of the per-coordinate standard deviations, gradient in l1 (their
    companion code's `l1_gns_batch_size`: std_l1^2 / mean_l1^2, std_l1 = sum_i sigma_i from
    per-rank gradients). It is where the signSGD progress bound ||G||_1 - 2 ||sigma||_1/sqrt(B)
    (Bernstein et al. 2018) stops being dominated by its noise term; the bound charges
    sigma_i to every coordinate, so flat directions count (quadratically in their number).

    Terms: sum_i sigma_i = sqrt(pi/2) ||g_b - g_B||_1 / sqrt(1/b - 1/B), unbiased for Gaussian
    noise (g_b - g_B ~ N(0, sigma_i^2 (1/b - 1/B)) per coordinate); ||G||_1 = q P as in
    `sign_noise_scale` (nan where that is inf), not the batch gradient's own l1 norm, which
    noise inflates by sqrt(2/pi) sigma_i/sqrt(B) per coordinate. Each EMA-smoothed before the
    ratio.
    """
    p, a, b, r = sign_terms(l1_micro, l1_full, sign_dot, micro_size, full_size)
    diff = np.broadcast_to(np.atleast_1d(np.asarray(l1_diff, float)), p.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        sig1 = np.sqrt(np.pi / 2) * diff / np.sqrt((1 - r * r) / b)
    ok = np.isfinite(p) & np.isfinite(a) & np.isfinite(r) & np.isfinite(sig1)
    out = np.full(ok.size, np.nan)
    if not ok.any():
        return out
    ep, ea, er, es = (ema(x[ok], ema_alpha) for x in (p, a, r, sig1))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        g1_sq = q_squared(ep, ea, er) * ep * ep  # ||G||_1^2
        out[ok] = np.where(np.isfinite(g1_sq), es * es / g1_sq, np.nan)
    return out
