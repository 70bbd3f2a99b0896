"""`twoclocks ingest` on logs in the shapes public verl logs and TRL trainer_state.json files have
(quoted and pprint-wrapped validation dicts, Ray `(TaskRunner pid=N)` prefixes, ANSI colours,
no trailing newline, NUL bytes), through the real CLI, each stored value read back with sqlite3
(not through the importer). Expected values are read off the fixtures by hand."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli import assert_one_line_error, twoclocks_inproc
from tests.support.stored import dump, sql
from twoclocks_cli.core.errors import ConfigError

FIX = Path(__file__).parents[1] / "fixtures" / "ingest"


def _db(tmp_path: Path) -> tuple[Path, str]:
    db = tmp_path / "s.db"
    return db, f"sqlite:///{db}"


def _ingest_json(*args: str) -> list[dict]:
    proc = twoclocks_inproc("ingest", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _series(db: Path, run_id: int, key: str) -> list[tuple]:
    return sql(db, "select step, samples, value from metrics where run_id=? and key=? "
                    "order by step", run_id, key)


# -- 1. the format told from the content --------------------------------------------------------


def test_every_format_is_told_from_its_content_whatever_the_file_is_called(tmp_path):
    """Before: `ingest FILE` without --format stopped at "Missing option '--format'"."""
    db, url = _db(tmp_path)
    verl = tmp_path / "run.txt"  # a verl console log under a name that says nothing
    shutil.copy(FIX / "verl_quoted_validation.log", verl)
    out = _ingest_json(str(verl), "--sweep", "v", "--db", url)
    assert (out[0]["format"], out[0]["format_from"]) == ("verl", "detected: verl console lines")
    assert out[0]["batch_samples"] == 64 * 8  # the parser's own reading: the format is right
    jsonl, csv_, state = tmp_path / "metrics.log", tmp_path / "export.txt", tmp_path / "s.json"
    shutil.copy(FIX / "table.jsonl", jsonl)
    shutil.copy(FIX / "table.csv", csv_)
    shutil.copy(FIX / "trl_old" / "trainer_state.json", state)
    shutil.copytree(FIX / "trl_new", tmp_path / "checkpoint-40")
    out = _ingest_json(str(jsonl), str(csv_), str(state), str(tmp_path / "checkpoint-40"),
                       "--sweep", "t", "--batch-prompts", "4", "--group-size", "2", "--db", url)
    assert [(o["format"], o["format_from"].split(":")[0]) for o in out] == [
        ("jsonl", "detected"), ("csv", "detected"), ("trl", "detected"), ("trl", "detected")]
    stored = sql(db, "select r.name, r.backend, json_extract(r.config, '$.ingest.format') "
                      "from runs r order by r.id")
    assert stored == [(f"{tmp_path.name}/run.txt", "verl", "verl"),
                      (f"{tmp_path.name}/metrics.log", "jsonl", "jsonl"),
                      (f"{tmp_path.name}/export.txt", "csv", "csv"),
                      (f"{tmp_path.name}/s.json", "trl", "trl"),
                      ("checkpoint-40/trainer_state.json", "trl", "trl")]
    # the jsonl was read as JSON Lines: its values, at step x 4 x 2 samples
    rid = out[0]["run_id"]
    assert _series(db, rid, "reward_mean")[:2] == [(1, 8, 0.1803), (2, 16, 0.2417)]
    # the text output says it too; re-importing with the format given is the same run
    proc = twoclocks_inproc("ingest", str(verl), "--sweep", "v", "--db", url)
    assert proc.returncode == 0, proc.stderr
    assert "unchanged" in proc.stdout and "format verl (detected from its content)" in proc.stdout
    proc = twoclocks_inproc("ingest", str(verl), "-f", "verl", "--sweep", "v", "--db", url)
    assert "unchanged" in proc.stdout and "format verl\n" in proc.stdout


def test_a_crashed_verl_log_is_still_told_apart_and_said_to_have_no_step(tmp_path):
    _, url = _db(tmp_path)
    proc = twoclocks_inproc("ingest", str(FIX / "verl_crashed.log"), "--db", url)
    assert_one_line_error(proc, "verl_crashed.log: no `step:N - key:value` line")


def test_an_undetectable_file_is_one_line_and_the_store_is_untouched(tmp_path):
    db, url = _db(tmp_path)
    _ingest_json(str(FIX / "verl_new.log"), "--db", url)  # a store with a run in it
    before = dump(db)
    notes = tmp_path / "notes.txt"
    notes.write_text("Loss went down after the lr change.\nTry a larger batch next time.\n")
    empty = tmp_path / "empty.log"
    empty.write_text("")
    folder = tmp_path / "not-a-checkpoint"
    folder.mkdir()
    for bad, needle in ((notes, "the format cannot be told from the content"),
                        (empty, "the format cannot be told from the content"),
                        (folder, "a folder without a trainer_state.json")):
        # first in line or behind a good file: either way nothing is written
        for args in ([str(bad)], [str(FIX / "verl_old.log"), str(bad)]):
            proc = twoclocks_inproc("ingest", *args, "--db", url)
            assert_one_line_error(proc, f"{bad}: {needle}", "verl console log",
                                  "trainer_state.json", "JSON Lines", "CSV",
                                  "--format trl|verl|csv|jsonl")
            assert dump(db) == before


def test_format_still_overrides_what_the_content_says(tmp_path):
    db, url = _db(tmp_path)
    out = _ingest_json(str(FIX / "verl_new.log"), "-f", "verl", "--db", url)
    assert (out[0]["format"], out[0]["format_from"]) == ("verl", "option")
    before = dump(db)
    jsonl = tmp_path / "metrics.log"
    shutil.copy(FIX / "table.jsonl", jsonl)
    # read as CSV because it was told so: the CSV reader's complaint, not a JSONL import
    proc = twoclocks_inproc("ingest", str(jsonl), "--format", "csv", "--batch-prompts", "4",
                            "--group-size", "2", "--db", url)
    assert_one_line_error(proc, f"{jsonl}: no step column")
    assert dump(db) == before


# -- 2. validation dicts printed inside quotes ---------------------------------------------------


def test_quoted_initial_and_wrapped_final_validation_are_stored(tmp_path):
    """Before: both dicts were missed (the line ends in `}"`, or the dict is cut into quoted
    fragments): the first stored eval was step 9, and the last one the 3-decimal 0.538."""
    db, url = _db(tmp_path)
    out = _ingest_json(str(FIX / "verl_quoted_validation.log"), "--db", url)
    assert _series(db, out[0]["run_id"], "eval_accuracy") == [
        (0, 0, 0.0007581501137225171),  # "Initial validation metrics: {...}" in quotes
        (9, 9 * 512, 0.412),
        (18, 18 * 512, 0.5382106141015921),  # ("Final ...: {'...': " '0.538...}') unrounded
    ]
    assert out[0]["duplicates"] == 0


def test_a_wrapped_initial_dict_with_another_process_inside_is_stored(tmp_path):
    db, url = _db(tmp_path)
    out = _ingest_json(str(FIX / "verl_wrapped_validation.log"), "--db", url)
    # val-core/<source>/acc/mean@1 from a dict over five lines, a WorkerDict line among them
    assert _series(db, out[0]["run_id"], "eval_accuracy") == [
        (0, 0, 0.31766489764973466), (5, 5 * 128, 0.41), (10, 10 * 128, 0.5213040181956027)]


def test_the_dict_and_the_step_0_line_are_one_evaluation_stored_once_unrounded(tmp_path):
    log = tmp_path / "v.log"
    log.write_text(
        "+ python3 -m verl.trainer.main_ppo data.train_batch_size=8 actor_rollout_ref.rollout.n=2\n"
        "(TaskRunner pid=4497) [score] 0.0\n"
        "(TaskRunner pid=4497) (\"Initial validation metrics: {'val/test_score/openai/gsm8k': \"\n"
        "(TaskRunner pid=4497)  '0.3146322971948446}')\n"
        "(TaskRunner pid=4497) step:0 - val/test_score/openai/gsm8k:0.315\n"
        "(TaskRunner pid=4497) step:1 - critic/score/mean:0.2 - actor/lr:1e-06\n")
    db, url = _db(tmp_path)
    out = _ingest_json(str(log), "--db", url)
    assert out[0]["duplicates"] == 0
    assert _series(db, out[0]["run_id"], "eval_accuracy") == [(0, 0, 0.3146322971948446)]


def test_a_validation_dict_cut_off_is_said_and_not_stored(tmp_path):
    log = tmp_path / "v.log"
    log.write_text(
        "+ python3 -m verl.trainer.main_ppo data.train_batch_size=8 actor_rollout_ref.rollout.n=2\n"
        "(TaskRunner pid=7) (\"Initial validation metrics: {'val/test_score/openai/gsm8k': \"\n"
        "(TaskRunner pid=7) step:1 - critic/score/mean:0.2 - actor/lr:1e-06\n")
    db, url = _db(tmp_path)
    out = _ingest_json(str(log), "--db", url)
    assert any("line 2: validation metrics that could not be read" in n for n in out[0]["notes"])
    assert sql(db, "select step, key from metrics order by key") == [(1, "lr"),
                                                                       (1, "reward_mean")]


# -- 3. the evaluation before training when old verl logs its first update as step 0 -----------


def test_the_evaluation_before_training_is_at_samples_0_when_the_first_update_is_step_0(
        tmp_path):
    """Before: `step:0 - test_score/...:0.521`, printed before the training line of step 0,
    was stored at samples 512 (one batch of 64 x 8), as if measured after the first update."""
    db, url = _db(tmp_path)
    out = _ingest_json(str(FIX / "verl_old_step0.log"), "--db", url)
    rid = out[0]["run_id"]
    assert _series(db, rid, "eval_accuracy") == [
        (0, 0, 0.521), (4, 5 * 512, 0.563), (9, 10 * 512, 0.604)]  # after update 5 and 10
    assert _series(db, rid, "reward_mean")[:2] == [(0, 512, 0.52), (1, 1024, 0.53)]
    assert sql(db, "select distinct samples from metrics where run_id=? and step=0 and "
                    "key != 'eval_accuracy'", rid) == [(512,)]
    assert any("evaluation before training (eval_accuracy) is stored at step 0 with samples 0"
               in n for n in out[0]["notes"])


def test_step_0s_own_evaluation_after_its_update_is_said_to_be_left_out(tmp_path):
    # test_freq=1: step 0's line holds the evaluation after the first update too; the store
    # keeps one eval_accuracy at step 0, the one before training (here from the quoted dict)
    log = tmp_path / "v.log"
    log.write_text(
        "+ python3 -m verl.trainer.main_ppo data.train_batch_size=4 actor_rollout_ref.rollout.n=2"
        " trainer.test_freq=1\n"
        "(main_task pid=9) \"Initial validation metrics: {'test_score/openai/gsm8k': 0.25}\"\n"
        "(main_task pid=9) step:0 - test_score/openai/gsm8k:0.250\n"
        "(main_task pid=9) step:0 - critic/score/mean:0.3 - val/test_score/openai/gsm8k:0.300\n"
        "(main_task pid=9) step:1 - critic/score/mean:0.4 - val/test_score/openai/gsm8k:0.350\n")
    db, url = _db(tmp_path)
    out = _ingest_json(str(log), "--db", url)
    rid = out[0]["run_id"]
    assert _series(db, rid, "eval_accuracy") == [(0, 0, 0.25), (1, 16, 0.35)]
    assert _series(db, rid, "reward_mean") == [(0, 8, 0.3), (1, 16, 0.4)]
    assert any("step 0's eval_accuracy after its update was not stored" in n
               for n in out[0]["notes"])


# -- 4. a complete last line without its newline ------------------------------------------------


def test_a_complete_last_line_without_a_newline_is_imported(tmp_path):
    """Before: step 12 of the verl log (every field there, then the ANSI reset, then EOF) and
    step 8 of the JSONL (a whole object) were dropped as "the file ends mid-line"."""
    db, url = _db(tmp_path)
    for name in ("verl_no_trailing_newline.log", "table_no_trailing_newline.jsonl"):
        assert not (FIX / name).read_bytes().endswith(b"\n")
    out = _ingest_json(str(FIX / "verl_no_trailing_newline.log"),
                       str(FIX / "table_no_trailing_newline.jsonl"), "--db", url)
    verl, jsonl = (o["run_id"] for o in out)
    assert not any("mid-line" in n for o in out for n in o["notes"])
    assert _series(db, verl, "reward_mean")[-1] == (12, 12 * 64, 0.56)
    assert _series(db, verl, "time_gen_s")[-1] == (12, 12 * 64, 16.2)
    assert sql(db, "select count(*) from metrics where run_id=? and step=12", verl) == [(7,)]
    assert _series(db, jsonl, "reward_mean")[-1] == (8, 256, 0.8)


@pytest.mark.parametrize("cut, why", [
    ("step:12 - actor/entropy:np.float64(0.550) - actor/pg_loss:-0.002 - actor/grad_no",
     "'actor/grad_no' is not key:value"),
    ("step:12 - actor/entropy:np.float64(0.550) - actor/pg_loss:-0.002",
     "without actor/grad_norm, actor/lr, critic/score/mean and 2 more"),
])
def test_a_last_line_that_does_not_parse_whole_is_a_cut_line_not_a_bad_one(tmp_path, cut, why):
    text = (FIX / "verl_no_trailing_newline.log").read_text()
    log = tmp_path / "cut.log"
    log.write_text(text[: text.rindex("\n") + 1] + "\x1b[36m(TaskRunner pid=3021)\x1b[0m " + cut)
    db, url = _db(tmp_path)
    out = _ingest_json(str(log), "--db", url)  # no --skip-bad needed: not a malformed line
    assert out[0]["skipped_lines"] == [] and out[0]["steps"] == 11
    note = next(n for n in out[0]["notes"] if "the file ends mid-line (line 15" in n)
    if why.startswith("without"):
        assert why in note
    assert sql(db, "select count(*) from metrics where step=12") == [(0,)]


def test_a_jsonl_object_cut_off_is_left_out(tmp_path):
    text = (FIX / "table_no_trailing_newline.jsonl").read_text()
    log = tmp_path / "cut.jsonl"
    log.write_text(text[:-12])  # '{"step": 8, "reward_mean": 0.8, "entr'
    db, url = _db(tmp_path)
    out = _ingest_json(str(log), "--db", url)
    assert out[0]["skipped_lines"] == [] and out[0]["steps"] == 7
    assert any("ends mid-line (line 9" in n for n in out[0]["notes"])
    assert sql(db, "select max(step) from metrics") == [(7,)]


def _follower(path: Path, url: str, idle: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "twoclocks_cli", "ingest", str(path), "--follow", "--idle",
         str(idle), "--poll", "0.1", "--db", url, "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(db: Path, query: str, want, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = sql(db, query) if db.exists() else None
        except sqlite3.OperationalError:  # the follower is still creating the store
            got = None
        if got == want:
            return
        time.sleep(0.1)
    raise AssertionError(f"{query} never gave {want} (last: {got})")


@pytest.mark.subprocess  # a follower process reading the file while this test writes it
def test_follow_takes_an_unterminated_last_line_only_once_the_file_is_finished(tmp_path):
    """A growing file's last line may really be partial while it is written, and a partial
    verl line can parse (`...actor/entropy:0.5` of 0.55): --follow never stores it then, and
    takes a whole last line without its newline once the file is idle."""
    lines = (FIX / "verl_no_trailing_newline.log").read_text().split("\n")
    log = tmp_path / "live.log"
    step4 = lines[6]  # ... timing_s/gen:15.40<ANSI reset>
    assert "step:4 -" in step4
    log.write_text("\n".join(lines[:6]) + "\n" + step4[:-6])  # cut inside '15.40': '15.'
    db, url = _db(tmp_path)
    follower = _follower(log, url, idle=3)
    try:
        _wait_for(db, "select max(step) from metrics", [(3,)])
        time.sleep(1.0)  # ten polls of the file as it is: the cut step 4 still waits
        assert sql(db, "select count(*) from metrics where step=4") == [(0,)]
        with log.open("a") as fh:  # the writer finishes step 4, then writes step 5 unended
            fh.write(step4[-6:] + "\n" + lines[7])
        _wait_for(db, "select value from metrics where step=4 and key='time_gen_s'", [(15.4,)])
        time.sleep(0.5)  # under --idle since the last change: step 5 is not taken yet
        assert sql(db, "select count(*) from metrics where step=5") == [(0,)]
        out, err = follower.communicate(timeout=60)
    finally:
        follower.kill()
    assert follower.returncode == 0, err
    result = json.loads(out)[0]
    assert not any("mid-line" in n for n in result["notes"])
    assert sql(db, "select status from runs") == [("completed",)]
    assert _series(db, result["run_id"], "time_gen_s") == [
        (s, s * 64, round(15 + 0.1 * s, 2)) for s in range(1, 6)]


# -- 5. the config dict broken by another process's output and a NUL byte -----------------------


def test_an_unreadable_config_dict_falls_back_to_the_logged_lr(tmp_path):
    """Before: the dict's 'optim': {'lr': 5e-07} was lost with the dict (a WorkerDict line with
    NUL bytes glued into it) and the run's lr was stored as unknown, although actor/lr is
    logged at every step."""
    data = (FIX / "verl_config_broken_nul.log").read_bytes()
    assert b"\x00" in data and b"'lr': 5e-07" in data
    db, url = _db(tmp_path)
    out = _ingest_json(str(FIX / "verl_config_broken_nul.log"), "--db", url)
    rid = out[0]["run_id"]
    assert sql(db, "select lr, batch_prompts, group_size, "
                    "json_extract(config, '$.ingest.params_from.lr') from runs") == [
        (5e-07, 32, 8, "log (peak actor/lr logged)")]  # warm-up 1.67e-07, 3.33e-07, then 5e-07
    note = next(n for n in out[0]["notes"] if n.startswith("lr = 5e-07, the peak actor/lr"))
    assert "printed config dict (line 3) could not be read" in note and "--lr" in note
    assert not any("lr was not found" in n for n in out[0]["notes"])
    assert [v for _, _, v in _series(db, rid, "lr")][:3] == [
        1.6666666666666665e-07, 3.333333333333333e-07, 5e-07]  # the logged values, as logged
    # --lr still sets it, saying what it overrides
    out = _ingest_json(str(FIX / "verl_config_broken_nul.log"), "--lr", "6e-7", "--sweep", "o",
                       "--db", url)
    assert out[0]["lr"] == 6e-7 and out[0]["params_from"]["lr"] == "option"
    assert any("--lr 6e-07 overrides 5e-07 from the log (peak actor/lr logged)" in n
               for n in out[0]["notes"])


def test_an_unreadable_config_dict_is_named_when_the_batch_size_is_missing(tmp_path):
    text = (FIX / "verl_config_broken_nul.log").read_text()
    log = tmp_path / "nobatch.log"
    log.write_text(text.replace(" data.train_batch_size=32", ""))
    db, url = _db(tmp_path)
    proc = twoclocks_inproc("ingest", str(log), "--db", url)
    assert_one_line_error(proc, "the batch size is unknown; pass --batch-prompts",
                          "the printed config dict (line 3) could not be read")
    assert sql(db, "select count(*) from runs") == [(0,)]


# -- 6. a run's source key names its stored key -------------------------------------------------


def test_the_source_keys_of_imported_runs_name_their_store_keys(tmp_path):
    from twoclocks_cli.ingest.mapping import store_key_of

    db, url = _db(tmp_path)
    _ingest_json(str(FIX / "verl_new.log"), str(FIX / "verl_old.log"), "--sweep", "v",
                 "--db", url)
    _ingest_json(str(FIX / "trl_new"), "--sweep", "t", "--batch-prompts", "4",
                 "--group-size", "2", "--db", url)
    _ingest_json(str(FIX / "table.csv"), "--sweep", "c", "--map", "reward_mean=rew",
                 "--db", url)
    configs = {name: [json.loads(c) for (c,) in sql(
        db, "select r.config from runs r join sweeps w on w.id = r.sweep_id where w.name = ?",
        name)] for name in ("v", "t", "c")}
    assert store_key_of(configs["v"], "critic/score/mean") == "reward_mean"
    assert store_key_of(configs["v"], "actor/entropy") == "entropy"  # verl_new's name
    assert store_key_of(configs["v"], "actor/entropy_loss") == "entropy"  # verl_old's
    assert store_key_of(configs["t"], "reward") == "reward_mean"
    assert store_key_of(configs["c"], "rew") == "reward_mean"
    for name in ("reward_mean", "global_step", "no/such/key"):  # a store key, an axis, nothing
        assert store_key_of(configs["v"] + configs["c"], name) is None
    # stored as another key in another run (--map): ambiguous, never a silent pick
    with pytest.raises(ConfigError, match="'critic/score/mean' is the source of reward_mean, "
                                        "accuracy"):
        store_key_of(configs["v"] + [{"ingest": {"sources": {
            "accuracy": "critic/score/mean"}}}], "critic/score/mean")
