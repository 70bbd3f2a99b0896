"""Synthetic training curves the tests write as CSV and import with the real `twoclocks ingest`,
keeping the exact values they wrote (the truth an export or a summary is checked against)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from typer.testing import CliRunner

from twoclocks_cli.app import app

KEYS = ("accuracy", "entropy", "lr", "reward_mean")  # `lr` is also a cell-parameter column


@dataclass
class Curve:
    """One run's log: its cell parameters and, per step, samples and {key: value}."""

    name: str
    prompts: int
    group: int
    lr: float
    seed: int
    steps: list[tuple[int, int, dict[str, float]]] = field(default_factory=list)
    run_id: int | None = None
    run_name: str | None = None  # what ingest names the run: FOLDER/FILE

    @property
    def batch(self) -> int:
        return self.prompts * self.group


def make_curve(name: str, prompts: int, group: int, lr: float, seed: int, n: int) -> Curve:
    """Rising reward with awkward decimals, accuracy every 3rd step, entropy with one NaN and
    one +inf, a constant logged lr."""
    c = Curve(name, prompts, group, lr, seed)
    for step in range(n):
        x = step * c.batch
        vals = {"reward_mean": 1 - math.exp(-x / (700.0 + 3.1 * c.batch)) + seed / 1e7,
                "entropy": 2.0 / (1 + step) + 1 / 3, "lr": lr}
        if step % 3 == 0:
            vals["accuracy"] = 0.5 * vals["reward_mean"] + prompts / 1e6
        if step == 2:
            vals["entropy"] = math.nan
        if step == 4:
            vals["entropy"] = math.inf
        c.steps.append((step, x, vals))
    return c


def write_csv(curve: Curve, folder: Path) -> Path:
    """The curve as a CSV log (a missing value is an empty cell; floats in full precision)."""
    path = folder / f"{curve.name}.csv"
    lines = ["step,samples," + ",".join(KEYS)]
    for step, samples, vals in curve.steps:
        cells = [repr(vals[k]) if k in vals else "" for k in KEYS]
        lines.append(f"{step},{samples}," + ",".join(cells))
    path.write_text("\n".join(lines) + "\n")
    return path


def ingest(db: str, sweep: str, curves: list[Curve], folder: Path) -> None:
    """Import the curves into `sweep` through the real CLI; sets each curve's run_id."""
    folder.mkdir(parents=True, exist_ok=True)
    for c in curves:
        r = CliRunner().invoke(app, [
            "ingest", str(write_csv(c, folder)), "--format", "csv", "--sweep", sweep,
            "--batch-prompts", str(c.prompts), "--group-size", str(c.group), "--lr", str(c.lr),
            "--seed", str(c.seed), "--db", db, "--json"])
        assert r.exit_code == 0, r.output
        (res,) = json.loads(r.stdout)
        assert res["action"] == "created", res
        c.run_id, c.run_name = res["run_id"], f"{folder.name}/{c.name}.csv"


def same(a: float | None, b: float | None) -> bool:
    """Equal values, NaN equal to NaN (exact: no tolerance)."""
    if a is None or b is None:
        return a is None and b is None
    return (math.isnan(a) and math.isnan(b)) or a == b
