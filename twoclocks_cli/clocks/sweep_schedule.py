"""A sweep's schedule from its stored analysis (`twoclocks schedule`): the analysis reused while
current, else made again, then `make_schedule`, and how settled the decision is."""

from __future__ import annotations


def schedule_sweep(
    store, sweep: str, safety: float = 0.8, budget: float | None = None, reanalyze: bool = False,
    large_lr: str = "sweep", stability: int = 0, objective: str = "samples", cost=None,
) -> dict:
    """The schedule of `sweep` from its latest stored analysis while that is current (else
    analysed again with its options; with defaults when never analysed or `reanalyze`), and,
    with `stability` resamples, how settled it is (its verdict first in the rationale)."""
    from twoclocks_cli.clocks import make_schedule
    from twoclocks_cli.clocks.cost import for_analysis
    from twoclocks_cli.clocks.saved import analysis_for
    from twoclocks_cli.clocks.stability import measure

    analysis, how = analysis_for(store, sweep, {} if reanalyze else None)
    time = for_analysis(analysis, cost) if cost is not None else None
    out = make_schedule(analysis, budget=budget, safety=safety, large_lr=large_lr,
                        objective=objective, time=time)
    if stability:
        st = measure(analysis, stability, analysis.options.seed, budget=budget, safety=safety,
                     large_lr=large_lr, objective=objective, time=time).to_json()
        out["stability"] = st
        out["settled"] = st["settled"]
        out["rationale"].insert(0, f"decision {st['verdict']}")
    out["analysis_id"] = analysis.analysis_id
    out["analysis_source"] = how
    out["analysis_options"] = analysis.options.to_json()
    return out
