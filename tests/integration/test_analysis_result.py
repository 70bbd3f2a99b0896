"""The typed analysis (`clocks.result.Analysis`) reads exactly what `analyze --json` wrote.

A real store filled by `ingest --format csv` of synthetic curves; the document from the real
CLI; every typed value compared with the document's own; the document read and written again is
the same text.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.support.cli import assert_one_line_error, twoclocks

pytestmark = [pytest.mark.one_worker, pytest.mark.subprocess]


def _ingest(tmp_path, url, sweep, batch, values, seed, group=4):
    path = tmp_path / f"{sweep}-{batch}-{seed}.csv"
    lines = ["step,samples,reward_mean"] + [f"{i},{i * batch},{v:.6g}"
                                            for i, v in enumerate(values)]
    path.write_text("\n".join(lines) + "\n")
    lr = 1e-3 * np.sqrt(batch / 8)
    proc = twoclocks("ingest", str(path), "-f", "csv", "--sweep", sweep, "--batch-prompts",
                     str(batch // group), "--group-size", str(group), "--lr", f"{lr:.6g}",
                     "--seed", str(seed), "--db", url)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    """Three batches x 2 seeds: rise with E(B) growing in B, then a fall (a collapse) at B=8
    and B=16; B=32 with one seed that never reaches the target (censored)."""
    tmp = tmp_path_factory.mktemp("result")
    url = f"sqlite:///{tmp / 'store.db'}"
    n = 80
    for b, tau in ((8, 300.0), (16, 420.0), (32, 700.0)):
        for seed in (0, 1):
            x = np.arange(n) * b
            y = 0.8 * (1 - np.exp(-x / (tau * (1 + 0.1 * seed))))
            if b < 32:  # collapse after 60% of the run
                y = np.where(np.arange(n) > 0.6 * n, y - 0.5, y)
            if b == 32 and seed == 1:
                y = 0.2 * y
            _ingest(tmp, url, "typed", b, y, seed)
    proc = twoclocks("analyze", "typed", "--db", url, "--json", "--bootstrap", "200")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_every_typed_value_is_the_documents(doc):
    from twoclocks_cli.clocks.result import Analysis

    a = Analysis.from_json(doc)
    assert a.sweep == "typed" and a.metric == doc["metric"]
    assert a.target.value == doc["target"]["value"] and a.target.spec == doc["target"]["spec"]
    assert [b.batch_samples for b in a.batches] == [b["batch_samples"] for b in doc["batches"]]
    for b, d in zip(a.batches, doc["batches"], strict=True):
        for clock in ("progress", "failure"):
            agg, want = getattr(b, clock), d[clock]
            assert (agg.median, agg.low, agg.high, agg.lower_bound, agg.n, agg.n_censored) == (
                want["median"], want["low"], want["high"], want["lower_bound"], want["n"],
                want["n_censored"])
        assert b.n_failed == d["failure"]["n_failed"]
    for r, d in zip(a.runs, doc["runs"], strict=True):
        assert r.run_id == d["run_id"] and r.batch_samples == d["batch_samples"]
        assert r.progress.samples == d["progress"]["samples"]
        assert r.failure.samples == d["failure"]["samples"]
        assert r.failure.rule == d["failure"]["rule"]
        assert r.progress.censored == d["progress"]["censored"]
    rec = doc["critical_batch"]["recommended"]
    got = a.critical.recommended
    assert (got.b_crit, got.low, got.high, got.bound, got.source, got.why) == (
        rec["b_crit"], rec["low"], rec["high"], rec["bound"], rec["source"], rec["why"])
    assert a.critical.empirical.b_crit == doc["critical_batch"]["empirical"]["b_crit"]
    assert a.invariance.verdict == doc["failure_invariance"]["verdict"]
    # the shape the fixture was built to have: B=32 has one censored seed, the others failed
    assert a.batch(32).progress.n_censored == 1
    assert a.batch(8).n_failed == 2 and a.batch(32).n_failed == 0


def test_the_document_reads_back_byte_for_byte(doc):
    """Read and written again, `analyze --json`'s document is the same text: every key, its
    order, every number's type (an int stays an int) and the shapes that differ from the
    fields (an unanalysed run's row, the failure counts under `failure`, the theory's doc)."""
    from twoclocks_cli.clocks.result import Analysis
    from twoclocks_cli.clocks.schedule import make_schedule

    text = json.dumps(doc, indent=2, allow_nan=False)
    a = Analysis.from_json(doc)
    assert a.dumps() == text
    assert Analysis.from_json(json.loads(a.dumps())).dumps() == text
    assert make_schedule(a) == make_schedule(Analysis.from_json(json.loads(text)))


def test_the_report_writes_one_notation_for_censored_clocks(doc, tmp_path):
    from twoclocks_cli.clocks.result import Analysis
    from twoclocks_cli.render.report import _clock_text, _run_clock

    a = Analysis.from_json(doc)
    b32 = a.batch(32)
    censored_run = next(r for r in a.runs_at(32) if r.progress.censored)
    assert _run_clock(censored_run, "progress").startswith("≥ ")
    text = _clock_text(b32.failure)  # no seed at B=32 failed: a lower bound
    assert b32.failure.median is None and text.startswith("≥ ")
    assert f"{b32.failure.lower_bound:,.0f}" in text


def test_analyze_on_an_unchanged_sweep_stores_no_second_row(tmp_path):
    import sqlite3

    url = f"sqlite:///{tmp_path / 'store.db'}"
    for b, tau in ((8, 300.0), (16, 420.0)):
        for seed in (0, 1):
            x = np.arange(60) * b
            _ingest(tmp_path, url, "same", b, 0.8 * (1 - np.exp(-x / (tau + 10 * seed))), seed)

    def analyze(*extra):
        proc = twoclocks("analyze", "same", "--db", url, "--json", "--save", "--bootstrap", "100",
                         *extra)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["analysis_id"]

    first, again = analyze(), analyze()
    other = analyze("--target", "frac:0.4")
    assert first == again and other != first
    with sqlite3.connect(tmp_path / "store.db") as con:
        assert con.execute("select count(*) from analyses").fetchone() == (2,)


def test_several_sweeps_side_by_side_are_each_sweeps_own_analysis(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    for sweep, scale in (("lr-a", 1.0), ("lr-b", 1.6)):
        for b, tau in ((8, 300.0), (16, 420.0)):
            for seed in (0, 1):
                x = np.arange(60) * b
                y = 0.8 * (1 - np.exp(-x / (scale * tau + 10 * seed)))
                _ingest(tmp_path, url, sweep, b, y, seed)
    args = ("--db", url, "--bootstrap", "100", "--no-store")
    both = twoclocks("analyze", "lr-a", "lr-b", "--json", *args)
    assert both.returncode == 0, both.stderr
    docs = json.loads(both.stdout)["sweeps"]
    for doc, name in zip(docs, ("lr-a", "lr-b"), strict=True):
        alone = json.loads(twoclocks("analyze", name, "--json", *args).stdout)
        assert doc["sweep"] == name
        assert [b["progress"] for b in doc["batches"]] == [b["progress"] for b in alone["batches"]]
        assert doc["critical_batch"]["recommended"] == alone["critical_batch"]["recommended"]
    # the slower sweep's clocks are longer at every batch (the curves were made so)
    a, b = ([x["progress"]["median"] for x in d["batches"]] for d in docs)
    assert all(y > x for x, y in zip(a, b, strict=True))
    table = twoclocks("analyze", "lr-a", "lr-b", *args)
    assert table.returncode == 0 and "sweeps side by side" in table.stdout
    assert "lr-a" in table.stdout and "lr-b" in table.stdout
    bad = twoclocks("analyze", "lr-a", "lr-b", "--plot", str(tmp_path / "p.png"), *args)
    assert_one_line_error(bad, "--csv and --plot take one sweep")
    missing = twoclocks("analyze", "lr-a", "nope", *args)
    assert missing.returncode != 0 and "nope" in missing.stderr
