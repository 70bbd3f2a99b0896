"""What `twoclocks schedule` prints: the phases, B_crit, both predicted clocks and why."""

from __future__ import annotations

import typer

from twoclocks_cli.core.numbers import count


def render_schedule(result: dict, name: str, out: str | None) -> None:
    """The schedule of sweep `name` (`clocks.sweep_schedule.schedule_sweep`'s dict) as lines;
    `out`: the TOML file it was written to, if any."""
    if result.get("stability"):
        typer.echo(f"decision {result['stability']['verdict']}")
    typer.echo(f"schedule for sweep {name!r}:")
    for i, ph in enumerate(result["phases"]):
        typer.echo(
            f"  phase {i}: until {count(ph['until_samples'])} samples: "
            f"{ph['prompts_per_batch']} prompts/batch, lr {ph['lr']:.4g}, "
            f"clip [{ph['clip_eps_low']}, {ph['clip_eps_high']}]"
        )
    pred = result["predicted"]
    typer.echo(f"B_crit: {result['b_crit_text']} samples ({result['b_crit_source'] or 'none'})")
    typer.echo(f"predicted progress clock: {_f(pred['progress_samples'], pred['progress_why'])}")
    typer.echo(f"predicted failure clock: {_f(pred['failure_samples'], pred['failure_why'])}")
    typer.echo("rationale:")
    for line in result["rationale"]:
        typer.echo(f"  - {line}")
    if out:
        typer.echo(f"wrote {out}")


def _f(v, why: str) -> str:
    """A predicted clock in samples with its reason, or 'unknown' and why."""
    return f"unknown: {why}" if v is None else f"{v:,.0f} samples ({why})"
