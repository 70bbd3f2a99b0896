"""`backend = "command"` with the verl preset, on a real subprocess (tests/support/verl_writer.py,
which prints verl's console format with Ray prefixes at a steady pace, checkpoints, resumes with
trainer.resume_mode=auto and crashes once on one cell): rows appear while the command runs,
exit codes become statuses, a rerun after the crash resumes with no duplicate row and every
stored value equals the fixture's truth. Also: `plan` prints the verl example's exact command
lines, and a bad [command] table is one line with nothing written."""

from __future__ import annotations

import math
import os
import re
import signal
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli import assert_one_line_error, twoclocks
from tests.support.verl_writer import truth

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).parents[2]
WRITER = ROOT / "tests" / "support" / "verl_writer.py"
P, G, STEPS = 2, 4, 12

CONFIG = """\
name = "cmd"
backend = "command"
sample_budget = {budget}
executor = "local"
workdir = "{workdir}"
min_steps = 4
[scaling]
reference_batch = 8
reference_lr = 0.001
[grid]
batch = [{p}]
group_size = {g}
seeds = [0, 1]
[command]
preset = "verl"
template = "{python} {writer} +fixture.pace=0.3 +fixture.save_freq=4 +fixture.crash_at=6 \
+fixture.crash_seed=1"
[local]
max_parallel = 2
"""


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "cmd.toml"
    path.write_text(CONFIG.format(budget=P * G * STEPS - 3, workdir=tmp_path / "runs", p=P, g=G,
                                  python=sys.executable, writer=WRITER))
    return path


def _runs(db: Path) -> dict[int, tuple]:
    """seed -> (run id, status, error)."""
    with sqlite3.connect(db) as con:
        return {seed: (rid, status, error) for rid, seed, status, error in con.execute(
            "select id, seed, status, error from runs")}


def _rows(db: Path, run_id: int) -> dict[tuple[int, str], tuple[int, float]]:
    with sqlite3.connect(db) as con:
        rows = con.execute("select step, key, samples, value from metrics where run_id=?",
                           (run_id,)).fetchall()
    assert len(rows) == len({(s, k) for s, k, *_ in rows})
    return {(s, k): (n, v) for s, k, n, v in rows}


def _check_truth(rows: dict, lr: float, steps: range) -> None:
    assert {s for s, _ in rows} == set(steps)
    for step in steps:
        for key, value in truth(step, lr).items():
            assert rows[(step, key)] == (step * P * G, pytest.approx(value)), (step, key)


def test_a_verl_command_streams_rows_crashes_and_resumes_on_rerun(tmp_path):
    cfg = _config(tmp_path)
    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    proc = twoclocks("sweep", str(cfg), "--db", url, timeout=120)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    live, deadline = [], time.monotonic() + 120
    while time.monotonic() < deadline:  # watch the store while the commands run
        runs = _runs(db)
        if all(st in ("completed", "failed") for _, st, _ in runs.values()):
            break
        rid, status, _ = runs[0]
        n = len({s for s, _ in _rows(db, rid)})
        if status == "running" and 0 < n < STEPS:
            live.append(n)
        time.sleep(0.2)
    runs = _runs(db)
    assert len(set(live)) >= 2, live  # rows landed step by step while the command ran
    lr = 0.001  # batch 8 = the reference batch
    ok_id, ok_status, _ = runs[0]
    assert ok_status == "completed", runs
    steps = math.ceil((P * G * STEPS - 3) / (P * G))
    assert steps == STEPS
    _check_truth(_rows(db, ok_id), lr, range(1, STEPS + 1))
    bad_id, bad_status, error = runs[1]
    assert bad_status == "failed", runs
    assert "exited with code 1" in error and "RuntimeError: simulated crash before step 6" \
        in error and "\n" not in error, error
    _check_truth(_rows(db, bad_id), lr, range(1, 6))  # steps 1-5 logged before the crash

    rerun = twoclocks("sweep", str(cfg), "--db", url, "--retry-failed", "--wait", timeout=180)
    assert rerun.returncode == 0, rerun.stderr + rerun.stdout
    runs = _runs(db)
    assert runs[1][1] == "completed" and runs[0][0] == ok_id, runs
    _check_truth(_rows(db, bad_id), lr, range(1, STEPS + 1))  # each step once, the truth
    logs = next((tmp_path / "runs").glob("cmd-*/cells/*/logs/attempt-2.cmd")).parent
    assert "trainer.resume_mode=auto" in (logs / "attempt-2.cmd").read_text()
    assert "trainer.resume_mode" not in (logs / "attempt-1.cmd").read_text()
    second = (logs / "attempt-2.out").read_text()
    assert "Resuming from global_step_4" in second  # verl's own resume, from its checkpoint
    assert re.findall(r"step:(\d+) -", second)[0] == "5"  # step 5 replayed, upserted once


def test_plan_prints_the_verl_example_commands():
    proc = twoclocks("plan", str(ROOT / "examples" / "verl-gsm8k-slurm.toml"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("cell ")]
    prompts = [32, 64, 128, 256, 512]  # the 16x range
    assert len(lines) == len(prompts)
    for p, line in zip(prompts, lines, strict=True):
        lr = 1e-6 * math.sqrt(p * 8 / 1024)
        words = line.split(": ", 1)[1].split()
        want = [f"data.train_batch_size={p}", "actor_rollout_ref.rollout.n=8",
                f"actor_rollout_ref.actor.optim.lr={lr!r}",
                "actor_rollout_ref.actor.clip_ratio_low=0.2",
                "actor_rollout_ref.actor.clip_ratio_high=0.28",
                f"trainer.total_training_steps={math.ceil(102_400 / (p * 8))}",
                'trainer.default_local_dir="$TWOCLOCKS_WORKDIR"/checkpoints',
                "trainer.logger=\"['console']\"", "data.seed=0",
                f"actor_rollout_ref.actor.ppo_mini_batch_size={p}",
                "actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-1.5B"]
        for w in want:
            assert w in words, (w, line)
        assert words[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
        assert "trainer.resume_mode=auto" not in words  # only when a cell runs again


@pytest.mark.parametrize("edit, needles", [
    (("+fixture.pace", "{steps} +fixture.pace"), ["command.template", "{steps}", "{total_steps}"]),
    (("[command]", "[command]\nlog_source = \"{workdir}/{oops}.jsonl\""),
     ["command.log_source", "{oops}"]),
    (("preset = \"verl\"", "preset = \"verl\"\nresume_args = \"x={seeds}\""),
     ["command.resume_args", "{seeds}"]),
    (("+fixture.pace", "data.train_batch_size=4 +fixture.pace"),
     ["command.template", "data.train_batch_size", "preset"]),
    (("+fixture.pace", "{prompts +fixture.pace"), ["command.template", "literal braces"]),
    (("+fixture.pace", "{lr:.2g} +fixture.pace"), ["command.template", "{lr}", "format spec"]),
    (("preset = \"verl\"", ""), ["command.log_format", "verl, jsonl, csv"]),
    (("preset = \"verl\"", "preset = \"verl\"\nlog_format = \"parquet\""),
     ["command.log_format", "'verl', 'jsonl' or 'csv'"]),
    (("[command]", "[trl]\nentry = \"builtin:tiny-arith\"\n[command]"),
     ["'trl'", "does not read", "[command]"]),
])
def test_a_bad_command_table_is_one_line_and_writes_nothing(tmp_path, edit, needles):
    cfg = _config(tmp_path)
    cfg.write_text(cfg.read_text().replace(*edit))
    db = tmp_path / "never.db"
    proc = twoclocks("sweep", str(cfg), "--db", f"sqlite:///{db}", timeout=120)
    assert_one_line_error(proc, str(cfg), *needles)
    assert not db.exists()


def test_the_command_table_is_required(tmp_path):
    cfg = _config(tmp_path)
    text = cfg.read_text()
    cfg.write_text(text[:text.index("[command]")] + text[text.index("[local]"):])
    proc = twoclocks("plan", str(cfg), timeout=120)
    assert_one_line_error(proc, "key 'command' is required")


JSONL_WRITER = """
import json, sys, time
steps, batch = int(sys.argv[1]), int(sys.argv[2])
with open("metrics.jsonl", "w") as fh:
    fh.write(json.dumps({"cfg": {"lr": float(sys.argv[3])}}) + "\\n")
    for step in range(1, steps + 1):
        fh.write(json.dumps({"step": step, "samples": 1000 + step * batch,
                             "reward_mean": step / 10}) + "\\n")
        fh.flush()
        time.sleep(0.05)
print("done")
"""


def test_a_jsonl_log_file_the_command_writes_is_followed_at_its_own_samples(tmp_path):
    (tmp_path / "writer.py").write_text(JSONL_WRITER)
    cfg = tmp_path / "j.toml"
    cfg.write_text(f"""\
name = "jl"
backend = "command"
sample_budget = 40
executor = "debug"
workdir = "{tmp_path / 'runs'}"
min_steps = 1
[scaling]
reference_batch = 8
reference_lr = 0.01
[grid]
batch = [2]
group_size = 4
[command]
template = "{sys.executable} {tmp_path / 'writer.py'} {{total_steps}} 8 {{lr}}"
log_format = "jsonl"
log_source = "{{workdir}}/metrics.jsonl"
poll_s = 0.1
""")
    db = tmp_path / "j.db"
    proc = twoclocks("sweep", str(cfg), "--db", f"sqlite:///{db}", timeout=120)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (rid, status, error), = _runs(db).values()
    assert status == "completed", error
    rows = _rows(db, rid)
    assert rows == {(s, "reward_mean"): (1000 + 8 * s, pytest.approx(s / 10))
                    for s in range(1, 6)}  # ceil(40 / 8) = 5 steps, samples as logged


def _writers(workdir_root: Path) -> list[int]:
    """pids of live fixture writers started for cells under `workdir_root`."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            env = (proc / "environ").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(c.endswith(b"verl_writer.py") for c in cmd) and \
                f"TWOCLOCKS_WORKDIR={workdir_root}".encode() in env:
            out.append(int(proc.name))
    return out


def test_a_trainer_orphaned_by_a_killed_job_is_stopped_before_the_rerun_resumes(tmp_path):
    """The job process alone is killed -9: bash dies with it, but the trainer bash had forked
    (with an EXIT trap, `trap true EXIT; python ...` is not exec'd) lives on, logging steps
    no job reads. The plain rerun stops it before the resumed command starts (one trainer per
    workdir) and stores what it logged: every step once, none lost."""
    from tests.support.cli import running_pids

    cfg = _config(tmp_path)
    text = cfg.read_text().replace("seeds = [0, 1]", "seeds = [0]")
    text = text.replace("+fixture.pace=0.3", "+fixture.pace=2.0")  # outlives the rerun's start
    cfg.write_text(text.replace('template = "', 'template = "trap true EXIT; '))
    db = tmp_path / "o.db"
    url = f"sqlite:///{db}"
    assert twoclocks("sweep", str(cfg), "--db", url, timeout=120).returncode == 0
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "the command made no progress"
        pids = running_pids(url, "cmd") if db.exists() else {}
        rid = next(iter(pids), None)
        if rid is not None and len({s for s, _ in _rows(db, rid)}) >= 2:
            break
        time.sleep(0.1)
    root = tmp_path / "runs"
    orphan = _writers(root)
    assert len(orphan) == 1, orphan
    os.kill(pids[rid], signal.SIGKILL)
    time.sleep(1.0)
    assert _writers(root) == orphan  # the trainer outlived its job: the path under test
    rerun = twoclocks("sweep", str(cfg), "--db", url, "--wait", timeout=180)
    assert rerun.returncode == 0, rerun.stderr + rerun.stdout
    assert orphan[0] not in _writers(root)
    first = next(root.glob("cmd-*/cells/*/logs/attempt-1.out")).read_text()
    assert "step:12 -" not in first  # it was stopped, it did not run to its end
    (rid2, status, _), = _runs(db).values()
    assert (rid2, status) == (rid, "completed")
    _check_truth(_rows(db, rid), 0.001, range(1, STEPS + 1))


@pytest.mark.slurm
def test_a_requeued_slurm_cell_reruns_the_command_with_the_resume_flag(tmp_path):
    """On a real SLURM cluster: the USR2 SLURM sends before a timeout makes submitit requeue
    the cell; the command runs again with trainer.resume_mode=auto and resumes from its
    checkpoint, every step stored once, the fixture's values."""
    from tests.integration.test_slurm import _cluster_up

    if (why := _cluster_up()) is not None:
        if os.environ.get("TWOCLOCKS_REQUIRE_SLURM") == "1":
            pytest.fail(f"SLURM is not up ({why})")
        pytest.skip(f"SLURM is not up ({why}); run scripts/slurm-up.sh")
    import subprocess

    cfg = _config(tmp_path)
    text = cfg.read_text().replace("seeds = [0, 1]", "seeds = [0]")
    text = text.replace('executor = "local"', 'executor = "slurm"')
    cfg.write_text(text.replace("+fixture.pace=0.3", "+fixture.pace=0.6")
                   + "[slurm]\ntimeout_min = 10\n")
    db = tmp_path / "q.db"
    url = f"sqlite:///{db}"
    try:
        assert twoclocks("sweep", str(cfg), "--db", url, timeout=120).returncode == 0
        deadline = time.monotonic() + 120
        while True:  # past the fixture's checkpoint at step 4
            assert time.monotonic() < deadline, "the cell made no progress"
            (rid, status, _), = _runs(db).values()
            if status == "running" and len({s for s, _ in _rows(db, rid)}) >= 5:
                break
            time.sleep(0.2)
        with sqlite3.connect(db) as con:
            job, = con.execute("select job_id from runs where id=?", (rid,)).fetchone()
        subprocess.run(["scancel", "--signal=USR2", job], check=True, capture_output=True)
        deadline = time.monotonic() + 240
        while _runs(db)[0][1] not in ("completed", "failed"):
            assert time.monotonic() < deadline, _runs(db)
            time.sleep(0.5)
        assert _runs(db)[0][1] == "completed", _runs(db)
        with sqlite3.connect(db) as con:
            attempts, = con.execute("select attempts from runs where id=?", (rid,)).fetchone()
        assert attempts == 2
        logs = next((tmp_path / "runs").glob("cmd-*/cells/*/logs"))
        assert "trainer.resume_mode=auto" in (logs / "attempt-2.cmd").read_text()
        assert re.search(r"Resuming from global_step_(4|8)\n", (logs / "attempt-2.out").read_text())
        _check_truth(_rows(db, rid), 0.001, range(1, STEPS + 1))
    finally:
        twoclocks("cancel", "cmd", "--db", url, timeout=60)


def test_a_command_that_exits_0_without_a_readable_step_fails_saying_where_it_looked(tmp_path):
    cfg = tmp_path / "e.toml"
    cfg.write_text(f"""\
name = "empty"
backend = "command"
sample_budget = 16
executor = "debug"
workdir = "{tmp_path / 'runs'}"
min_steps = 1
[scaling]
reference_batch = 8
reference_lr = 0.01
[grid]
batch = [2]
group_size = 4
[command]
template = "echo 'step 1 reward 0.5'"
log_format = "verl"
poll_s = 0.1
""")
    db = tmp_path / "e.db"
    proc = twoclocks("sweep", str(cfg), "--db", f"sqlite:///{db}", timeout=120)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (rid, status, error), = _runs(db).values()
    assert status == "failed" and "exited with code 0" in error and "attempt-1.out" in error \
        and "command.log_format" in error and "step 1 reward 0.5" in error, error
    assert _rows(db, rid) == {}
