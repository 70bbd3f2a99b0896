"""`twoclocks train` in a log (stdout not a terminal) and interrupted with Ctrl-C (SIGINT to the
real process): plain progress lines, then where the checkpoint is and the exact command that
resumes; that command resumes from the checkpoint's step and says so."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from tests.support.cli import sigint_deliverable

pytestmark = [pytest.mark.slow, pytest.mark.tiny_model]


CONFIG = """model = "builtin:tiny-arith"
dataset = "builtin:arithmetic"
group_size = 8
prompts_per_batch = 4
sample_budget = 768
lr = 1e-4
max_new_tokens = 12
eval_every_samples = 256
eval_size = 32
checkpoint_every_steps = 4
threads = 1
"""


def _start(args, cwd):
    env = {**os.environ, "TWOCLOCKS_PROGRESS_S": "0"}  # a line per step
    return subprocess.Popen([sys.executable, "-m", "twoclocks_cli", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_deliverable)


def test_ctrl_c_says_how_to_resume_and_the_resume_says_where_from(tmp_path, tiny_model):
    cfg = tmp_path / "t.toml"
    cfg.write_text(CONFIG)
    db = f"sqlite:///{tmp_path / 's.db'}"
    wd = tmp_path / "wd"
    proc = _start(["train", str(cfg), "--db", db, "--workdir", str(wd)], tmp_path)
    from trainer import checkpoint

    def complete_step():  # the newest checkpoint with its done-marker (a dir alone is partial)
        path = checkpoint.latest(wd)
        return int(path.name.split("-")[-1]) if path else 0

    deadline = time.monotonic() + 600
    while complete_step() < 8 and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    lines = [ln for ln in out.splitlines() if ln.startswith("run 1: ")]
    assert lines and re.match(r"run 1: [\d,]+/768 samples  step \d+  reward", lines[0])
    m = re.search(r"run 1 interrupted: the last checkpoint is step (\d+) \(([\d,]+) samples\) "
                  r"in (\S+); resume with: (.+)$", err.strip().splitlines()[-1])
    assert m, err
    step, samples = int(m.group(1)), int(m.group(2).replace(",", ""))
    assert step >= 8 and samples == step * 32
    again = _start(shlex.split(m.group(4))[1:], tmp_path)  # the printed command, as given
    out, err = again.communicate(timeout=600)
    assert again.returncode == 0, err
    assert f"resuming run 1 from its checkpoint at step {step} ({samples:,} samples)" in err
    first = next(ln for ln in out.splitlines() if ln.startswith("run 1: "))
    assert int(first.split()[2].split("/")[0].replace(",", "")) > samples
    assert "run 1 completed" in out


def test_a_reward_module_beside_the_config_loads_without_pythonpath(tmp_path, tiny_model):
    import sqlite3

    conf_dir, elsewhere = tmp_path / "exp", tmp_path / "cwd"
    conf_dir.mkdir()
    elsewhere.mkdir()
    (conf_dir / "myreward.py").write_text(
        "def half(completions, problems):\n    return [0.5 for _ in completions]\n")
    db = tmp_path / "s.db"
    bad = conf_dir / "bad.toml"
    bad.write_text(CONFIG.replace("sample_budget = 768", "sample_budget = 64")
                   + 'reward = "myreward:nothere"\n')
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = [sys.executable, "-m", "twoclocks_cli", "train"]
    proc = subprocess.run([*run, str(bad), "--db", f"sqlite:///{db}"], cwd=elsewhere, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "has no function 'nothere'" in proc.stderr, proc.stderr
    assert not db.exists()  # refused before the store was touched
    good = conf_dir / "good.toml"
    good.write_text(bad.read_text().replace("myreward:nothere", "myreward:half"))
    proc = subprocess.run([*run, str(good), "--db", f"sqlite:///{db}"], cwd=elsewhere, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with sqlite3.connect(db) as con:
        rewards = [v for (v,) in con.execute("select value from metrics where key='reward_mean'")]
    assert rewards and all(v == 0.5 for v in rewards)  # the user's function, nothing else
