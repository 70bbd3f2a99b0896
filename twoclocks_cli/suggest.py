"""What to run next: the cells that would most reduce the uncertainty of the schedule decision.

Read from an analysis (`clocks.result.Analysis`, what `twoclocks analyze` computes):
- bracket: when the recommended B_crit is a bound or extrapolated, batch sizes on its far side.
  A lower bound ">= B_max" gets 2x and 4x B_max; an upper bound "<= B_min" gets B_min/2 and
  B_min/4 in whole prompts (never below one prompt's group); an estimate extrapolated beyond the
  grid gets the doubling (halving) grid points from the grid's edge to one past the estimate.
- seeds: 2 more seeds at the batch whose progress-clock interval (high - low) / median is
  widest; a batch with some (not all) seeds censored counts as widest.
- settle: when the decision is not settled over seed resamples (`clocks.stability`), the cells
  it names: 2 more seeds at a batch whose outcome flips, or a batch between two grid batches
  (as many seeds as the grid's batches have) where B_crit's point wanders.
- budget: when every failure clock (or every progress clock) is censored, 2 new seeds at a
  longer budget (2x the sweep's, or --budget) at B_small, the batch a schedule would start with
  (the largest grid batch not above B_crit), and at the largest grid batch (the switch target).
One call runs every suggested cell at one budget: the sweep's, or the longer one when every
failure is censored (a new cell should then also look for the failure clock). Cost = seeds x
budget per cell, in samples.

`suggested_config` turns the suggestions into a sweep config of the SAME sweep: its name, its
stored settings, the grid holding only the suggested cells. `twoclocks sweep FILE` then
registers them as new cells (cells are identified by the hash of their resolved config; cells
already present are skipped) and the next `analyze` pools them with the old ones.
"""

from __future__ import annotations

import math
from collections import Counter

from twoclocks_cli.clocks.critical import Estimate
from twoclocks_cli.clocks.result import Analysis, BatchRow, Recommended
from twoclocks_cli.core.errors import AnalysisError, ConfigError

EXTRA_SEEDS = 2  # seeds added by a `seeds` or `budget` suggestion
MAX_FAR = 4  # at most this many grid points beyond the grid's edge for an extrapolated estimate
MAX_SEED_BATCHES = 3  # at most this many `seeds` suggestions (partly censored batches first)
LONGER = 2  # the longer budget's factor over the sweep's


def estimate_text(rec: Estimate | None) -> str:
    """'>= 16', '<= 4', '41.1 [27.7, 50.8]' (samples), 'none' (no estimate)."""
    if rec is None or rec.b_crit is None:
        return "none"
    b = rec.b_crit
    if rec.bound == "lower":
        return f">= {b:.4g}"
    if rec.bound == "upper":
        return f"<= {b:.4g}"
    if rec.low is not None and rec.high is not None:
        return f"{b:.4g} [{rec.low:.4g}, {rec.high:.4g}]"
    return f"{b:.4g}"


def family_group_size(a: Analysis) -> int:
    """The group size G of the analysed runs (the most common one)."""
    sizes = Counter(int(r.group_size) for r in a.runs if r.in_family and r.group_size)
    if not sizes:  # from the per-batch table: samples / prompts
        sizes = Counter(int(round(b.batch_samples / b.batch_prompts[0]))
                        for b in a.batches if b.batch_prompts)
    return sizes.most_common(1)[0][0] if sizes else 1


class _Seeds:
    """New seeds per batch: the smallest ones no run of the sweep (nor this call) used there."""

    def __init__(self, used: dict[float, set[int]] | None):
        self.used = {float(b): set(s) for b, s in (used or {}).items()}

    def take(self, batch: float, k: int) -> list[int]:
        have = self.used.setdefault(float(batch), set())
        out, s = [], 0
        while len(out) < k:
            if s not in have:
                out.append(s)
            s += 1
        have |= set(out)
        return out

    def mark(self, batch: float, seeds: list[int]) -> None:
        self.used.setdefault(float(batch), set()).update(seeds)


def _item(kind: str, prompts: int, g: int, seeds: list[int], budget: int, why: str) -> dict:
    return {"kind": kind, "batch_samples": prompts * g, "batch_prompts": prompts,
            "group_size": g, "seeds": list(seeds), "budget": budget, "cells": len(seeds),
            "cost_samples": len(seeds) * budget, "why": why}


def plan_suggestions(a: Analysis, *, sweep_budget: int, budget: int | None = None,
                     group_size: int | None = None,
                     used_seeds: dict[float, set[int]] | None = None) -> dict:
    """The suggestions for an analysis (a JSON-ready dict; see the module doc).

    `sweep_budget`: the sample budget of the sweep's cells (the largest); `budget`: the budget
    of every suggested cell (default: `sweep_budget`, LONGER x that when every failure is
    censored); `used_seeds`: seeds every run of the sweep has at each batch (new seeds avoid
    them).
    """
    rec = a.critical.recommended
    if rec is None:
        raise AnalysisError(f"sweep {a.sweep!r}: the analysis has no recommended "
                            "B_crit estimate (re-run `twoclocks analyze`)")
    batches = sorted((b for b in a.batches if b.n_runs), key=lambda b: b.batch_samples)
    if not batches:
        raise AnalysisError(f"sweep {a.sweep!r}: no analysed batch sizes: nothing "
                            "to suggest from")
    if sweep_budget <= 0:
        raise AnalysisError(f"sweep {a.sweep!r}: no sample budget known (no run "
                            "logged any samples): nothing to suggest from")
    g = group_size or family_group_size(a)
    seeds = _Seeds(used_seeds)
    for r in a.runs:
        if r.batch_samples is not None and r.seed is not None:
            seeds.mark(r.batch_samples, [int(r.seed)])
    notes: list[str] = []

    all_fail = all(b.failure.n_censored >= b.failure.n for b in batches)
    all_prog = all(b.progress.n_censored >= b.progress.n for b in batches)
    longer = all_fail or all_prog
    if budget is None:
        budget = LONGER * sweep_budget if longer else sweep_budget
    budget = int(budget)
    if longer and budget > sweep_budget:
        notes.append(f"every suggested cell runs {budget} samples ({budget / sweep_budget:.3g}x "
                     f"the sweep's {sweep_budget}): "
                     + ("no run has failed yet, so new cells also look for the failure clock"
                        if all_fail else "no batch reached the target yet"))

    out = _bracket(rec, batches, g, budget, seeds, a, notes)
    out += _more_seeds(batches, g, budget, seeds, notes)
    out += _settle(a, batches, g, budget, seeds, out, notes)
    if longer:
        out += _longer(rec, batches, g, budget, sweep_budget, seeds, all_fail, notes)
    return {
        "sweep": a.sweep,
        "analysis_id": a.analysis_id,
        "metric": a.metric,
        "target": a.target.value,
        "recommended": rec.to_json(),
        "group_size": g,
        "sweep_budget": sweep_budget,
        "budget": budget,
        "suggestions": out,
        "cells": sum(s["cells"] for s in out),
        "cost_samples": sum(s["cost_samples"] for s in out),
        "notes": notes,
    }


def _prompts(batch: BatchRow, g: int) -> int:
    ps = batch.batch_prompts
    return int(ps[0]) if ps else max(1, int(round(batch.batch_samples / g)))


def _edge_seeds(a: Analysis, batch: BatchRow) -> list[int]:
    """The seeds of the family's runs at `batch` (the new batches get the same ones)."""
    have = sorted({int(r.seed) for r in a.runs_at(batch.batch_samples) if r.seed is not None})
    return have or list(range(max(int(batch.n_runs or 1), 1)))


def _bracket(rec: Recommended, batches: list[BatchRow], g, budget, seeds, a: Analysis,
             notes) -> list[dict]:
    b, bound, where = rec.b_crit, rec.bound, rec.placement
    src = rec.source or "recommended"
    grid = [x.batch_samples for x in batches]
    lo, hi = batches[0], batches[-1]
    if b is None:
        notes.append("no B_crit estimate to bracket: " + (rec.why or "none recommended"))
        return []
    cands: list[tuple[int, str]] = []  # (prompts, why)
    text = estimate_text(rec)
    if bound == "lower":
        base = next((x for x in batches if x.batch_samples == b), hi)
        p = _prompts(base, g)
        for k in (2, 4):
            cands.append((k * p, f"B_crit {text} samples ({src}: a lower bound, the grid stops "
                                 f"below it): {k}x B={base.batch_samples:g} brackets it"))
    elif bound == "upper":
        base = next((x for x in batches if x.batch_samples == b), lo)
        p = _prompts(base, g)
        for k in (2, 4):
            q = p // k
            exact = "" if q * k == p else ", rounded down to whole prompts"
            if q >= 1:
                cands.append((q, f"B_crit {text} samples ({src}: an upper bound, the grid starts "
                                 f"above it): B={base.batch_samples:g}/{k}{exact}"))
        if not cands:
            notes.append(f"B_crit {text}: B_min = {base.batch_samples:g} samples is already "
                         f"one prompt's group (G={g}): a smaller batch needs a smaller "
                         "group_size (another sweep); no bracketing batch suggested")
    elif where == "extrapolated" and b > grid[-1]:
        p = _prompts(hi, g)
        for k in range(1, MAX_FAR + 1):
            q = p * 2**k
            cands.append((q, f"B_crit {text} samples ({src}) is extrapolated above the grid "
                             f"(largest B={grid[-1]:g}): grid point {2**k}x B_max"))
            if q * g >= b and k >= 2:
                break
    elif where == "extrapolated" and b < grid[0]:
        p = _prompts(lo, g)
        for k in range(1, MAX_FAR + 1):
            q = p // 2**k
            if q < 1:
                notes.append(f"B_crit {text} lies below one prompt's group (G={g} samples): "
                             "the smallest batch with whole prompts is suggested")
                break
            cands.append((q, f"B_crit {text} samples ({src}) is extrapolated below the grid "
                             f"(smallest B={grid[0]:g}): grid point B_min/{2**k}"))
            if q * g <= b and k >= 2:
                break
    out = []
    have = set(grid)
    for q, why in dict(cands).items():
        samples = q * g
        if samples in have:
            continue
        if samples > budget:
            notes.append(f"B={samples} samples would be larger than the budget ({budget}): "
                         "not suggested (raise --budget)")
            continue
        base = hi if samples > grid[-1] else lo
        s = _edge_seeds(a, base)
        seeds.mark(samples, s)
        out.append(_item("bracket", q, g, s, budget, why))
        have.add(samples)
    return out


def _more_seeds(batches, g, budget, seeds, notes) -> list[dict]:
    ranked = []  # (width, batch, why)
    hopeless = []
    for bt in batches:
        pr = bt.progress
        n, nc = int(pr.n or 0), int(pr.n_censored or 0)
        if n == 0:
            continue
        if nc >= n:
            hopeless.append(bt.batch_samples)
        elif nc > 0:
            ranked.append((math.inf, nc / n, bt,
                           f"{nc} of {n} seeds censored at B={bt.batch_samples:g}: the "
                           "progress median is uncertain"))
        elif pr.median and pr.low is not None and pr.high is not None:
            w = (pr.high - pr.low) / pr.median
            ranked.append((w, 0.0, bt,
                           f"widest progress-clock interval: (high - low) / median = {w:.3g} at "
                           f"B={bt.batch_samples:g} ({n} seeds, "
                           f"[{pr.low:.4g}, {pr.high:.4g}] around {pr.median:.4g})"))
    if hopeless:
        notes.append(f"every seed censored at B={', '.join(f'{b:g}' for b in hopeless)}: more "
                     "seeds there would not reach the target either")
    ranked.sort(key=lambda t: (t[0], t[1]), reverse=True)
    partial = [t for t in ranked if math.isinf(t[0])]
    chosen = partial[:MAX_SEED_BATCHES] if partial else [t for t in ranked[:1] if t[0] > 0]
    out = []
    for _, _, bt, why in chosen:
        if bt.batch_samples > budget:
            continue
        s = seeds.take(bt.batch_samples, EXTRA_SEEDS)
        out.append(_item("seeds", _prompts(bt, g), g, s, budget, why))
    return out


def _settle(a: Analysis, batches, g, budget, seeds, already: list[dict], notes) -> list[dict]:
    """The cells an unsettled decision names (`clocks.stability`): more seeds at a grid batch
    whose outcome flips between seed resamples, or a new batch between two grid batches where
    B_crit's point wanders; batches already suggested above are not repeated."""
    st = a.stability
    if not st or st.get("settled"):
        return []
    notes.append(f"decision {st['verdict']}")
    taken = {s["batch_samples"] for s in already}
    per_batch = max((b.n_runs for b in batches), default=EXTRA_SEEDS)
    out = []
    for need in st.get("needs") or []:
        if need["what"] == "more seeds":
            bt = next((b for b in batches if b.batch_samples == need["batch"]), None)
            if bt is None or bt.batch_samples > budget:
                continue
            prompts, k = _prompts(bt, g), EXTRA_SEEDS
        else:
            prompts, k = max(1, int(round(need["batch"] / g))), per_batch
        if prompts * g in taken:
            continue
        taken.add(prompts * g)
        out.append(_item("settle", prompts, g, seeds.take(prompts * g, k), budget,
                         f"to settle the decision: {need['why']}"))
    return out


def _longer(rec, batches, g, budget, sweep_budget, seeds, all_fail, notes) -> list[dict]:
    if budget <= sweep_budget:
        notes.append(f"every {'failure' if all_fail else 'progress'} clock is censored, but the "
                     f"budget {budget} is not longer than the sweep's {sweep_budget}: no "
                     "longer-budget cells suggested")
        return []
    grid = [b.batch_samples for b in batches]
    b = rec.b_crit
    below = [x for x in grid if b is not None and x <= b]
    b_small = max(below) if below else grid[0]
    what = ("no run failed within the sweep's budget" if all_fail
            else "no batch reached the target within the sweep's budget")
    targets = [(b_small, f"{what} ({sweep_budget} samples): N_switch needs the failure clock of "
                         f"B_small = {b_small:g}, the largest batch not above B_crit "
                         f"{estimate_text(rec)}")]
    if grid[-1] != b_small:
        targets.append((grid[-1], f"{what} ({sweep_budget} samples): the largest batch "
                                  f"B={grid[-1]:g}, the candidate to switch to (latest failure)"))
    by = {x.batch_samples: x for x in batches}
    out = []
    for x, why in targets:
        if x > budget:
            continue
        s = seeds.take(x, EXTRA_SEEDS)
        out.append(_item("budget", _prompts(by[x], g), g, s, budget,
                         f"{why}; {EXTRA_SEEDS} new seeds at {budget} samples"))
    return out


# -- the sweep config of the suggested cells ---------------------------------------------


_ADAM_SIM = ("beta1", "beta2", "adam_eps")
_ADAM_TRAINER = ("adam_beta1", "adam_beta2", "adam_epsilon")


def suggested_config(name: str, stored: dict | None, ref, suggestions: list[dict],
                     budget: int, store_url: str | None = None) -> tuple[dict, list]:
    """The sweep config (a dict for `core.toml.dumps`) whose grid holds only `suggestions`, and
    its planned cells. `ref` is a run of the analysed setting: the fixed sim/trainer options
    are taken from its cell, and the config must plan that very cell back (else ConfigError:
    the file would start another setting, not extend this one)."""
    from twoclocks_cli.config import parse_config, plan
    from twoclocks_cli.config.plan import COMMON_KEYS, cell_hash

    if not stored or not isinstance(stored, dict) or "grid" not in stored:
        raise ConfigError(f"--out: sweep {name!r} has no stored sweep config (it was not made "
                          "by `twoclocks sweep`): no config to extend; run without --out")
    cfg = parse_config(stored, f"--out: sweep {name!r}'s stored config")
    if ref is None or not ref.config:
        raise ConfigError(f"--out: sweep {name!r} has no analysed run with a stored cell config")
    adam = cfg.scaling.adam_adjust
    cell = dict(ref.config)
    data = cfg.model_dump(mode="json")
    data["name"] = name
    data["sample_budget"] = int(budget)
    if cfg.backend == "sim":
        data["sim"] = {k: v for k, v in (cell.get("sim") or {}).items()
                       if not (adam and k in _ADAM_SIM)}
        data["trainer"] = {}
    else:
        owned = set(COMMON_KEYS) | {"rollout_batch_size", "phases"} | (
            set(_ADAM_TRAINER) if adam else set())
        data["trainer"] = {k: v for k, v in cell.items() if k not in owned}
        data["sim"] = {}
    g = int(cell.get("group_size") or ref.group_size)
    grid = {"batch": [], "batch_unit": "prompts", "group_size": g,
            "clip_low": float(cell.get("clip_eps_low", ref.clip_low)), "seeds": [],
            "zip": ["batch", "seeds"]}
    high = cell.get("clip_eps_high", ref.clip_high)
    if high is not None and float(high) != grid["clip_low"]:
        grid["clip_high"] = float(high)
    if store_url:
        data["store"] = store_url
    for table in ("sim", "trainer"):
        if not data[table]:
            del data[table]  # an empty table is the default

    # the config must plan the reference run's own cell back
    check = {**data, "sample_budget": int(cell.get("sample_budget", budget)),
             "grid": {**grid, "batch": [int(cell["prompts_per_batch"])],
                      "seeds": [int(cell.get("seed", ref.seed or 0))]}}
    planned = plan(parse_config(check, "--out"), "--out").cells[0].config
    if cell_hash(planned) != cell_hash(cell):
        keys = sorted(k for k in set(planned) | set(cell) if planned.get(k) != cell.get(k))
        raise ConfigError(f"--out: sweep {name!r}'s stored config does not reproduce run "
                          f"{ref.id}'s cell (differs in {', '.join(keys)}): the file would start "
                          "another setting, not extend this one; not written")

    for s in suggestions:
        if s["group_size"] != g:
            raise ConfigError(f"--out: a suggestion has group_size {s['group_size']}, the sweep's "
                              f"cells {g}")
        grid["batch"] += [s["batch_prompts"]] * len(s["seeds"])
        grid["seeds"] += list(s["seeds"])
    data["grid"] = grid
    cfg2 = parse_config(data, "--out")
    return data, plan(cfg2, "--out").cells


# -- for one sweep of the store ------------------------------------------------------------


def suggest_for(store, name: str, budget: int | None) -> tuple[dict, object, list]:
    """(the suggestion document, the analysis used, the sweep's runs)."""
    from twoclocks_cli.clocks.saved import analysis_for

    sweep = store.get_sweep(name)  # NotFoundError names the known sweeps
    a, how = analysis_for(store, name)
    if a.stability is None:
        from twoclocks_cli.clocks.stability import RESAMPLES, measure

        a.stability = measure(a, RESAMPLES, a.options.seed).to_json()
    runs = store.list_runs(name)
    family = {r.run_id for r in a.runs if r.in_family}
    budgets = [int(r.config["sample_budget"]) for r in runs
               if r.id in family and isinstance(r.config, dict)
               and isinstance(r.config.get("sample_budget"), int | float)]
    sweep_budget = max(budgets, default=0) or int((sweep.config or {}).get("sample_budget") or 0)
    if not sweep_budget:
        sweep_budget = int(a.longest_run)
    used: dict[float, set[int]] = {}
    for r in runs:
        if r.batch_samples is not None and r.seed is not None:
            used.setdefault(float(r.batch_samples), set()).add(int(r.seed))
    doc = plan_suggestions(a, sweep_budget=sweep_budget, budget=budget, used_seeds=used)
    doc["analysis_source"] = how
    return doc, a, runs


def reference_run(analysis, runs: list):
    """An analysed run of the analysed setting (completed first, then the largest batch);
    `analysis` is a clocks.result.Analysis."""
    family = [r.run_id for r in analysis.runs if r.in_family]
    by_id = {r.id: r for r in runs}
    cands = [by_id[i] for i in family if i in by_id and by_id[i].config]
    cands.sort(key=lambda r: (r.status != "completed", -(r.batch_samples or 0), r.id))
    return cands[0] if cands else None


def config_text(store, name, doc, analysis, runs, url: str | None) -> tuple[str, list]:
    """The TOML text of the suggested cells as a config of sweep `name` (checked to read back as
    the same config), and its planned cells; `url` is the store it names (None: left out)."""
    import tomllib

    from twoclocks_cli.config import parse_config
    from twoclocks_cli.core.toml import dumps

    sweep = store.get_sweep(name)
    data, cells = suggested_config(name, sweep.config, reference_run(analysis, runs),
                                   doc["suggestions"], doc["budget"], url)
    have = {r.cell_id for r in runs}
    old = [c for c in cells if c.cell_id in have]
    if old:
        doc["notes"].append(f"{len(old)} of the {len(cells)} cells are already in the store "
                            "(registered, not yet run?): `twoclocks sweep` skips them")
    header = [
        f"twoclocks suggest for sweep {name!r} (analysis {doc.get('analysis_id')}): "
        f"{len(cells)} cells, {doc['cost_samples']} samples at most",
        f"B_crit {estimate_text(analysis.critical.recommended)} samples "
        f"({analysis.critical.recommended.source or 'no estimate'})",
        "add them to the same sweep with: twoclocks sweep THIS_FILE"
        + ("" if url else " --db URL (the store URL holds a password: not written here)"),
    ] + [f"{s['kind']} B={s['batch_samples']} seeds {s['seeds']}: {s['why']}"
         for s in doc["suggestions"]]
    text = dumps(data, header=header)
    back = parse_config(tomllib.loads(text), "--out")
    if back != parse_config(data, "--out"):  # the writer must round-trip exactly
        raise ConfigError("--out: the written TOML does not read back as the same config; "
                          "not written")
    return text, cells
