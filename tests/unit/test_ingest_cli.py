"""`twoclocks ingest` end to end on a real store: bad input, --skip-bad, duplicates, re-import."""

import json
import re
import shutil
from pathlib import Path

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from twoclocks_cli.app import app
from twoclocks_cli.store import Store
from twoclocks_cli.store.models import Metric, Run, RunEvent, Sweep

FIX = Path(__file__).parents[1] / "fixtures" / "ingest"


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line_error(result, *needles):
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def snapshot(url):
    """Every row the import could touch, as plain values."""
    store = Store.open(url)
    with store.session() as s:
        runs = [(r.id, r.cell_id, r.name, r.backend, r.batch_prompts, r.group_size,
                 r.batch_samples, r.lr, r.seed, json.dumps(r.config, sort_keys=True), r.status,
                 r.finished_at) for r in s.scalars(select(Run).order_by(Run.id))]
        metrics = [(m.run_id, m.step, m.key, m.samples, m.value) for m in
                   s.scalars(select(Metric).order_by(Metric.run_id, Metric.step, Metric.key))]
        events = len(s.scalars(select(RunEvent)).all())
        sweeps = [(w.id, w.name, w.backend) for w in s.scalars(select(Sweep))]
    store.close()
    return runs, metrics, events, sweeps


def test_import_verl_then_reimport_changes_nothing(db_url, tmp_path):
    files = [FIX / "verl_old.log", FIX / "verl_new.log"]
    r = cli("ingest", *files, "--format", "verl", "--sweep", "v", "--db", db_url, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert [o["action"] for o in out] == ["created", "created"]
    assert [o["batch_samples"] for o in out] == [256, 1024]
    before = snapshot(db_url)
    runs, metrics, events, _ = before
    assert [x[10] for x in runs] == ["completed", "completed"] and events == 2
    store = Store.open(db_url)
    rid = out[1]["run_id"]
    reward = store.load_metric([rid], "reward_mean")[rid]
    assert list(reward.steps) == list(range(1, 31))
    assert list(reward.samples) == [s * 1024 for s in range(1, 31)]
    store.close()
    r2 = cli("ingest", *files, "--format", "verl", "--sweep", "v", "--db", db_url, "--json")
    assert [o["action"] for o in json.loads(r2.stdout)] == ["unchanged", "unchanged"]
    assert snapshot(db_url) == before
    # the same content under another name is the same run
    copy = tmp_path / "copy.log"
    shutil.copy(files[0], copy)
    r3 = cli("ingest", files[0], copy, "--format", "verl", "--sweep", "v", "--db", db_url,
             "--json")
    res = json.loads(r3.stdout)
    assert len(res) == 1 and "imported once" in res[0]["notes"][0]
    assert len(snapshot(db_url)[0]) == 2


@pytest.mark.parametrize("fmt, name, edit, line, needle", [
    ("verl", "v.log", lambda t: t.replace("step:12 - critic/score/mean:",
                                          "step:12 - critic/score/mean:0.3x - "), None,
     "malformed step line"),
    ("jsonl", "t.jsonl", lambda t: t.replace('{"step": 7,', '{"step": 7', 1), 7, "invalid JSON"),
    ("csv", "t.csv", lambda t: t.replace("\n9,", "\n9,1,", 1), 11, "expected 6 fields, got 7"),
    ("trl", "trainer_state.json",
     lambda t: re.sub(r'"reward": [0-9.]+', '"reward": "high"', t, count=1), None,
     "'reward' is 'high', not a number"),
])
def test_malformed_line_reports_its_number_and_writes_nothing(
        sqlite_url, tmp_path, fmt, name, edit, line, needle):
    src = {"verl": FIX / "verl_old.log", "jsonl": FIX / "table.jsonl", "csv": FIX / "table.csv",
           "trl": FIX / "trl_old" / "trainer_state.json"}[fmt]
    text = src.read_text()
    bad = edit(text)
    assert bad != text
    f = tmp_path / name
    f.write_text(bad)
    extra = ["--batch-prompts", "8", "--group-size", "4"] if fmt != "verl" else []
    r = cli("ingest", f, "-f", fmt, "--sweep", "s", "--db", sqlite_url, *extra)
    if line is None:  # find the edited line ourselves
        line = next(i for i, (a, b) in enumerate(
            zip(text.splitlines(), bad.splitlines(), strict=True), 1) if a != b)
    one_line_error(r, f"{f}:{line}:", needle, "nothing was written", "--skip-bad")
    runs, metrics, events, sweeps = snapshot(sqlite_url)
    assert runs == [] and metrics == [] and sweeps == []
    r = cli("ingest", f, "-f", fmt, "--sweep", "s", "--db", sqlite_url, "--skip-bad", *extra)
    assert r.exit_code == 0, r.output
    assert f"skipped line {line}:" in r.stdout
    runs, metrics, _, _ = snapshot(sqlite_url)
    assert len(runs) == 1 and metrics
    assert json.loads(runs[0][9])["ingest"]["skipped_lines"] == [line]


def test_one_bad_file_blocks_the_whole_command(sqlite_url, tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"step": 1, "reward_mean": 0.1}\n{"step": 2, "reward_mean": [1]}\n')
    r = cli("ingest", FIX / "table.jsonl", f, "-f", "jsonl", "--batch-prompts", "2",
            "--group-size", "2", "--db", sqlite_url)
    one_line_error(r, f"{f}:2:", "column 'reward_mean' is [1], not a number")
    assert snapshot(sqlite_url)[0] == []


def test_duplicate_steps_keep_the_last_value(sqlite_url, tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"step": 1, "reward_mean": 0.1}\n{"step": 2, "reward_mean": 0.2}\n'
                 '{"step": 2, "reward_mean": 0.25}\n')
    r = cli("ingest", f, "-f", "jsonl", "--batch-prompts", "2", "--group-size", "3",
            "--db", sqlite_url, "--json")
    res = json.loads(r.stdout)[0]
    assert res["duplicates"] == 1 and res["steps"] == 2 and res["rows"] == 2
    store = Store.open(sqlite_url)
    series = store.load_metric([res["run_id"]], "reward_mean")[res["run_id"]]
    assert list(series.values) == [0.1, 0.25] and list(series.samples) == [6, 12]


def test_missing_batch_size_and_missing_step_are_clear(sqlite_url, tmp_path):
    r = cli("ingest", FIX / "trl_old", "-f", "trl", "--db", sqlite_url)
    one_line_error(r, "samples are not logged", "--batch-prompts and --group-size")
    r = cli("ingest", FIX / "trl_old", "-f", "trl", "--batch-prompts", "4", "--db", sqlite_url)
    one_line_error(r, "pass --group-size")
    f = tmp_path / "trainer_state.json"
    f.write_text(json.dumps({"log_history": [{"reward": 0.1, "step": 1}, {"reward": 0.2}]},
                            indent=1))
    r = cli("ingest", f, "-f", "trl", "--batch-prompts", "4", "--group-size", "2",
            "--db", sqlite_url)
    one_line_error(r, f"{f}:7:", "log_history[1] has no 'step'")
    assert snapshot(sqlite_url)[0] == []


def test_huge_file_is_refused_before_reading(sqlite_url, tmp_path):
    f = tmp_path / "huge.jsonl"
    line = json.dumps({"step": 1, "reward_mean": 0.5}) + "\n"
    with f.open("w") as fh:
        fh.write(line * (3_000_000 // len(line)))
    r = cli("ingest", f, "-f", "jsonl", "--max-bytes", "1000000", "--db", sqlite_url)
    one_line_error(r, str(f), "over the size limit of 1,000,000 bytes", "--max-bytes")
    assert snapshot(sqlite_url)[0] == []


def test_options_override_the_log_with_a_note(sqlite_url):
    r = cli("ingest", FIX / "verl_new.log", "-f", "verl", "--batch-prompts", "64",
            "--seed", "3", "--db", sqlite_url, "--json")
    res = json.loads(r.stdout)[0]
    assert res["batch_samples"] == 64 * 8 and res["seed"] == 3
    assert res["params_from"]["batch_prompts"] == "option"
    assert "overrides 128" in res["notes"][0]


def test_unknown_format_and_foreign_sweep_refused(sqlite_url):
    one_line_error(cli("ingest", FIX / "table.csv", "-f", "aim", "--db", sqlite_url),
                   "--format 'aim'", "trl, verl, csv, jsonl")
    store = Store.open(sqlite_url)
    with store.session() as s:
        s.add(Sweep(name="mine", backend="grpo", config={}))
    r = cli("ingest", FIX / "verl_old.log", "-f", "verl", "--sweep", "mine", "--db", sqlite_url)
    one_line_error(r, "sweep 'mine' holds grpo runs")


def test_reimport_with_other_options_updates_the_same_run(sqlite_url):
    base = ["ingest", FIX / "table.csv", "-f", "csv", "--map", "reward_mean=rew", "--db",
            sqlite_url, "--json"]
    first = json.loads(cli(*base, "--map", "accuracy=acc").stdout)[0]
    store = Store.open(sqlite_url)
    assert "accuracy" in store.metric_keys([first["run_id"]])
    second = json.loads(cli(*base, "--seed", "5").stdout)[0]
    assert second["action"] == "updated" and second["run_id"] == first["run_id"]
    assert "accuracy" not in store.metric_keys([first["run_id"]])  # the old mapping is gone
    assert store.get_run(first["run_id"]).seed == 5
    assert [e.to_status for e in store.events(first["run_id"])] == ["completed", "completed"]


def test_growing_log_with_path_identity_updates_one_run(sqlite_url, tmp_path):
    log = tmp_path / "live.log"
    lines = FIX.joinpath("verl_old.log").read_text().splitlines(keepends=True)
    log.write_text("".join(lines[:20]))
    args = ["ingest", log, "-f", "verl", "--identity", "path", "--db", sqlite_url, "--json"]
    first = json.loads(cli(*args).stdout)[0]
    log.write_text("".join(lines))
    second = json.loads(cli(*args).stdout)[0]
    assert second["run_id"] == first["run_id"] and second["action"] == "updated"
    assert second["steps"] > first["steps"] and len(snapshot(sqlite_url)[0]) == 1


@pytest.mark.parametrize("opt, value, needle", [
    ("--lr", "-1", "--lr -1.0: must be a finite number > 0"),
    ("--group-size", "0", "--group-size 0: must be a whole number from 1 to 2,147,483,647"),
    ("--identity", "inode", "--identity 'inode': allowed are content, path"),
    ("--max-bytes", "0", "--max-bytes 0: must be >= 1"),
])
def test_bad_option_values(sqlite_url, opt, value, needle):
    r = cli("ingest", FIX / "verl_old.log", "-f", "verl", opt, value, "--db", sqlite_url)
    one_line_error(r, needle)
    assert snapshot(sqlite_url)[0] == []
