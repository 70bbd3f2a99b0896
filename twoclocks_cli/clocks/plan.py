"""The decision: per-batch clocks + an objective -> the plan (B_small, switch, B_large, end).

A plan runs B_small from the start and, optionally, B_large from N_switch on. It is priced by
one model for both clocks, the *clock fraction*: a phase of n samples at batch b spends n / E(b)
of the progress to the target and n / F(b) of the failure clock, so a switch at N spends the
rest at the new batch's rate. Then

- progress: E(b1) when N >= E(b1), else N + (1 - N / E(b1)) E(b2); its seconds and cost the
  same with seconds per sample at each batch;
- the end: where the failure fraction reaches the safety factor s, counted from the start of
  training: s F(b1) for one phase, N + (s - N / F(b1)) F(b2) after a switch (the budget caps
  both). F(b) is a *per-run* lower bound (`failure_bound`): a single run must be unlikely to
  fail before it, not only the median run;
- a plan is feasible when it reaches the target before it ends.

The plan chosen minimises the objective's clock to the target (samples, seconds or cost) over
the feasible plans. Plans within TOL of the best are indistinguishable on a few seeds, so
B_small is the largest first batch among them (fewer steps for the same work); of that batch's
plans those with the least clock, and of those the fewest phases whose end is within TOL of the
latest end (a switch must buy more than TOL of training before the failure bound), then the
latest end. Only batches that reached the target enter, so every number a
plan uses was measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

TOL = 0.10  # plans within 10% of the best objective value are indistinguishable
QUANTILE = 0.05  # a single run fails before its batch's failure bound with this probability


@dataclass(frozen=True)
class BatchClocks:
    """What the decision reads of one batch: its median progress clock, its per-run failure
    bound and how that bound was formed, and its price per sample (None: not timed)."""

    batch: float
    progress: float  # median samples to the target (only batches that reached it enter)
    fail: float | None  # per-run lower bound of the failure clock (None: no seed failed)
    fail_basis: str = ""
    one_seed: bool = False  # the bound rests on one failed seed and no spread: stricter safety
    seconds_per_sample: float | None = None
    cost_per_sample: float | None = None
    reach: float | None = None  # samples its runs logged without failing (censored bound)


@dataclass(frozen=True)
class Plan:
    """One candidate schedule and its clocks (`n_switch` None: one phase at `b_small`)."""

    b_small: float
    b_large: float
    n_switch: float | None
    end: float  # where the last phase ends
    stopped: bool  # the end is a failure bound (else the budget)
    progress: float  # predicted samples to the target
    seconds: float | None
    cost: float | None
    safety: float  # the factor applied (squared where a bound rests on one seed)

    @property
    def phases(self) -> int:
        return 1 if self.n_switch is None else 2

    def value(self, objective: str) -> float | None:
        """The clock to the target the objective minimises."""
        return {"samples": self.progress, "time": self.seconds, "cost": self.cost}[objective]


# -- the failure bound of one run ------------------------------------------------------------


def pooled_log_spread(failures: dict[float, list[float]]) -> tuple[float | None, int]:
    """The seed-to-seed sd of log failure clocks pooled over batches (with its degrees of
    freedom): a batch with one or two failed seeds borrows the spread of the others."""
    ss, dof = 0.0, 0
    for f in failures.values():
        if len(f) >= 2:
            lf = np.log(f)
            ss += float(np.sum((lf - lf.mean()) ** 2))
            dof += len(f) - 1
    return (math.sqrt(ss / dof), dof) if dof else (None, 0)


def failure_bound(failed: list[float], spread: float | None, dof: int) -> tuple[float, str, bool]:
    """A lower bound a single new run fails after with probability 1 - QUANTILE: the one-sided
    log-normal prediction bound exp(mean - t sd sqrt(1 + 1/n)), never above the earliest failure
    seen. (bound, how, rests on one seed without a spread)."""
    from scipy.stats import t

    earliest = min(failed)
    if spread is None:
        return earliest, f"the one failed seed's clock {earliest:,.0f}", True
    n = len(failed)
    mean = float(np.mean(np.log(failed)))
    bound = math.exp(mean - float(t.ppf(1 - QUANTILE, dof)) * spread * math.sqrt(1 + 1 / n))
    if bound >= earliest:
        return earliest, f"the earliest failed seed's clock {earliest:,.0f}", False
    return bound, (f"the {1 - QUANTILE:.0%} per-run lower bound {bound:,.0f} ({n} failed "
                   f"seed(s), log spread {spread:.2f} over {dof} dof)"), False


# -- the candidates ---------------------------------------------------------------------------


def one_phase(c: BatchClocks, safety: float, budget: float) -> Plan:
    """B_small alone, to its failure bound or the budget."""
    s = safety**2 if c.one_seed else safety
    end = budget if c.fail is None else min(budget, s * c.fail)
    return Plan(c.batch, c.batch, None, end, c.fail is not None and s * c.fail < budget,
                c.progress, _price(c, c.progress, "seconds_per_sample"),
                _price(c, c.progress, "cost_per_sample"), s)


def _price(c: BatchClocks, samples: float, per: str) -> float | None:
    rate = getattr(c, per)
    return None if rate is None else samples * rate


def _large_fail(c: BatchClocks) -> float | None:
    """B_large's failure bound; a batch none of whose seeds failed is bounded by its reach."""
    return c.fail if c.fail is not None else c.reach


def two_phase(a: BatchClocks, b: BatchClocks, n: float, safety: float, budget: float) -> Plan:
    """a until n samples, then b; priced by the clock fraction (module docstring)."""
    s = safety**2 if (a.one_seed or b.one_seed) else safety
    fb = _large_fail(b)
    end = n + (s - n / a.fail) * fb
    if n >= a.progress:
        prog, secs, cost = a.progress, _price(a, a.progress, "seconds_per_sample"), \
            _price(a, a.progress, "cost_per_sample")
    else:
        rest = (1 - n / a.progress) * b.progress
        prog = n + rest
        secs = _sum(_price(a, n, "seconds_per_sample"), _price(b, rest, "seconds_per_sample"))
        cost = _sum(_price(a, n, "cost_per_sample"), _price(b, rest, "cost_per_sample"))
    return Plan(a.batch, b.batch, n, min(end, budget), end < budget, prog, secs, cost, s)


def _sum(x, y):
    return None if x is None or y is None else x + y


def switch_points(a: BatchClocks, b: BatchClocks, safety: float, budget: float,
                  after_target: bool) -> list[float]:
    """Where a switch from a to b can be optimal. On [0, E(a)] the plan's clocks are linear in
    the switch point and its constraints are half-lines, so the optimum is at an end of the
    feasible interval: E(a), the switch's room s F(a), and where progress meets the end or the
    budget (a switch at 0 is b alone, a one-phase plan). Past E(a) the end only falls as the
    switch moves later (b fails later)."""
    s = safety**2 if (a.one_seed or b.one_seed) else safety
    fb = _large_fail(b)
    room = s * a.fail
    pts = [a.progress]
    if not after_target:
        slope = fb / a.fail - b.progress / a.progress  # progress <= end: n * slope <= s fb - Eb
        if slope != 0:
            pts.append((s * fb - b.progress) / slope)
        if a.progress != b.progress:
            pts.append((budget - b.progress) / (1 - b.progress / a.progress))
        pts.append(room * (1 - 1e-9))
    return sorted({p for p in pts if 0 < p < room and p <= a.progress and math.isfinite(p)})


def candidates(clocks: list[BatchClocks], safety: float, budget: float,
               after_target: bool = False) -> list[Plan]:
    """Every plan the data support: one phase at each batch that reached the target, and a
    switch from each batch with a failure bound to each larger batch that fails later."""
    out = [one_phase(c, safety, budget) for c in clocks]
    for a in clocks:
        if a.fail is None:
            continue  # no failure predicted: one phase runs to the budget
        for b in clocks:
            fb = _large_fail(b)
            if b.batch <= a.batch or fb is None or fb <= a.fail:
                continue
            for n in switch_points(a, b, safety, budget, after_target):
                out.append(two_phase(a, b, n, safety, budget))
    return out


def feasible(plan: Plan) -> bool:
    """It reaches the target before it ends (a small tolerance for float rounding)."""
    return plan.progress <= plan.end * (1 + 1e-9)


def _priced_feasible(plans: list[Plan], objective: str) -> list[Plan]:
    """The plans that reach the target before they end and that the objective can price."""
    return [p for p in plans if feasible(p) and p.value(objective) is not None]


def choose(plans: list[Plan], objective: str) -> Plan | None:
    """The plan the objective prefers (module docstring): B_small is the largest first batch of
    a plan within TOL of the least objective clock; among that batch's plans the least clock,
    then the fewest phases ending within TOL of the latest end, then the latest end. None: no
    feasible, priced plan."""
    ok = _priced_feasible(plans, objective)
    if not ok:
        return None
    best = min(p.value(objective) for p in ok)
    b_small = max(p.b_small for p in ok if p.value(objective) <= best * (1 + TOL))
    mine = [p for p in ok if p.b_small == b_small]
    least = min(p.value(objective) for p in mine)
    top = [p for p in mine if p.value(objective) <= least * (1 + 1e-9)]
    latest = max(p.end for p in top)
    # ends within TOL are as indistinguishable as clocks are: a switch must buy more than that
    near = [p for p in top if p.end * (1 + TOL) >= latest]
    return max(near, key=lambda p: (-p.phases, p.end))


def fastest(plans: list[Plan], objective: str) -> Plan | None:
    """The feasible plan of least objective clock, no tolerance (what the tolerance gave up)."""
    ok = _priced_feasible(plans, objective)
    return min(ok, key=lambda p: (p.value(objective), -p.b_small)) if ok else None


def rounded(plan: Plan) -> Plan:
    """The plan with its switch and end in whole samples, as the phase list writes them; a switch
    after the target stays after it (rounded up)."""
    n = plan.n_switch
    if n is not None:
        n = float(math.ceil(n) if n >= plan.progress else round(n))
    return replace(plan, n_switch=n, end=float(round(plan.end)))
