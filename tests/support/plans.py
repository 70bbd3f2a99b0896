"""An independent brute-force search over schedules (B_small, a fine grid of switch points,
B_large), priced from scratch by the clock fraction: the truth `clocks.plan` is checked against."""

from __future__ import annotations

import numpy as np

from twoclocks_cli.clocks.plan import TOL


def brute_force(clocks, safety, budget, objective, after_target):
    """Every (B_small, switch on a fine grid, B_large) priced from scratch by the clock
    fraction, chosen by the documented rule."""
    plans = []
    for a in clocks:
        s1 = safety**2 if a.one_seed else safety
        end = budget if a.fail is None else min(budget, s1 * a.fail)
        plans.append((a.batch, a.batch, None, end, a.progress,
                      None if a.seconds_per_sample is None else a.progress * a.seconds_per_sample))
        if a.fail is None:
            continue
        for b in clocks:
            fb = b.fail if b.fail is not None else b.reach
            if b.batch <= a.batch or fb is None or fb <= a.fail:
                continue
            s = safety**2 if (a.one_seed or b.one_seed) else safety
            hi = min(s * a.fail, a.progress) if not after_target else a.progress
            grid = np.linspace(0, hi, 3001)[1:] if not after_target else [a.progress]
            for n in grid:
                if n >= s * a.fail:
                    continue
                end = min(budget, n + (s - n / a.fail) * fb)
                if n >= a.progress:
                    prog, secs = a.progress, a.progress * (a.seconds_per_sample or np.nan)
                else:
                    rest = (1 - n / a.progress) * b.progress
                    prog = n + rest
                    secs = n * (a.seconds_per_sample or np.nan) + rest * (
                        b.seconds_per_sample or np.nan)
                plans.append((a.batch, b.batch, n, end, prog, secs))
    key = 4 if objective == "samples" else 5
    ok = [p for p in plans if p[4] <= p[3] * (1 + 1e-9) and p[key] is not None
          and np.isfinite(p[key])]
    if not ok:
        return None
    best = min(p[key] for p in ok)
    small = max(p[0] for p in ok if p[key] <= best * (1 + TOL))
    mine = [p for p in ok if p[0] == small]
    least = min(p[key] for p in mine)
    return least, small, mine, key
