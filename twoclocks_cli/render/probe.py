"""What `twoclocks probe` prints: the branches' clocks per batch size, the local B_crit, and
(grpo) the in-run noise scales, the replay's check and where an unfinished probe stands."""

from __future__ import annotations

from twoclocks_cli.core.numbers import count, num
from twoclocks_cli.render.tables import console


def render_sim_probe(result, run_id: int) -> None:
    """A sim probe (`probe.sim.probe_run`'s result): its clocks, B_crit and the theory's."""
    con = console()
    con.print(_clock_table(f"run {run_id} branched at {result.at_samples:,.0f} samples: samples "
                           f"from progress {result.progress_at:.4g} to {result.target:.4g}",
                           result.batches, result.lrs, result.clocks))
    con.print(_b_crit_line(result.b_crit))
    if result.truth is not None:
        tb = result.truth.b_crit
        con.print(f"theory's local B_crit from the same state: "
                  f"{'none' if tb is None else num(tb)} ({result.truth.mechanism})")
    for n in result.notes:
        con.print(f"note: {n}")


def render_grpo_probe(result) -> None:
    """A finished grpo probe (`probe.grpo.result`): clocks, B_crit, noise scales, replay."""
    con = console()
    con.print(_clock_table(
        f"run {result.run_id} branched at {result.at_samples:,} samples (step "
        f"{result.at_step}): samples from {result.metric} {result.progress_at:.4g} to "
        f"{result.target:.4g}", result.batches, result.lrs, result.clocks))
    con.print(_b_crit_line(result.b_crit))
    nz = result.noise
    said = {k: num(nz[k]) if nz[k] is not None else nz["why"][k] for k in ("b_simple", "b_sign")}
    at = f"at step {nz['step']}" if nz["step"] is not None else "at the branch point"
    con.print(f"in-run noise scales of run {result.run_id} {at} (samples; two-batch terms, "
              f"EMA {nz['ema']:g}): B_simple {said['b_simple']}; B_sign {said['b_sign']}")
    rp = result.replay
    if rp["steps"] == 0:
        con.print("no replay: at 0 samples the branches start from the initial weights")
    elif rp["identical"]:
        con.print(f"replay: identical to run {result.run_id} at every one of its {rp['steps']} "
                  f"steps ({', '.join(rp['keys'])})")
    else:
        d = rp["first_difference"]
        con.print(f"[bold]warning: the replay differs from run {result.run_id} from step "
                  f"{d['step']} ({d['key']} {d['run']!r} vs {d['replay']!r}): the branches "
                  "start from another state (a different thread count or torch build?)[/bold]")
    for n in result.notes:
        con.print(f"note: {n}")


def stage_text(probe, stage, executor: str) -> str:
    """Where an unfinished probe stands, and how to continue it."""
    where = (f"replay {stage.replay}" if stage.replay not in (None, "completed") else
             ", ".join(f"{n} {s}" for s, n in sorted(stage.branches.items())) + " branch(es)")
    return (f"probe of run {probe.run_id} at {probe.at_samples:,} samples (sweep "
            f"{probe.sweep}): {where}; submitted {stage.submitted} cell(s) via {executor}. "
            "Run the same command again to continue, or add --wait")


def _b_crit_line(est) -> str:
    """'local B_crit: 36 [30, 41] (interpolated; how)', or 'unknown (why)'."""
    how = est.note if est.placement is None else f"{est.placement}; {est.note}"
    return f"[bold]local B_crit: {est.text()}[/bold] ({how})"


def _clock_table(title: str, batches, lrs, clocks):
    """The clocks per batch size: median (censored when half or more are) and every seed's."""
    from rich.table import Table

    t = Table(title=title)
    for col in ("batch", "lr", "median", "per seed"):
        t.add_column(col)
    for b, lr in zip(batches, lrs, strict=True):
        vals = clocks[b]
        got = sorted(v for v in vals if v is not None)
        med = "censored" if len(got) * 2 <= len(vals) else count(got[len(vals) // 2])
        t.add_row(num(b), num(lr, 3), med,
                  ", ".join("censored" if v is None else count(v) for v in vals))
    return t
