"""`backend = "trl"`: real TRL GRPOTrainers on the tiny model on CPU, as sweep cells on the local
executor. A 2-cell sweep through a user's own `module:function` entry (found beside the config)
completes, every optimizer step is stored once at the trainer's own samples with the values of
the trainer's own log_history (from its last checkpoint), `analyze` runs on it; a kill -9 of the
whole process tree mid-cell and a plain rerun resume from the latest checkpoint with each step
stored once, equal to the resumed trainer's log_history."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli import kill_tree, twoclocks

pytest.importorskip("trl", reason="the trl extra is not installed")
pytestmark = [pytest.mark.slow, pytest.mark.tiny_model]
ROOT = Path(__file__).parents[2]

CONFIG = """\
name = "{name}"
backend = "trl"
sample_budget = {budget}
executor = "local"
workdir = "{workdir}"
min_steps = 2
[scaling]
reference_batch = 8
reference_lr = 1e-4
[grid]
batch = {batch}
group_size = 4
seeds = [0]
[trl]
entry = "{entry}"
checkpoint_every_steps = {every}
[trl.args]
use_cpu = true
bf16 = false
gradient_checkpointing = false
max_completion_length = 12
beta = 0.0
lr_scheduler_type = "constant"
dataloader_num_workers = 0
[local]
max_parallel = 2
"""

USER_ENTRY = '''
from twoclocks_cli.backends.trl_tiny import tiny_arith_trainer


def make_trainer(args):
    """A user's own entry: the built-in pieces, plus a mark that this function built it."""
    with open(args.output_dir + ".entry", "a") as fh:
        fh.write(f"{args.per_device_train_batch_size} {args.num_generations} {args.max_steps}\\n")
    return tiny_arith_trainer(args)
'''


def _config(tmp_path: Path, name: str, batch: str, budget: int, entry: str, every: int) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(CONFIG.format(name=name, budget=budget, workdir=tmp_path / "runs",
                                  batch=batch, entry=entry, every=every))
    return path


def _runs(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as con:
        return con.execute("select id, batch_prompts, lr, status, error, cell_id from runs "
                           "order by batch_prompts").fetchall()


def _rows(db: Path, run_id: int) -> dict[tuple[int, str], tuple[int, float]]:
    with sqlite3.connect(db) as con:
        rows = con.execute("select step, key, samples, value from metrics where run_id=?",
                           (run_id,)).fetchall()
    assert len(rows) == len({(s, k) for s, k, *_ in rows})
    return {(s, k): (n, v) for s, k, n, v in rows}


def _cell_dir(tmp_path: Path, cell_id: str) -> Path:
    return next((tmp_path / "runs").glob(f"*/cells/{cell_id[:16]}"))


def _history(cell: Path, steps: int) -> dict[int, dict]:
    """The trainer's own logs, step -> log, from its last checkpoint's trainer_state.json."""
    state = json.loads((cell / "trl" / f"checkpoint-{steps}" / "trainer_state.json").read_text())
    return {h["step"]: h for h in state["log_history"] if "loss" in h}


def _check_against_history(rows: dict, hist: dict, steps: int, batch: int, lr: float) -> None:
    """Every step 1..steps stored once, at step x batch samples, with the trainer's values."""
    assert sorted(hist) == list(range(1, steps + 1))
    assert {s for s, _ in rows} == set(range(1, steps + 1))
    for step, h in hist.items():
        assert rows[(step, "loss")] == (step * batch, pytest.approx(h["loss"], abs=1e-9))
        assert rows[(step, "lr")][1] == pytest.approx(lr)
        assert rows[(step, "reward_mean")][1] == pytest.approx(h["reward"])
        assert rows[(step, "resp_len_mean")][1] == pytest.approx(h["completions/mean_length"])


def test_a_two_cell_trl_sweep_through_a_user_entry_stores_every_step_once(tmp_path):
    (tmp_path / "my_trainers.py").write_text(USER_ENTRY)
    cfg = _config(tmp_path, "trl2", "[2, 4]", 48, "my_trainers:make_trainer", every=3)
    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    proc = twoclocks("sweep", str(cfg), "--db", url, "--wait", timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    runs = _runs(db)
    assert [(p, st) for _, p, _, st, _, _ in runs] == [(2, "completed"), (4, "completed")], runs
    for rid, prompts, lr, _, _, cell_id in runs:
        batch = prompts * 4
        steps = -(-48 // batch)  # ceil: 6 and 3 optimizer steps
        assert lr == pytest.approx(1e-4 * (batch / 8) ** 0.5)
        cell = _cell_dir(tmp_path, cell_id)
        # the user's function built the trainer, with the GRPOConfig the cell asks for
        assert (cell / "trl.entry").read_text() == f"{batch} 4 {steps}\n"
        _check_against_history(_rows(db, rid), _history(cell, steps), steps, batch, lr)
    out = twoclocks("analyze", "trl2", "--db", url, timeout=300)
    assert out.returncode == 0, out.stderr + out.stdout
    assert "sweep trl2" in out.stdout


def _latest_ckpt(cell: Path | None) -> int:
    """The newest checkpoint step whose trainer_state.json is complete (0: none)."""
    if cell is None or not (cell / "trl").is_dir():
        return 0
    best = 0
    for p in (cell / "trl").glob("checkpoint-*"):
        try:
            json.loads((p / "trainer_state.json").read_text())
        except (OSError, ValueError):
            continue
        best = max(best, int(p.name.split("-")[1]))
    return best


def _max_step(db: Path) -> int:
    try:
        with sqlite3.connect(db, timeout=5) as con:
            return int(con.execute("select coalesce(max(step), 0) from metrics").fetchone()[0])
    except sqlite3.OperationalError:
        return 0  # not created yet


def test_kill9_mid_cell_then_a_plain_rerun_resumes_from_the_checkpoint(tmp_path):
    steps, every = 40, 5
    cfg = _config(tmp_path, "trlk", "[2]", 8 * steps, "builtin:tiny-arith", every=every)
    db = tmp_path / "k.db"
    url = f"sqlite:///{db}"
    cli = [sys.executable, "-m", "twoclocks_cli", "sweep", str(cfg), "--db", url, "--wait"]
    proc = subprocess.Popen(cli, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT)
    deadline, cell = time.monotonic() + 300, None
    while True:  # kill after a checkpoint (>= 10) and with steps logged past it
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        if cell is None and (tmp_path / "runs").is_dir():
            cell = next((tmp_path / "runs").glob("*/cells/*"), None)
        ckpt = _latest_ckpt(cell)
        if ckpt >= 2 * every and _max_step(db) > ckpt:
            break
        time.sleep(0.05)
    killed_at = _max_step(db)
    assert killed_at < steps, "the cell finished before the kill"
    kill_tree(proc.pid)
    proc.communicate(timeout=60)
    rerun = twoclocks("sweep", str(cfg), "--db", url, "--wait", timeout=600, cwd=ROOT)
    assert rerun.returncode == 0, rerun.stderr + rerun.stdout
    (rid, _, lr, status, _, cell_id), = _runs(db)
    assert status == "completed"
    with sqlite3.connect(db) as con:
        events = [e for e, in con.execute("select to_status from run_events where run_id=? "
                                          "order by id", (rid,))]
    assert "lost" in events, events  # the kill was seen as a lost job, resumed by a plain rerun
    cell = _cell_dir(tmp_path, cell_id)
    lines = (cell / "trl-attempts.jsonl").read_text().splitlines()
    attempts = [json.loads(line) for line in lines]
    assert attempts[0]["resume_from"] is None
    resumed = int(attempts[1]["resume_from"].split("-")[1])
    assert len(attempts) == 2 and 2 * every <= resumed < killed_at, (attempts, killed_at)
    # the resumed trainer's log_history holds attempt 1's logs up to its checkpoint and attempt
    # 2's after it: the store equals it at every step, each once
    _check_against_history(_rows(db, rid), _history(cell, steps), steps, 8, lr)
    print(f"\nkilled at step {killed_at}, resumed from checkpoint-{resumed}, {steps} steps once")


NO_TORCH = """
import sys
from pathlib import Path
from twoclocks_cli.commands.plan import cell_lines
from twoclocks_cli.config import load_plan
p = load_plan(Path(sys.argv[1]))
for line in cell_lines(p).values():
    print(line)
assert "torch" not in sys.modules and "trl" not in sys.modules, "plan imported torch/trl"
"""


def test_plan_shows_each_cells_grpo_config_without_importing_torch():
    example = ROOT / "examples" / "trl-tiny-sweep.toml"
    proc = subprocess.run([sys.executable, "-c", NO_TORCH, str(example)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for prompts, line in zip([2, 8], lines, strict=True):  # 8 and 32 completions, budget 256
        batch = prompts * 4
        assert f"per_device_train_batch_size={batch}," in line
        assert f"max_steps={256 // batch}," in line and "num_generations=4," in line
        assert f"learning_rate={1e-4 * (batch / 8) ** 0.5!r}," in line


@pytest.mark.parametrize("edit, needles", [
    (('entry = "builtin:tiny-arith"', 'entry = "not_a_module_xyz:make"'),
     ["trl.entry", "'not_a_module_xyz' is not importable"]),
    (('entry = "builtin:tiny-arith"', 'entry = "builtin:huge"'), ["trl.entry", "unknown builtin"]),
    (('entry = "builtin:tiny-arith"', 'entry = "make a trainer"'),
     ["trl.entry", "module:function"]),
    (("use_cpu = true", "use_cpu = true\nper_device_train_batch_size = 4"),
     ["trl.args.per_device_train_batch_size", "set by the sweep"]),
    (("use_cpu = true", "use_cpu = true\nnum_generation = 4"),
     ["trl.args.num_generation", "did you mean 'num_generations'"]),
    (("use_cpu = true", "use_cpu = true\ngradient_accumulation_steps = 3"),
     ["grid.batch", "divisible by 3"]),
    (("[trl]", "[trainer]\nmodel = \"x\"\n[trl]"), ["'trainer'", "does not read"]),
])
def test_a_bad_trl_table_is_one_line_and_writes_nothing(tmp_path, edit, needles):
    from tests.support.cli import assert_one_line_error

    cfg = _config(tmp_path, "bad", "[2]", 64, "builtin:tiny-arith", every=4)
    cfg.write_text(cfg.read_text().replace(*edit))
    db = tmp_path / "never.db"
    proc = twoclocks("sweep", str(cfg), "--db", f"sqlite:///{db}", timeout=120)
    assert_one_line_error(proc, str(cfg), *needles)
    assert not db.exists()


def test_a_cells_grpo_config_generates_p_times_g_completions_per_rollout_batch(tmp_path):
    """TRL's own GRPOConfig, built from a cell with gradient accumulation 2 and 2 iterations
    per generation: one generation batch is P x G = 32 completions, and the callback's counter
    gives 32 / 2 fresh completions per optimizer step, so max_steps x that = the budget."""
    from trl import GRPOConfig

    from twoclocks_cli.backends.trl import grpo_args
    from twoclocks_cli.integrations.trl import samples_per_step

    cell = {"prompts_per_batch": 4, "group_size": 8, "lr": 3e-5, "clip_eps_low": 0.2,
            "clip_eps_high": 0.28, "seed": 7, "sample_budget": 100,
            "trl": {"entry": "builtin:tiny-arith", "processes": 1, "checkpoint_every_steps": 3,
                    "args": {"gradient_accumulation_steps": 2, "num_iterations": 2,
                             "use_cpu": True, "bf16": False}}}
    args = GRPOConfig(**grpo_args(cell, tmp_path))
    assert args.per_device_train_batch_size == 16 and args.num_generations == 8
    assert args.generation_batch_size == 32  # P x G: what TRL generates at once
    assert args.max_steps == 4 * 2  # ceil(100 / 32) = 4 rollout batches, 2 steps each
    assert (args.learning_rate, args.epsilon, args.epsilon_high, args.seed) == \
        (3e-5, 0.2, 0.28, 7)
    assert args.output_dir == str(tmp_path / "trl") and args.save_steps == 3
    per_step, prompts = samples_per_step(args)
    assert (per_step, prompts) == (16, 2)
    assert args.max_steps * per_step == 4 * 32


def test_grid_trl_axes_cross_grpo_config_fields_into_cells(tmp_path):
    from twoclocks_cli.commands.plan import cell_lines
    from twoclocks_cli.config import load_plan
    from twoclocks_cli.core.errors import ConfigError

    cfg = _config(tmp_path, "ax", "[2, 4]", 64, "builtin:tiny-arith", every=4)
    cfg.write_text(cfg.read_text().replace("[local]", "[grid.trl]\nnum_iterations = [1, 2]\n"
                                           "[local]"))
    p = load_plan(cfg)
    got = sorted((c.prompts, c.config["trl"]["args"]["num_iterations"]) for c in p.cells)
    assert got == [(2, 1), (2, 2), (4, 1), (4, 2)]
    lines = cell_lines(p)
    for c in p.cells:  # mu optimizer steps per rollout batch of P x G completions
        mu, batch = c.config["trl"]["args"]["num_iterations"], c.prompts * 4
        assert f"max_steps={-(-64 // batch) * mu}," in lines[c.cell_id]
    cfg.write_text(cfg.read_text().replace("num_iterations = [1, 2]", "seed = [1, 2]"))
    with pytest.raises(ConfigError, match=r"key 'grid.trl.seed': set by the sweep itself"):
        load_plan(cfg)
    cfg.write_text(cfg.read_text().replace("seed = [1, 2]", "beta = [0.0, 0.1]"))
    with pytest.raises(ConfigError, match=r"key 'trl.args.beta': also an axis"):
        load_plan(cfg)
