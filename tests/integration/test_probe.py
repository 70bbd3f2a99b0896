"""`twoclocks probe` on a sim run against the theory model's local B_crit from the same state.

The run is made and run by the real sim backend; the probe rebuilds its state by replay (checked
against the loss the run itself logged), branches 6 seeds at each of 7 batch sizes (a 64x range)
and estimates the local B_crit; the truth is `predict_critical_batch` from that state (256 seeds
at B = 1, a dense grid) for the same gain target.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.integration.simsweep import make_sweep
from tests.support.cli import assert_one_line_error, twoclocks
from twoclocks_cli.store import Store

pytestmark = [pytest.mark.one_worker, pytest.mark.subprocess]

SIM = {"log_every": 1, "flat_dims": 0}
BATCHES = "2,4,8,16,32,64,128"


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("probe")
    url = f"sqlite:///{tmp / 's.db'}"
    store = Store.open(url)
    (run_id,) = make_sweep(store, "p", [4], 1, 8000, SIM, tmp)
    return url, store, run_id


def _probe(url, run_id, at, *extra):
    proc = twoclocks("probe", str(run_id), "--at", str(at), "--batches", BATCHES,
                     "--branch-samples", "4000", "--seeds", "6", "--db", url, "--json", *extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_replayed_state_is_the_runs_own(sim_run):
    from twoclocks_cli.adaptive.probe.sim import state_at

    url, store, run_id = sim_run
    cfg, _, state = state_at(store.get_run(run_id), 1000)
    loss = float(0.5 * np.sum(cfg.h * state.theta[0] ** 2))
    logged = store.load_metric([run_id], "loss")[run_id]
    at = int(np.flatnonzero(logged.samples == state.samples[0])[0])
    assert logged.values[at] == pytest.approx(loss, rel=1e-12)


def test_local_b_crit_matches_the_theory_at_three_points_of_the_run(sim_run):
    url, _, run_id = sim_run
    got = {}
    for at in (0, 1000, 3000):
        r = _probe(url, run_id, at, "--truth")
        est, truth = r["b_crit"], r["truth"]["b_crit"]
        assert est["bound"] is None and est["b_crit"] == pytest.approx(truth, rel=0.25), (at, est)
        assert est["low"] <= truth <= est["high"], (at, est, truth)
        got[at] = (est["b_crit"], truth)
    # later in the run the local critical batch is larger, and the probe sees it
    assert got[3000][1] > 1.2 * got[1000][1] and got[3000][0] > got[1000][0]


def test_probe_refuses_what_it_cannot_do_in_one_line(sim_run, tmp_path):
    url, store, run_id = sim_run
    cases = [
        (["--at", "99999", "--batches", BATCHES, "--branch-samples", "4000"],
         "beyond the run's sample budget 8000"),
        (["--at", "100", "--batches", "8", "--branch-samples", "4000"],
         "at least two distinct batch sizes"),
        (["--at", "100", "--batches", BATCHES, "--branch-samples", "100"],
         "at least twice the largest batch (256)"),
        (["--at", "100", "--batches", "8,x", "--branch-samples", "4000"],
         "a comma-separated list of numbers"),
    ]
    for args, needle in cases:
        assert_one_line_error(twoclocks("probe", str(run_id), *args, "--db", url), needle)
    csv = tmp_path / "r.csv"
    csv.write_text("step,samples,reward_mean\n1,8,0.1\n2,16,0.2\n")
    proc = twoclocks("ingest", str(csv), "-f", "csv", "--sweep", "imp", "--batch-prompts", "2",
                     "--group-size", "4", "--lr", "0.01", "--db", url, "--json")
    other = json.loads(proc.stdout)[0]["run_id"]
    proc = twoclocks("probe", str(other), "--at", "8", "--batches", "8,16",
                     "--branch-samples", "64", "--db", url)
    assert_one_line_error(proc, "probe branches sim and grpo runs")
