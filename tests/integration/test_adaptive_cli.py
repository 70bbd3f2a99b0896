"""The adaptive sim example through the CLI: a sweep config with [sim.adaptive] plans and runs,
`compare` sets the adaptive run beside the constants and the static schedule `schedule`
recommends (the same phases), and a bad [sim.adaptive] key is one line at plan time."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support.cli import assert_one_line_error, twoclocks

pytestmark = pytest.mark.subprocess

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _config(tmp_path, name: str, budget: int = 8192) -> Path:
    text = (EXAMPLES / name).read_text()
    text = text.replace('executor = "local"', 'executor = "debug"')
    text = re.sub(r"sample_budget = \d+", f"sample_budget = {budget}", text)
    text = text.replace('workdir = "twoclocks-runs"', f'workdir = "{tmp_path / "runs"}"')
    out = tmp_path / name
    out.write_text(text)
    return out


def test_adaptive_sim_example_runs_and_compares(tmp_path):
    env = {"TWOCLOCKS_DB": f"sqlite:///{tmp_path / 's.db'}"}
    demo, adaptive = _config(tmp_path, "sim-sweep.toml"), _config(tmp_path, "sim-adaptive.toml")
    for args in (("sweep", str(demo), "--wait"), ("analyze", "sim-demo", "--save"),
                 ("sweep", str(adaptive), "--wait")):
        proc = twoclocks(*args, env=env, cwd=tmp_path)
        assert proc.returncode == 0, (args, proc.stdout[-2000:], proc.stderr[-2000:])
    runs = json.loads(twoclocks("runs", "list", "--sweep", "sim-adaptive-demo", "--json",
                                env=env).stdout)
    rid = runs[0]["id"]
    cmp = json.loads(twoclocks("compare", "sim-demo", "--run", str(rid), "--json",
                               env=env).stdout)
    assert cmp["kind"] == "adaptive"
    plan = json.loads(twoclocks("schedule", "sim-demo", "--json", env=env).stdout)
    assert cmp["static_schedule"]["phases"] == plan["phases"]
    assert cmp["static_schedule"]["predicted"] == plan["predicted"]
    held = json.loads(twoclocks("compare", "sim-demo", "--run", str(rid), "--json",
                                "--large-lr", "hold", env=env).stdout)["static_schedule"]
    hold = json.loads(twoclocks("schedule", "sim-demo", "--json", "--large-lr", "hold",
                                env=env).stdout)
    assert held["phases"] == hold["phases"] and held["predicted"] == hold["predicted"]
    assert_one_line_error(twoclocks("compare", "sim-demo", "--run", str(rid), "--large-lr",
                                    "keep", env=env), "--large-lr 'keep'", "sweep, hold")
    # the run's own clocks, as analyze reads them from its sweep
    own = json.loads(twoclocks("analyze", "sim-adaptive-demo", "--json",
                               f"--target={cmp['target']['value']}", env=env).stdout)
    mine = next(r for r in own["runs"] if r["run_id"] == rid)
    assert mine["progress"]["samples"] == cmp["schedule"]["progress"]["samples"]
    # its phases are the decisions: batch_min first, each a whole number of 2048-sample spans
    phases = cmp["schedule"]["phases"]
    assert phases[0]["prompts_per_batch"] == 2 and phases[0]["from_samples"] == 0
    assert all(p["prompts_per_batch"] <= 32 for p in phases)
    text = twoclocks("compare", "sim-demo", "--run", str(rid), env={**env, "COLUMNS": "200"})
    assert f"adaptive #{rid}" in text.stdout and "static schedule (predicted)" in text.stdout
    events = json.loads(twoclocks("runs", "show", str(rid), "--json", env=env).stdout)["events"]
    notes = [e["message"] for e in events if (e["message"] or "").startswith("adaptive")]
    assert notes[0].startswith("adaptive calibration from sweep 'sim-demo': kappa")
    decided = [int(re.match(r"adaptive decision (\d+) at", n).group(1)) for n in notes[1:]]
    assert decided == list(range(1, len(decided) + 1)) and len(decided) >= 8192 // 2048 - 1


def test_a_bad_adaptive_key_is_one_line_at_plan_time(tmp_path):
    cfg = _config(tmp_path, "sim-adaptive.toml")
    cfg.write_text(cfg.read_text().replace("max_change = 2.0", "max_chnge = 2.0"))
    proc = twoclocks("plan", str(cfg), env={"TWOCLOCKS_DB": f"sqlite:///{tmp_path / 's.db'}"})
    assert_one_line_error(proc, "sim.adaptive.max_chnge")


def test_the_branch_rule_runs_from_a_sweep_config_and_the_report_draws_it(tmp_path):
    """The example with `rule = "branch"`: planned, run and reported through the CLI; every
    decision event is a decision of the report's trajectory, and every branch decision says
    what it measured."""
    env = {"TWOCLOCKS_DB": f"sqlite:///{tmp_path / 's.db'}"}
    demo, adaptive = _config(tmp_path, "sim-sweep.toml"), _config(tmp_path, "sim-adaptive.toml")
    adaptive.write_text(adaptive.read_text().replace('rule = "noise"', 'rule = "branch"'))
    for args in (("sweep", str(demo), "--wait"), ("analyze", "sim-demo", "--save"),
                 ("sweep", str(adaptive), "--wait")):
        proc = twoclocks(*args, env=env, cwd=tmp_path)
        assert proc.returncode == 0, (args, proc.stdout[-2000:], proc.stderr[-2000:])
    rid = json.loads(twoclocks("runs", "list", "--sweep", "sim-adaptive-demo", "--json",
                               env=env).stdout)[0]["id"]
    out = tmp_path / "report"
    proc = twoclocks("report", "sim-demo", "--out", str(out), "--run", str(rid), env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / f"run-{rid}.png").exists()
    traj = json.loads((out / "analysis.json").read_text())["runs_compared"][0]["trajectory"]
    events = json.loads(twoclocks("runs", "show", str(rid), "--json", env=env).stdout)["events"]
    decided = [e["message"] for e in events
               if (e["message"] or "").startswith("adaptive decision")]
    assert len(decided) == len(traj["decisions"]) >= 2
    assert all("branches 2 and 4 prompts" in d for d in decided[:1]), decided[:1]
