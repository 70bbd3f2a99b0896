"""`--json` of sweep, cancel and train through the real CLI on real SQLite stores, each value
compared with an independent read of the store (sqlite3); `analyze` stores an analysis only with
--save (an identical one reused), and `schedule` works on a sweep never analysed."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.support.cli import sigint_deliverable, twoclocks

pytestmark = [pytest.mark.tiny_model, pytest.mark.one_worker]

SWEEP = """\
name = "{name}"
backend = "sim"
sample_budget = 4096
executor = "debug"
workdir = "{workdir}"
[scaling]
reference_batch = 64
reference_lr = 0.02
[grid]
batch = {batch}
group_size = 8
seeds = [0]
[sim]
dim = 8
flat_dims = 16
checkpoint_every = 50
"""


def _config(tmp_path: Path, name: str, batch: str = "[2, 4]") -> str:
    path = tmp_path / f"{name}.toml"
    path.write_text(SWEEP.format(name=name, workdir=tmp_path / "runs", batch=batch))
    return str(path)


def _json(proc) -> dict:
    """The command's stdout, which must be one JSON document and nothing else."""
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _invoke(*args: str):
    """The CLI in this process, its result with `returncode` as a subprocess's."""
    from typer.testing import CliRunner

    from twoclocks_cli.app import app

    r = CliRunner().invoke(app, list(args))
    r.returncode = r.exit_code
    return r


def _rows(db: Path, sql: str, *args) -> list[tuple]:
    with sqlite3.connect(db) as con:
        return con.execute(sql, args).fetchall()


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A sim sweep of 2 cells run by the debug executor, its first `sweep --json` document."""
    root = tmp_path_factory.mktemp("jsoncli")
    db = root / "s.db"
    cfg = _config(root, "js")
    proc = twoclocks("sweep", cfg, "--db", f"sqlite:///{db}", "--json")
    assert "sweep js: 2 cells (2 new), submitted 2 via debug" in proc.stderr  # the note
    return root, db, cfg, _json(proc)


def test_sweep_json_says_what_was_registered_submitted_and_skipped(swept):
    root, db, cfg, first = swept
    stored = _rows(db, "SELECT r.id, r.cell_id, r.status, r.batch_samples, r.job_id "
                       "FROM runs r JOIN sweeps s ON s.id = r.sweep_id WHERE s.name = 'js' "
                       "ORDER BY r.id")
    assert first["sweep"] == "js" and first["executor"] == "debug"
    assert first["registered"] == {"new": 2, "existing": 0}
    assert (first["cells"], first["submitted"], first["skipped"]) == (2, 2, 0)
    assert [(c["run_id"], c["cell_id"], c["status"], c["batch_samples"], c["job_id"])
            for c in first["runs"]] == stored
    assert all(c["action"] == "submitted" and c["status"] == "completed" for c in first["runs"])
    steps = dict(_rows(db, "SELECT run_id, max(step) FROM metrics GROUP BY run_id"))
    assert {c["run_id"]: c["last_step"] for c in first["runs"]} == steps
    again = _json(twoclocks("sweep", cfg, "--db", f"sqlite:///{db}", "--json", "--wait"))
    assert again["waited"] is True
    assert again["registered"] == {"new": 0, "existing": 2}
    assert (again["submitted"], again["skipped"]) == (0, 2)
    assert [(c["run_id"], c["action"], c["status"]) for c in again["runs"]] == \
        [(r[0], "skipped", "completed") for r in stored]


def test_cancel_json_lists_each_run_before_and_after(swept, tmp_path):
    from twoclocks_cli.config import load_plan
    from twoclocks_cli.launch import sweeps
    from twoclocks_cli.store import Store

    db = tmp_path / "c.db"
    cfg = _config(tmp_path, "pending", "[2, 4, 8]")
    store = Store.open(f"sqlite:///{db}")
    sweeps.register(store, load_plan(Path(cfg)), cfg)  # 3 planned cells, none submitted
    store.close()
    out = _json(twoclocks("cancel", "pending", "--db", f"sqlite:///{db}", "--json"))
    stored = _rows(db, "SELECT id, cell_id, status FROM runs ORDER BY id")
    assert out["sweep"] == "pending" and out["cancelled"] == 3 and out["problems"] == []
    assert [(r["run_id"], r["cell_id"], r["status"]) for r in out["runs"]] == stored
    assert {r["before"] for r in out["runs"]} == {"planned"}
    assert {r[2] for r in stored} == {"cancelled"}
    twice = _json(twoclocks("cancel", "pending", "--db", f"sqlite:///{db}", "--json"))
    assert twice["cancelled"] == 0 and {r["before"] for r in twice["runs"]} == {"cancelled"}


def test_analyze_stores_only_with_save_and_reuses_an_identical_one(swept):
    root, db, _, _ = swept
    url = f"sqlite:///{db}"

    def analyze(*extra):  # in-process (CliRunner): six runs of the real command, no startups
        return _json(_invoke("analyze", "js", "--db", url, "--json", "--bootstrap", "50",
                             "--no-theory", *extra))

    def n_rows():
        return _rows(db, "SELECT count(*) FROM analyses")[0][0]

    plain = [analyze(), analyze()]
    assert n_rows() == 0 and [a["analysis_id"] for a in plain] == [None, None]
    saved = analyze("--save")
    assert n_rows() == 1 and isinstance(saved["analysis_id"], int)
    assert analyze("--save")["analysis_id"] == saved["analysis_id"] and n_rows() == 1
    other = analyze("--save", "--target", "frac:0.4")
    assert n_rows() == 2 and other["analysis_id"] != saved["analysis_id"]
    back = analyze("--save")  # identical to the first: reused, and now the newest
    assert back["analysis_id"] == saved["analysis_id"] and n_rows() == 2
    plan = _json(_invoke("schedule", "js", "--db", url, "--json"))
    assert (plan["analysis_id"], plan["analysis_source"]) == (saved["analysis_id"], "reused")
    assert plan["analysis_options"]["target"] == "frac:0.5"
    stored = json.loads(_rows(db, "SELECT result FROM analyses WHERE id = ?",
                              saved["analysis_id"])[0][0])
    assert stored == {k: v for k, v in back.items() if k != "analysis_id"}  # what was printed
    table = _invoke("analyze", "js", "--db", url, "--bootstrap", "50", "--no-theory")
    assert table.exit_code == 0 and n_rows() == 2  # the table alone stores nothing either
    bound = back["batches"][0]["failure"]["lower_bound"]  # 4096 samples: every run's budget
    assert bound == 4096 and "censored (>= 4,096)" in table.stdout and "4096" not in table.stdout


def test_schedule_on_a_sweep_never_analysed(swept, tmp_path):
    _, _, cfg, _ = swept
    db = tmp_path / "fresh.db"
    _json(twoclocks("sweep", cfg, "--db", f"sqlite:///{db}", "--json"))
    assert _rows(db, "SELECT count(*) FROM analyses") == [(0,)]
    plan = _json(twoclocks("schedule", "js", "--db", f"sqlite:///{db}", "--json"))
    assert plan["analysis_source"] == "analysed" and plan["phases"]
    assert _rows(db, "SELECT id FROM analyses") == [(plan["analysis_id"],)]  # stored for reuse


TRAIN = """model = "builtin:tiny-arith"
dataset = "builtin:arithmetic"
group_size = 4
prompts_per_batch = 2
sample_budget = 64
lr = 1e-4
max_new_tokens = 8
eval_every_samples = 32
eval_size = 8
checkpoint_every_steps = 4
threads = 1
"""


@pytest.mark.slow
def test_train_json_summary_matches_the_store(tmp_path):
    from trainer.tiny import ensure_tiny_model

    ensure_tiny_model(0)
    cfg = tmp_path / "t.toml"
    cfg.write_text(TRAIN)
    db = tmp_path / "s.db"
    proc = twoclocks("train", str(cfg), "--db", f"sqlite:///{db}", "--workdir",
                     str(tmp_path / "wd"), "--json", env={"TWOCLOCKS_PROGRESS_S": "0"})
    out = _json(proc)  # the progress lines went to stderr
    assert "run 1: 64/64 samples" in proc.stderr
    (rid, name, status), = _rows(db, "SELECT id, name, status FROM runs")
    assert (out["run_id"], out["name"], out["status"]) == (rid, name, status) == \
        (rid, "t", "completed")
    (steps, samples, n), = _rows(db, "SELECT max(step), max(samples), count(*) FROM metrics")
    assert (out["steps"], out["samples"], out["metric_rows"]) == (steps, samples, n) == \
        (8, 64, n)
    last = dict(_rows(db, "SELECT key, value FROM metrics m WHERE step = (SELECT max(step) "
                          "FROM metrics WHERE key = m.key)"))
    assert out["metrics"] == last and "reward_mean" in last
    assert out["checkpoint_step"] == 8 and Path(out["checkpoint"]).name == "step-00000008"
    assert Path(out["checkpoint"]).is_dir()


@pytest.mark.slow
def test_train_json_after_ctrl_c_is_the_cancelled_run_and_its_checkpoint(tmp_path):
    """SIGINT to the real process: exit 130, the resume hint on stderr, and on stdout the
    summary of the cancelled run naming the checkpoint the hint names."""
    import os
    import re
    import signal
    import subprocess
    import sys
    import time

    from trainer import checkpoint
    from trainer.tiny import ensure_tiny_model

    ensure_tiny_model(0)
    cfg = tmp_path / "t.toml"
    cfg.write_text(TRAIN.replace("sample_budget = 64", "sample_budget = 4096"))
    db, wd = tmp_path / "s.db", tmp_path / "wd"
    proc = subprocess.Popen(
        [sys.executable, "-m", "twoclocks_cli", "train", str(cfg), "--db", f"sqlite:///{db}",
         "--workdir", str(wd), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "TWOCLOCKS_PROGRESS_S": "0"},
        preexec_fn=sigint_deliverable)
    deadline = time.monotonic() + 300
    while checkpoint.latest(wd) is None and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    hint = re.search(r"the last checkpoint is step (\d+)", err)
    assert hint, err
    doc = json.loads(out)
    assert doc["status"] == "cancelled" and doc["checkpoint_step"] == int(hint.group(1))
    assert _rows(db, "SELECT status FROM runs") == [("cancelled",)]
    assert doc["steps"] == _rows(db, "SELECT max(step) FROM metrics")[0][0] >= 4


def test_an_identical_analysis_is_reused_and_becomes_the_newest(store):
    """Store API on SQLite and PostgreSQL: A, B, then A again stores no third row, and the
    newest (what schedule/report take) is A again; `count_analyses` counts per sweep."""
    from twoclocks_cli.store import Sweep

    with store.session() as s:
        s.add_all([Sweep(name="a", backend="sim", config={}),
                   Sweep(name="b", backend="sim", config={})])
    doc_a = {"options": {"target": "frac:0.5"}, "runs": [{"run_id": 1, "status": "completed"}],
             "x": 1.25}
    doc_b = {**doc_a, "options": {"target": "frac:0.4"}}
    first = store.save_analysis("a", doc_a)
    other = store.save_analysis("a", doc_b)
    assert store.latest_analysis("a")["analysis_id"] == other != first
    assert store.save_analysis("a", {**doc_a, "analysis_id": 99}) == first  # id is not content
    assert store.latest_analysis("a")["analysis_id"] == first
    assert store.save_analysis("b", doc_a) not in (first, other)  # another sweep's own row
    assert (store.count_analyses("a"), store.count_analyses("b"), store.count_analyses()) == \
        (2, 1, 3)
