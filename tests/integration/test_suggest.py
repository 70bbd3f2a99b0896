"""`twoclocks suggest` through the real CLI: a sim sweep whose grid misses B_crit, the suggested
cells swept into the SAME sweep, and the estimate then bracketed near the theory's truth; the
planning rules on hand-built analyses; bad input (one line, nothing written)."""

from __future__ import annotations

import json
import tomllib

import pytest

from tests.support.cli import assert_one_line_error, twoclocks

pytestmark = [pytest.mark.one_worker, pytest.mark.subprocess]

LR0, B0, TARGET = 0.02, 64, 0.9
SIM = {"optimizer": "adam", "flat_dims": 0, "log_every": 4, "eval_samples": 4096,
       "checkpoint_every": 100000}
BUDGET = 4096
CONFIG = f"""\
name = "miss"
backend = "sim"
sample_budget = {BUDGET}
executor = "local"
workdir = "{{workdir}}"
[scaling]
reference_batch = {B0}
reference_lr = {LR0}
[grid]
batch = [2, 4, 8, 16]       # samples: B_crit (about 51) lies above the grid
batch_unit = "samples"
group_size = 2
seeds = [0, 1, 2]
[sim]
{chr(10).join(f"{k} = {json.dumps(v)}" for k, v in SIM.items())}
[local]
max_parallel = 2
"""
ANALYZE = ("--target", str(TARGET), "--no-theory", "--bootstrap", "40", "--json", "--save")


@pytest.fixture(scope="module")
def missed(tmp_path_factory):
    """The sweep swept and analysed once (the analysis is stored: suggest reuses it)."""
    root = tmp_path_factory.mktemp("suggest")
    url = f"sqlite:///{root / 'store.db'}"
    cfg = root / "miss.toml"
    cfg.write_text(CONFIG.format(workdir=root / "runs"))
    proc = twoclocks("sweep", str(cfg), "--db", url, "--wait")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    proc = twoclocks("analyze", "miss", "--db", url, *ANALYZE)
    assert proc.returncode == 0, proc.stderr
    return url, root, json.loads(proc.stdout)


def _suggest(url, *args):
    proc = twoclocks("suggest", "miss", "--db", url, "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_suggested_cells_bracket_b_crit_in_the_same_sweep(missed):
    from twoclocks_cli.theory import ModelConfig, predict_critical_batch

    url, root, first = missed
    rec = first["critical_batch"]["recommended"]
    assert (rec["bound"], rec["b_crit"]) == ("lower", 16), rec
    doc = _suggest(url)
    kinds = [(s["kind"], s["batch_samples"]) for s in doc["suggestions"]]
    assert kinds[:2] == [("bracket", 32), ("bracket", 64)], kinds  # 2x and 4x B_max
    # flat_dims 0: none failed. E(B) is flat here, so which batch is within 10% of the fewest
    # samples flips between seed resamples: cells that would settle that may join
    assert {"bracket", "seeds", "budget"} <= {k for k, _ in kinds} <= {
        "bracket", "seeds", "budget", "settle"}
    assert doc["budget"] == 2 * BUDGET and doc["sweep_budget"] == BUDGET
    for s in doc["suggestions"]:
        assert s["cost_samples"] == len(s["seeds"]) * s["budget"]
        assert s["batch_samples"] == s["batch_prompts"] * 2 and s["why"]
        if s["kind"] == "bracket":
            assert s["seeds"] == [0, 1, 2]
        else:  # seeds no run of the sweep has at that batch
            assert s["seeds"] == [3, 4]
    assert doc["cost_samples"] == sum(s["cost_samples"] for s in doc["suggestions"])
    table = twoclocks("suggest", "miss", "--db", url)
    assert table.returncode == 0 and "bracket" in table.stdout and ">= 16" in table.stdout

    more = root / "more.toml"
    out = _suggest(url, "--out", str(more))
    data = tomllib.loads(more.read_text())
    assert data["name"] == "miss" and data["store"] == url and data["sample_budget"] == 8192
    assert data["sim"] == SIM and data["scaling"]["reference_lr"] == LR0
    assert len(data["grid"]["batch"]) == out["cells"] == out["out_cells"]
    # the file alone names the store (no --db; an empty $TWOCLOCKS_DB is ignored)
    proc = twoclocks("sweep", str(more), "--wait", cwd=root, env={"TWOCLOCKS_DB": ""})
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert f"sweep miss: {out['cells']} cells ({out['cells']} new)" in proc.stdout
    again = twoclocks("sweep", str(more), cwd=root, env={"TWOCLOCKS_DB": ""})
    assert "(0 new), submitted 0" in again.stdout, again.stdout

    proc = twoclocks("analyze", "miss", "--db", url, *ANALYZE)
    assert proc.returncode == 0, proc.stderr
    second = json.loads(proc.stdout)
    assert not any("mixes" in w for w in second["warnings"]), second["warnings"]  # one setting
    runs = {b["batch_samples"]: b["n_runs"] for b in second["batches"]}
    assert runs[32] == runs[64] == 3 and len(second["runs"]) == 12 + out["cells"]
    rec = second["critical_batch"]["recommended"]
    assert rec["bound"] is None and rec["placement"] in ("bracketed", "interpolated"), rec
    truth = predict_critical_batch(ModelConfig.from_dict(SIM), LR0, B0, TARGET, 0.5, None,
                                   seeds=64)["b_crit"]
    print(f"B_crit {rec['b_crit']:.1f} ({rec['placement']}) vs the theory's {truth:.1f}")
    assert abs(rec["b_crit"] / truth - 1) <= 0.25, (rec, truth)
    after = _suggest(url)  # bracketed now: no more bracketing batches
    assert "bracket" not in {s["kind"] for s in after["suggestions"]}


def test_bad_input_is_one_line_and_writes_nothing(missed, tmp_path):
    url, root, _ = missed
    out = tmp_path / "x.toml"
    assert_one_line_error(twoclocks("suggest", "nosuch", "--db", url, "--out", str(out)),
                          "nosuch", "miss")
    for bad in ("0", "-5", "inf", "nan", "1.5"):
        assert_one_line_error(
            twoclocks("suggest", "miss", "--db", url, "--budget", bad, "--out", str(out)),
            "--budget")
    assert_one_line_error(twoclocks("suggest", "miss", "--db", url, "--out", str(tmp_path)),
                          "--out", "directory")
    assert_one_line_error(
        twoclocks("suggest", "miss", "--db", url, "--out", str(tmp_path / "no" / "x.toml")),
        "--out", "does not exist")
    assert not out.exists() and list(tmp_path.iterdir()) == []
    # --budget not longer than the sweep's: no budget cells, said in a note
    doc = _suggest(url, "--budget", str(BUDGET))
    assert "budget" not in {s["kind"] for s in doc["suggestions"]} and doc["budget"] == BUDGET
    assert any("not longer" in n for n in doc["notes"])


def test_out_needs_a_stored_sweep_config(tmp_path):
    """A sweep built without a sweep config (as ingest does) has suggestions but no --out."""
    from tests.integration.simsweep import make_sweep
    from twoclocks_cli.store import Store

    url = f"sqlite:///{tmp_path / 's.db'}"
    store = Store.open(url)
    make_sweep(store, "adhoc", [1, 4], 1, 3000, {**SIM, "log_every": 8}, tmp_path / "w")
    store.close()
    out = tmp_path / "x.toml"
    assert twoclocks("analyze", "adhoc", "--db", url, *ANALYZE).returncode == 0
    assert_one_line_error(twoclocks("suggest", "adhoc", "--db", url, "--out", str(out)),
                          "--out", "no stored sweep config")
    assert not out.exists()
    doc = json.loads(twoclocks("suggest", "adhoc", "--db", url, "--json").stdout)
    assert doc["suggestions"] and doc["out"] is None


# -- the planning rules, on hand-built analyses ---------------------------------------------


def _agg(median, low=None, high=None, n=3, censored=0):
    return {"median": median, "low": low, "high": high, "n": n, "n_censored": censored,
            "lower_bound": None, "note": ""}


def _analysis(grid, g, rec, prog=None, fail_censored=True, seeds=(0, 1, 2)):
    prog = prog or {b: _agg(1000.0 + b, 990.0 + b, 1010.0 + b) for b in grid}
    fail = _agg(None, censored=len(seeds), n=len(seeds)) if fail_censored else _agg(5e4, 4e4, 6e4)
    return {
        "sweep": "hand", "metric": "eval_accuracy", "target": {"value": 0.9},
        "critical_batch": {"recommended": rec},
        "batches": [{"batch_samples": float(b), "batch_prompts": [b // g], "lr": [0.01],
                     "n_runs": len(seeds), "progress": prog[b], "failure": fail} for b in grid],
        "runs": [{"run_id": i, "batch_samples": float(b), "batch_prompts": b // g,
                  "group_size": g, "seed": s, "status": "completed"}
                 for i, (b, s) in enumerate((b, s) for b in grid for s in seeds)],
    }


def _rec(b, bound=None, placement="interpolated", low=None, high=None):
    return {"b_crit": b, "low": low, "high": high, "bound": bound, "source": "empirical",
            "why": "", "placement": placement}


def _plan(analysis, **kw):
    from twoclocks_cli.clocks.result import Analysis
    from twoclocks_cli.suggest import plan_suggestions

    kw.setdefault("sweep_budget", 10_000)
    return plan_suggestions(Analysis.from_json(analysis), **kw)


def _batches(doc, kind):
    return [s["batch_samples"] for s in doc["suggestions"] if s["kind"] == kind]


def test_upper_bound_keeps_whole_prompts():
    doc = _plan(_analysis([12, 24, 48], 4, _rec(12.0, "upper", "bound"), fail_censored=False))
    # B_min = 3 prompts of 4: /2 -> 1 prompt (rounded down), /4 -> 0 prompts: not a batch
    assert _batches(doc, "bracket") == [4]
    assert doc["suggestions"][0]["batch_prompts"] == 1 and "rounded down" in \
        doc["suggestions"][0]["why"]
    assert doc["budget"] == 10_000 and not _batches(doc, "budget")  # failures were seen
    one = _plan(_analysis([8, 16], 8, _rec(8.0, "upper", "bound"), fail_censored=False))
    assert not _batches(one, "bracket")
    assert any("one prompt's group" in n for n in one["notes"])


def test_extrapolated_gets_grid_points_on_the_far_side():
    doc = _plan(_analysis([4, 8, 16], 4, _rec(100.0, None, "extrapolated")))
    assert _batches(doc, "bracket") == [32, 64, 128]  # up to the first point past 100
    low = _plan(_analysis([32, 64], 4, _rec(2.0, None, "extrapolated")), budget=5000)
    assert _batches(low, "bracket") == [16, 8, 4]
    assert all(s["budget"] == 5000 for s in low["suggestions"])
    assert any("below one prompt's group" in n for n in low["notes"])
    assert not _batches(_plan(_analysis([4, 8], 4, _rec(6.0))), "bracket")  # interpolated


def test_censored_seeds_and_longer_budget():
    prog = {4: _agg(900.0, 880.0, 990.0), 8: _agg(1000.0, None, None, censored=1),
            16: _agg(None, n=3, censored=3)}
    doc = _plan(_analysis([4, 8, 16], 4, _rec(8.0, None, "bracketed", 4.0, 16.0), prog=prog),
                used_seeds={8.0: {0, 1, 2, 3}})
    seeds = [s for s in doc["suggestions"] if s["kind"] == "seeds"]
    assert [(s["batch_samples"], s["seeds"]) for s in seeds] == [(8, [4, 5])]  # 3 was used
    assert "1 of 3 seeds censored" in seeds[0]["why"]
    assert any("every seed censored at B=16" in n for n in doc["notes"])
    # every failure censored: 2 new seeds at 2x the budget, at B_small = 8 and at B_max = 16
    longer = [s for s in doc["suggestions"] if s["kind"] == "budget"]
    assert [(s["batch_samples"], s["seeds"], s["budget"]) for s in longer] == \
        [(8, [6, 7], 20_000), (16, [3, 4], 20_000)]
    assert doc["cost_samples"] == 6 * 20_000


def test_toml_writer_escapes_and_round_trips():
    from twoclocks_cli.core.errors import ConfigError
    from twoclocks_cli.core.toml import dumps, value
    from twoclocks_cli.launch.schedule_run import to_toml

    doc = {"name": 'a "q" \\ b\n\tc\x01\x7f', "n": 3, "x": 1e-08, "on": True, "skip": None,
           "list": [1, 2.5, "s"], "inline": [{"a": 1}, 2], "empty": {},
           "t": {"k": "v", "sub": {"deep": [1]}, "odd key": 1},
           "phases": [{"until_samples": 10, "lr": 0.1}, {"lr": 0.2, "t": {"z": 1}}]}
    text = dumps(doc, header=["two\nlines"])
    assert text.startswith("# two\n# lines\n")
    back = tomllib.loads(text)
    assert back == {k: v for k, v in doc.items() if v is not None}
    assert tomllib.loads(to_toml({"lr": 0.1, "s": 'x"y'}))["s"] == 'x"y'  # compare uses it
    for bad in (float("nan"), float("inf"), object()):
        with pytest.raises(ConfigError):
            value(bad)
