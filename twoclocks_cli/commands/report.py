"""`twoclocks report`: one self-contained HTML page (plots, clocks, fits, schedule, options)."""

from pathlib import Path
from typing import Annotated

import typer

from twoclocks_cli.options import SAFETY, SAMPLES, DbOption, JsonOption, out_folder
from twoclocks_cli.render.jsonout import print_json


def report(
    sweep: Annotated[str, typer.Argument(help="The sweep to report on.")],
    out: Annotated[Path, typer.Option(
        "--out", "-o", help="Folder for index.html and its PNGs (in an existing folder).",
        callback=out_folder)],
    metric: Annotated[str | None, typer.Option(
        "--metric", help="Progress metric (default: eval_accuracy when logged, else "
        "reward_mean).")] = None,
    target: Annotated[str | None, typer.Option(
        "--target", help="Progress target: a value, or frac:X of the way from the initial to "
        "the best value of the sweep (default frac:0.5).")] = None,
    smoothing: Annotated[str | None, typer.Option(
        "--smoothing", help="ma, ema or none (default ma).")] = None,
    window: Annotated[int | None, typer.Option(
        "--window", help="Moving-average window in points (default 5).")] = None,
    reanalyze: Annotated[bool, typer.Option(
        help="Analyse afresh (defaults plus the options above) instead of reusing the latest "
        "stored analysis. Giving any analysis option implies it.")] = False,
    safety: Annotated[float, typer.Option(
        "--safety", help="Schedule: switch at this fraction of the failure clock.",
        callback=SAFETY)] = 0.8,
    budget: Annotated[float | None, typer.Option(
        "--budget", help="Schedule: total samples (default: the longest run's).",
        callback=SAMPLES)] = None,
    run: Annotated[list[int] | None, typer.Option(
        "--run", help="An adaptive or scheduled run (id) to draw against the sweep's clocks: "
        "its batch over samples, its decisions and the local B_crit each acted on. "
        "Repeatable.")] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Write OUT/index.html: plots, the clock table, the fits, the schedule and the options.

    The numbers are those of the sweep's latest stored analysis (`twoclocks analyze`) while it
    is current; a stale one is redone with its own options, and a new result is stored."""
    from twoclocks_cli.gather.report import ReportOptions, collect
    from twoclocks_cli.render.report import write_report
    from twoclocks_cli.store import Store

    given = {"metric": metric, "target": target, "smoothing": smoothing, "window": window}
    analysis = {k: v for k, v in given.items() if v is not None}
    if not analysis and not reanalyze:
        analysis = None  # reuse the stored analysis while it is current
    opts = ReportOptions(sweep=sweep, out=out, safety=safety, budget=budget, analysis=analysis,
                         runs=tuple(run or ()))
    page = write_report(collect(Store.open(db), opts), out)
    pngs = sorted(p.name for p in page.parent.glob("*.png"))
    if as_json:
        print_json({"index": str(page), "images": pngs})
    else:
        typer.echo(f"wrote {page} ({', '.join(pngs) or 'no plots'}); open it in a browser")
