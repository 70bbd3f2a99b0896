"""`analyze --metric NAME` takes the name an imported run's own log used for a metric (verl's
`critic/score/mean`) as the store key it was imported as (`reward_mean`)."""

import json

import numpy as np
from typer.testing import CliRunner

from tests.fixtures.ingest import synthetic as syn
from tests.support.cli import assert_one_line_error, twoclocks_inproc
from twoclocks_cli.app import app


def _ingest_with_verl_names(tmp_path, db_url):
    """The synthetic sweep's logs with verl's name for the reward, imported as JSONL."""
    for path, p, seed in syn.write_logs(tmp_path):
        path.write_text(path.read_text().replace('"reward_mean"', '"critic/score/mean"'))
        r = CliRunner().invoke(app, [
            "ingest", str(path), "-f", "jsonl", "--sweep", "syn", "--batch-prompts", str(p),
            "--group-size", str(syn.GROUP), "--lr", str(1e-3 * np.sqrt(p / syn.PROMPTS[0])),
            "--seed", str(seed), "--db", db_url])
        assert r.exit_code == 0, r.output


def _analyze(db_url, metric):
    proc = twoclocks_inproc("analyze", "syn", "--metric", metric, "--json", "--db", db_url)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_source_name_stands_for_its_store_key(tmp_path, sqlite_url):
    _ingest_with_verl_names(tmp_path, sqlite_url)
    by_store_key = _analyze(sqlite_url, "reward_mean")
    by_source = _analyze(sqlite_url, "critic/score/mean")
    assert by_source["metric"] == by_store_key["metric"] == "reward_mean"
    assert len(by_source["batches"]) == len(syn.PROMPTS)
    for a, b in zip(by_source["batches"], by_store_key["batches"], strict=True):
        assert a["progress"] == b["progress"] and a["failure"] == b["failure"]
    # a name neither stored nor imported is still refused, naming what is there
    assert_one_line_error(twoclocks_inproc("analyze", "syn", "--metric", "critic/score/max",
                                           "--db", sqlite_url), "critic/score/max", "reward_mean")
