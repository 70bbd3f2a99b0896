"""`analyze` on an ingested sweep finds the clocks the logs were generated with."""

import json

import numpy as np
from typer.testing import CliRunner

from tests.fixtures.ingest import synthetic as syn
from twoclocks_cli.app import app


def ingest_synthetic(tmp_path, db_url, sweep="syn"):
    """Write the synthetic logs and import them (one CLI call per batch size and seed)."""
    for path, p, seed in syn.write_logs(tmp_path):
        lr = 1e-3 * np.sqrt(p / syn.PROMPTS[0])
        r = CliRunner().invoke(app, [
            "ingest", str(path), "-f", "jsonl", "--sweep", sweep, "--batch-prompts", str(p),
            "--group-size", str(syn.GROUP), "--lr", str(lr), "--seed", str(seed), "--db", db_url])
        assert r.exit_code == 0, r.output


def test_analyze_recovers_the_generating_clocks(tmp_path, sqlite_url):
    from twoclocks_cli.clocks.analysis import analyze_sweep
    from twoclocks_cli.store import Store

    ingest_synthetic(tmp_path, sqlite_url)
    store = Store.open(sqlite_url)
    a = analyze_sweep(store, "syn").to_json()
    assert a["metric"] == "reward_mean" and len(a["runs"]) == 6
    tau = a["target"]["value"]
    batches = {b["batch_samples"]: b for b in a["batches"]}
    assert sorted(batches) == [p * syn.GROUP for p in syn.PROMPTS]
    for b, row in batches.items():
        want = syn.expected_progress(b, tau)
        got = row["progress"]["median"]
        assert got is not None and abs(got - want) <= 0.1 * want + b, (b, got, want)
        fail = row["failure"]["median"]  # the drop rule: the same clock at every batch size
        assert fail is not None and syn.N_COLLAPSE < fail < syn.N_COLLAPSE + 6000, (b, fail)
    fit = a["critical_batch"]["mccandlish"]
    assert fit["b_crit"] is not None and 0.6 * syn.B_CRIT < fit["b_crit"] < 1.6 * syn.B_CRIT
    inv = a["failure_invariance"]
    assert inv["slope"] is not None and abs(inv["slope"]) < 0.1
    json.dumps(a)  # strict JSON
