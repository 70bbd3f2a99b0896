"""Which theory-model settings have a best constant batch above the smallest one, and how the
in-run controller does there under both rules (the noise scale with the model's known kappa;
branching B vs 2B at 32 samples a branch), with the model's drift threshold.

Why: the controller's CI test needs a setting where the smallest batch is *not* best (a real
B_crit > batch_min); this finds candidates and prints, per setting, the median samples-to-target
and samples-to-failure (3 seeds) of a constant grid of 4..128 samples under sqrt lr scaling, of
the static schedule `twoclocks schedule` makes from it, and of the adaptive controller. The
sweeps are built as tests/integration/test_adaptive_sim.py builds them (same budget, target 0.95,
failure = drift_abs 8), and per adaptive run where its failure guard fired. About 10 s
per setting on one core.

    .venv/bin/python bench/adaptive_settings.py                     # the settings below
    .venv/bin/python bench/adaptive_settings.py '{"sigma": 4}:0.02'  # SIM_JSON:LR0 ...
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tests.integration.simsweep as ss  # noqa: E402
from tests.integration.test_adaptive_sim import (  # noqa: E402
    BUDGET,
    CONTROL,
    OPTS,
    PROMPTS,
    SIM,
    THRESHOLD,
    _adaptive_runs,
    _medians,
)
from twoclocks_cli.clocks import AnalysisOptions, analyze_sweep, make_schedule  # noqa: E402
from twoclocks_cli.core.errors import AnalysisError  # noqa: E402
from twoclocks_cli.store import Store  # noqa: E402
from twoclocks_cli.theory import ModelConfig  # noqa: E402

BRANCH = {"rule": "branch", "branch_samples": 32}
SETTINGS = [({"sigma": 4.0}, 0.02),
            ({"sigma": 6.0, "optimizer": "sgd", "flat_dims": 32, "drift_threshold": 1e9}, 0.05),
            ({"sigma": 4.0, "optimizer": "sgd", "flat_dims": 32, "drift_threshold": 1e9}, 0.05)]


def _fmt(x: float) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:,.0f}"


def measure(extra: dict, lr0: float) -> None:
    """Print the constants', the static schedule's and the controller's median clocks."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = Store.open(f"sqlite:///{root / 's.db'}")
        try:
            _measure(store, root, {**SIM, **extra}, extra, lr0)
        finally:
            store.close()


def _measure(store, root: Path, sim: dict, extra: dict, lr0: float) -> None:
    ss.LR0 = lr0
    ss.make_sweep(store, "const", PROMPTS + [32], 3, BUDGET, sim, root / "c")
    const = analyze_sweep(store, "const", AnalysisOptions(**OPTS))
    print(f"\n## sim {json.dumps(extra)}, lr {lr0:g} at {ss.B0} samples (sqrt)")
    print("| run | samples to 0.95 | samples to failure |\n|---|--:|--:|")
    for b in const.to_json()["batches"]:
        print(f"| constant {b['batch_samples']} | {_fmt(b['progress']['median'])} | "
              f"{_fmt(b['failure']['median'] or float(BUDGET))} |")
    try:
        phases = [dict(p) for p in make_schedule(const, budget=BUDGET)["phases"]]
    except AnalysisError as err:
        print(f"no schedule: {err}")
        return
    ss.make_sweep(store, "static", [phases[0]["prompts_per_batch"]], 3, BUDGET, sim, root / "s",
                  phases=phases)
    prog, fail = _medians(store, "static")
    shown = " -> ".join(str(p["prompts_per_batch"] * ss.G) for p in phases)
    print(f"| static schedule ({shown}) | {_fmt(prog)} | {_fmt(fail)} |")
    best = min(p for p in (b["progress"]["median"] for b in const.to_json()["batches"])
               if p is not None)
    for label, rule in (("noise scale, known kappa", {}),
                        ("branch B vs 2B, known threshold", BRANCH)):
        name = "branch" if rule else "known"
        ids = _adaptive_runs(store, name, sim, root / name, {**CONTROL, **_known(sim), **rule},
                             lr0)
        prog, fail = _medians(store, name)
        print(f"| adaptive ({label}) | {_fmt(prog)} ({prog / best:.2f}x) | {_fmt(fail)} |")
        for rid in ids:
            print(f"adaptive run {rid}: {_guard_line(store, rid)}")


def _first(series, hit) -> str:
    """Samples at the first logged point whose value satisfies `hit` ("never" if none)."""
    at = [s for s, v in zip(series.samples, series.values, strict=True) if hit(v)]
    return f"{int(at[0]):,}" if at else "never"


def _guard_line(store, rid: int) -> str:
    """Where the failure guard fired, where drift_abs crossed the threshold, the batches run."""
    mode = store.load_metric([rid], "adaptive_mode")[rid]
    drift = store.load_metric([rid], "drift_abs")[rid]
    batch = store.load_metric([rid], "batch_samples")[rid]
    return (f"guard fired at {_first(mode, lambda v: v == 1)} samples, drift_abs >= "
            f"{THRESHOLD:g} at {_first(drift, lambda v: v >= THRESHOLD)}, batches "
            f"{sorted({int(b) for b in batch.values})}")


def _known(sim: dict) -> dict:
    """The model's own kappa and drift_rel threshold (as the test's known values, for `sim`)."""
    cfg = ModelConfig.from_dict(sim)
    return {"kappa": cfg.dim / (cfg.dim + cfg.flat_dims),
            "drift_threshold": THRESHOLD / (cfg.theta0 * math.sqrt(cfg.dim))}


def _setting(arg: str) -> tuple[dict, float]:
    """One SIM_JSON:LR0 argument; a bad one ends the script with one line."""
    table, _, lr = arg.rpartition(":")
    try:
        extra, lr0 = json.loads(table), float(lr)
    except ValueError:
        raise SystemExit(f"error: {arg!r}: expected SIM_JSON:LR0, e.g. '{{\"sigma\": 4}}:0.02'"
                         ) from None
    if not isinstance(extra, dict):
        raise SystemExit(f"error: {arg!r}: SIM_JSON must be a JSON object")
    return extra, lr0


def main(argv: list[str]) -> None:
    settings = [_setting(a) for a in argv] if argv else SETTINGS
    for extra, lr0 in settings:
        measure(extra, lr0)


if __name__ == "__main__":
    main(sys.argv[1:])
