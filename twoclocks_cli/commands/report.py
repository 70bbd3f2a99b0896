"""`twoclocks report`: one self-contained HTML page (plots, clocks, fits, schedule, options)."""

import json
from pathlib import Path
from typing import Annotated

import typer

from twoclocks_cli.options import DbOption, JsonOption


def report(
    sweep: Annotated[str, typer.Argument(help="The sweep to report on.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for index.html and its PNGs.")],
    metric: Annotated[str | None, typer.Option(
        "--metric", help="Progress metric (default: eval_accuracy when logged, else "
        "reward_mean).")] = None,
    target: Annotated[str, typer.Option(
        "--target", help="Progress target: a value, or frac:X of the way from the initial to "
        "the best value of the sweep.")] = "frac:0.5",
    smoothing: Annotated[str, typer.Option("--smoothing", help="ma, ema or none.")] = "ma",
    window: Annotated[int, typer.Option("--window", help="Moving-average window (points).")] = 5,
    safety: Annotated[float, typer.Option(
        "--safety", help="Schedule: switch at this fraction of the failure clock.")] = 0.8,
    budget: Annotated[float | None, typer.Option(
        "--budget", help="Schedule: total samples (default: the longest run's).")] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Write OUT/index.html: plots, the clock table, the fits, the schedule and the options."""
    from twoclocks_cli.render.report import ReportOptions, write_report
    from twoclocks_cli.store import Store

    analysis = {"target": target, "smoothing": smoothing, "window": window}
    if metric is not None:
        analysis["metric"] = metric
    opts = ReportOptions(sweep=sweep, out=out, safety=safety, budget=budget, analysis=analysis)
    page = write_report(Store.open(db), opts)
    pngs = sorted(p.name for p in page.parent.glob("*.png"))
    if as_json:
        typer.echo(json.dumps({"index": str(page), "images": pngs}, indent=2))
    else:
        typer.echo(f"wrote {page} ({', '.join(pngs) or 'no plots'}); open it in a browser")
