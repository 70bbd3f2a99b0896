"""`twoclocks suggest SWEEP`: the next cells that would most reduce the schedule's uncertainty.

`--out FILE` writes them as a sweep config of the same sweep; `twoclocks sweep FILE` adds them
as new cells (cells already in the store are skipped) and the next `analyze` pools them.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Annotated

import typer

from twoclocks_cli.options import DbOption, JsonOption


def _check_budget(budget: float | None) -> int | None:
    from twoclocks_cli.core.errors import ConfigError
    from twoclocks_cli.core.limits import INT64_MAX

    if budget is None:
        return None
    if not (math.isfinite(budget) and 0 < budget <= INT64_MAX) or budget != int(budget):
        raise ConfigError(f"--budget {budget:g}: must be a whole number of samples from 1 to "
                          f"{INT64_MAX:,}")
    return int(budget)


def _check_out(out: Path | None) -> None:
    """Refuse an --out that cannot be written before any work is done (nothing is created)."""
    from twoclocks_cli.core.errors import ConfigError
    from twoclocks_cli.options import out_path_problem

    if out is not None and (why := out_path_problem(out)):
        raise ConfigError(f"--out {out}: {why}")


def _write(out: Path, text: str) -> None:
    """Write atomically: a temporary file beside `out`, renamed over it (no partial file)."""
    from twoclocks_cli.core.errors import ConfigError

    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"--out {out}: cannot write: {exc.strerror or exc}") from None


def _store_url(db: str | None) -> str | None:
    """The store URL to write into the config (None when it holds a password)."""
    from sqlalchemy.engine import make_url

    from twoclocks_cli.launch.sweeps import absolute_db_url
    from twoclocks_cli.store.engine import resolve_url

    url = absolute_db_url(resolve_url(db))
    try:
        return None if make_url(url).password else url
    except Exception:  # noqa: BLE001 - an odd URL: leave the store out of the file
        return None


def suggest(
    sweep_name: Annotated[str, typer.Argument(metavar="SWEEP", help="The sweep to extend.")],
    budget: Annotated[float | None, typer.Option(
        "--budget", metavar="SAMPLES",
        help="Sample budget of every suggested cell (default: the sweep's; twice that when "
             "every failure is censored).")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", metavar="MORE.toml",
        help="Write the suggested cells as a config of the same sweep (`twoclocks sweep "
             "MORE.toml` adds them).")] = None,
    as_json: JsonOption = False,
    db: DbOption = None,
) -> None:
    """The next cells that would most narrow the schedule decision, with their cost in samples.

    Brackets B_crit when it is a bound or extrapolated, adds seeds where the progress-clock
    interval is widest (or seeds are censored), and a longer budget when no run failed.
    Cost = seeds x budget per cell.
    """
    from twoclocks_cli.render.suggest import render_suggestions
    from twoclocks_cli.store import Store
    from twoclocks_cli.suggest import config_text, suggest_for

    budget_n = _check_budget(budget)
    _check_out(out)
    store = Store.open(db)
    doc, analysis, runs = suggest_for(store, sweep_name, budget_n)
    doc["out"] = None
    if out is not None:
        if doc["suggestions"]:
            text, cells = config_text(store, sweep_name, doc, analysis, runs, _store_url(db))
            _write(out, text)
            doc["out"] = str(out)
            doc["out_cells"] = len(cells)
        else:
            doc["notes"].append(f"nothing to suggest: {out} not written")
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    render_suggestions(doc, analysis.critical.recommended)
