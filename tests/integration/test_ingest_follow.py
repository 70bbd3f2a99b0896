"""`twoclocks ingest --follow` against a log another process is writing (the real CLI, a real
SQLite store): partial lines wait for their newline, the run is `running` meanwhile and
`completed` after --idle, the rows equal a one-shot import of the finished file, a second
follower duplicates nothing, and a file rewritten shorter while followed is imported afresh."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli import assert_one_line_error, twoclocks

pytestmark = pytest.mark.subprocess

HEADER = ("+ python3 -m verl.trainer.main_ppo data.train_batch_size=8 "
          "actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.optim.lr=1e-6\n")
WRITER = r"""
import sys, time
path, steps, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path, "a") as fh:
    for s in range(start, start + steps):
        line = (f"(TaskRunner pid=7) step:{s} - critic/score/mean:{0.01 * s:.4f}"
                " - actor/entropy:0.5\n")
        half = len(line) // 2
        fh.write(line[:half]); fh.flush(); time.sleep(0.15)   # a line written in two pieces
        fh.write(line[half:]); fh.flush(); time.sleep(0.1)
"""


def _follow(path: Path, url: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "twoclocks_cli", "ingest", str(path), "-f", "verl", "--follow",
           "--idle", "2", "--poll", "0.1", "--db", url, "--json", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _rows(db: Path, run_id: int) -> list[tuple]:
    with sqlite3.connect(db) as con:
        return sorted(con.execute("select step, samples, key, value from metrics where run_id=?",
                                  (run_id,)).fetchall())


def _status(db: Path, run_id: int) -> str:
    with sqlite3.connect(db) as con:
        return con.execute("select status from runs where id=?", (run_id,)).fetchone()[0]


def test_follow_a_growing_log_then_follow_it_again(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(HEADER)
    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    follower = _follow(log, url)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(log), "12", "1"])

    def stored():  # (run id, status, steps stored) once the follower has stored a step
        if not db.exists():
            return None
        with sqlite3.connect(db) as con:
            try:
                run = con.execute("select id, status from runs").fetchone()
            except sqlite3.OperationalError:  # the follower is still creating the store
                return None
            steps = run and [r[0] for r in con.execute(
                "select distinct step from metrics where run_id=? order by step", (run[0],))]
        return steps and (*run, steps)

    # mid-way (polled, not a fixed sleep: the follower's start-up takes longer on a busy
    # machine): the run exists and is running, with only complete lines stored
    deadline = time.monotonic() + 60
    while not (got := stored()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert got, "the follower stored no step in 60 s"
    run_id, status, steps = got
    assert status == "running" and steps == list(range(1, len(steps) + 1))
    assert writer.wait(timeout=60) == 0
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err
    result = json.loads(out)[0]
    assert result["run_id"] == run_id and result["action"] == "followed"
    assert _status(db, run_id) == "completed"
    followed = _rows(db, run_id)
    assert len(followed) == 12 * 2  # 12 steps x (reward_mean, entropy), each once
    # a one-shot import of the finished file: the same values, step by step
    proc = twoclocks("ingest", str(log), "-f", "verl", "--db", url, "--sweep", "once", "--json")
    assert proc.returncode == 0, proc.stderr
    once = _rows(db, json.loads(proc.stdout)[0]["run_id"])
    assert once == followed
    assert followed[0] == (1, 32, "entropy", 0.5)  # samples = step x 8 prompts x 4
    # a second follower of the unchanged file: the same run, nothing duplicated
    again = _follow(log, url, "--idle", "1")
    out, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    assert json.loads(out)[0]["run_id"] == run_id
    assert _rows(db, run_id) == followed


def test_a_file_rewritten_shorter_while_followed_is_imported_afresh(tmp_path):
    log = tmp_path / "run.log"
    body = "".join(f"step:{s} - critic/score/mean:{0.1 * s:.2f}\n" for s in range(1, 6))
    log.write_text(HEADER + body)
    db = tmp_path / "s.db"
    follower = _follow(log, f"sqlite:///{db}", "--idle", "3")
    time.sleep(1.5)
    log.write_text(HEADER + "step:1 - critic/score/mean:0.77\n")  # the job restarted its log
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err
    run_id = json.loads(out)[0]["run_id"]
    assert _rows(db, run_id) == [(1, 32, "reward_mean", 0.77)]


def test_follow_refuses_bad_options_in_one_line(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(HEADER)
    url = f"sqlite:///{tmp_path / 's.db'}"
    for extra, needle in ((["--idle", "0"], "--idle 0.0: must be"),
                          (["--poll", "inf"], "--poll inf: must be"),
                          ([str(log)], "--follow follows one file, got 2")):
        proc = twoclocks("ingest", str(log), "-f", "verl", "--follow", "--db", url, *extra)
        assert_one_line_error(proc, needle)
    assert not (tmp_path / "s.db").exists()


def test_follow_stops_when_the_writing_process_exits(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(HEADER)
    db = tmp_path / "s.db"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(log), "4", "1"])
    t0 = time.monotonic()
    follower = _follow(log, f"sqlite:///{db}", "--idle", "600", "--pid", str(writer.pid))
    writer.wait(timeout=60)
    out, err = follower.communicate(timeout=60)  # an --idle of 600 s would time this out
    assert follower.returncode == 0, err
    assert time.monotonic() - t0 < 30
    run_id = json.loads(out)[0]["run_id"]
    assert _status(db, run_id) == "completed" and len(_rows(db, run_id)) == 4 * 2
