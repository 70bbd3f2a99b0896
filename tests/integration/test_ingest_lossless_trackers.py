"""`twoclocks ingest` of tracker shapes that were lost or distorted, each written by the tracker's
own library (W&B offline, torch's TensorBoard SummaryWriter): a resumed verl run whose
`val_before_train` lands on its checkpoint's step, a W&B run resumed offline without `step=`, a
`.wandb` file cut in half, `add_hparams` with a metric dict. Every stored row is read back with
sqlite3 and compared with what the writer wrote."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import time
from pathlib import Path

import pytest

from tests.support import trackers as tk
from tests.support.cli import assert_one_line_error, twoclocks
from tests.support.stored import ingest as _ingest
from tests.support.stored import metric_rows as _rows

_MISSING = [m for m in ("wandb", "tensorboard", "torch", "mlflow")
            if importlib.util.find_spec(m) is None]
pytestmark = [
    pytest.mark.skipif(bool(_MISSING), reason=f"{', '.join(_MISSING)} missing: "
                       "pip install -e '.[sources]'"),
    pytest.mark.subprocess,
]

P = 4  # prompts per step (tk.GROUP = 8 completions each)
CHECKPOINT = 10  # the resumed part starts again after this step


def _status(db: Path, run_id: int) -> str:
    with sqlite3.connect(db) as con:
        return con.execute("select status from runs where id=?", (run_id,)).fetchone()[0]


def _resumed_verl() -> tuple[dict, dict, dict]:
    """(first part, second part, the run as stored should be): verl logs `val_before_train` at
    the checkpoint's step when it resumes, then trains on from the next step."""
    curve = tk.curve(P)
    first = {s: dict(v) for s, v in curve.items() if s <= CHECKPOINT + 2}  # died after 12
    again = {CHECKPOINT: {tk.EVAL: 0.5}}
    again.update({s: {k: v + 1 / 64 for k, v in row.items()}
                  for s, row in curve.items() if CHECKPOINT < s <= 20})
    want = {s: dict(v) for s, v in first.items() if s <= CHECKPOINT}
    want[CHECKPOINT][tk.EVAL] = 0.5
    want.update({s: v for s, v in again.items() if s > CHECKPOINT})
    for part in (first, again):  # verl adds its step to the training rows, not to evaluations
        for s, row in part.items():
            if tk.REWARD in row:
                row["training/global_step"] = s
    return first, again, want


def _check(db: Path, run_id: int, want: dict) -> None:
    """Every stored reward, entropy and eval row is the one written, at step x P x n."""
    b = P * tk.GROUP
    for key, store in tk.STORE.items():
        assert _rows(db, run_id, store) == [(s, 0 if s == 0 else s * b, row[key])
                                            for s, row in sorted(want.items()) if key in row]


def test_a_resumed_verl_runs_val_before_train_keeps_the_checkpoint_steps_metrics(tmp_path):
    """Before: the splice rule took the evaluation row at the checkpoint's step for the start of
    the redone steps and deleted that step's training metrics, from W&B and TensorBoard."""
    first, again, want = _resumed_verl()
    config = tk.verl_config(P)
    tk.write_wandb(tmp_path, [{"name": "r", "id": "resumed", "config": config,
                               "rows": sorted(first.items())}])
    time.sleep(1.1)  # a run directory's name holds its start second
    folder = tk.write_wandb(tmp_path, [{"name": "r", "id": "resumed", "resume": "allow",
                                        "config": config, "rows": sorted(again.items())}])
    db = tmp_path / "s.db"
    (r,) = _ingest(db, str(folder), "--sweep", "wandb")
    # the step is verl's training/global_step; evaluation rows (without it) at their _step
    assert r["sources"]["step"] == "training/global_step"
    _check(db, r["run_id"], want)
    assert any(f"from step {CHECKPOINT}: 2 earlier step(s) from {CHECKPOINT + 1} on replaced"
               in n for n in r["notes"]), r["notes"]

    from torch.utils.tensorboard import SummaryWriter

    tb = tmp_path / "tb" / "run"
    for part in (first, again):  # one event file per start, in one folder
        w = SummaryWriter(str(tb))
        for s, row in sorted(part.items()):
            for k, v in row.items():
                w.add_scalar(k, v, s)
        if part is first:
            w.add_hparams({"data.train_batch_size": P, "actor_rollout_ref.rollout.n": tk.GROUP,
                           "actor_rollout_ref.actor.optim.lr": tk.lr_of(P)}, {}, run_name=".")
        w.close()
        time.sleep(1.1)  # event file names hold their start second
    (r,) = _ingest(db, str(tb), "--sweep", "tb")
    _check(db, r["run_id"], want)


def test_a_wandb_run_resumed_offline_without_step_uses_the_trainers_step(tmp_path):
    """Before: W&B's _step starts again at 0 in the resumed part: every earlier step was
    replaced and the resumed rows landed at steps 0-4. verl logs training/global_step."""
    config = tk.verl_config(P)
    first = [[s, {tk.REWARD: s / 16, "training/global_step": s}] for s in range(1, 9)]
    again = [[s, {tk.REWARD: s / 16 + 1 / 32, "training/global_step": s}] for s in range(6, 11)]
    tk.write_wandb(tmp_path, [{"name": "r", "id": "noste", "config": config, "rows": first,
                               "explicit_step": False}])
    time.sleep(1.1)
    folder = tk.write_wandb(tmp_path, [{"name": "r", "id": "noste", "resume": "allow",
                                        "config": config, "rows": again,
                                        "explicit_step": False}])
    db = tmp_path / "s.db"
    (r,) = _ingest(db, str(folder))
    assert r["sources"]["step"] == "training/global_step"
    want = {s: row[tk.REWARD] for s, row in first} | {s: row[tk.REWARD] for s, row in again}
    assert _rows(db, r["run_id"], "reward_mean") == [(s, 32 * s, v)
                                                     for s, v in sorted(want.items())]
    # without the trainer's step the restart cannot be placed: the note says so
    bare = tmp_path / "bare"
    rows = [[s, {tk.REWARD: v[tk.REWARD]}] for s, v in first]
    tk.write_wandb(bare, [{"name": "b", "id": "bare", "config": config, "rows": rows,
                           "explicit_step": False}])
    time.sleep(1.1)
    folder = tk.write_wandb(bare, [{"name": "b", "id": "bare", "resume": "allow",
                                    "config": config, "rows": rows[:3], "explicit_step": False}])
    (r,) = _ingest(db, str(folder), "--sweep", "bare")
    assert any("_step counts again from 0" in n and "--map step=KEY" in n
               for n in r["notes"]), r["notes"]


def test_a_wandb_log_cut_in_half_is_stored_incomplete_and_analyze_says_so(tmp_path):
    """Before: exit 0, status completed, a target computed from half the curve."""
    folder = tk.write_wandb(tmp_path, [{"name": "cut", "config": tk.verl_config(P),
                                        "rows": sorted(tk.curve(P).items())}])
    (run_file,) = folder.glob("offline-run-*/*.wandb")
    data = run_file.read_bytes()
    run_file.write_bytes(data[: len(data) // 2])
    db = tmp_path / "s.db"
    (r,) = _ingest(db, str(folder), "--sweep", "cut")
    assert _status(db, r["run_id"]) == "incomplete"
    (again,) = _ingest(db, str(folder), "--sweep", "cut")  # importing it again changes nothing
    assert (again["run_id"], again["action"]) == (r["run_id"], "unchanged")
    assert any("no exit record" in n and "incomplete" in n for n in r["notes"])
    stored = _rows(db, r["run_id"], "reward_mean")
    curve = tk.curve(P)
    assert stored and all(v == curve[s][tk.REWARD] and n == s * P * tk.GROUP
                          for s, n, v in stored)  # what is there is what was written
    assert len(stored) < len([s for s in curve if tk.REWARD in curve[s]])
    proc = twoclocks("analyze", "cut", "--db", f"sqlite:///{db}", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["runs"][0]["status"] == "incomplete" and doc["runs"][0]["partial"]
    assert any(f"run(s) [{r['run_id']}] incomplete" in w for w in doc["warnings"]), doc


def test_add_hparams_with_a_metric_dict_is_one_run_with_its_config(tmp_path):
    """Before: the subfolder add_hparams writes its metric into was a second run ("no reward
    was logged"), and the whole import exited 2; with --run the hparams were absent."""
    from torch.utils.tensorboard import SummaryWriter

    curve = tk.curve(P)
    w = SummaryWriter(str(tmp_path / "tb" / "bs32"))
    for s, row in sorted(curve.items()):
        for k, v in row.items():
            w.add_scalar(k, v, s)
    w.add_hparams({"data.train_batch_size": P, "actor_rollout_ref.rollout.n": tk.GROUP,
                   "actor_rollout_ref.actor.optim.lr": tk.lr_of(P)},
                  {"hparam/final_reward": 0.75})
    w.close()
    db = tmp_path / "s.db"
    for sweep, args in (("all", []), ("one", ["--run", "bs32"])):
        (r,) = _ingest(db, str(tmp_path / "tb"), "--sweep", sweep, *args)
        assert (r["batch_prompts"], r["group_size"], r["lr"]) == (P, tk.GROUP, tk.lr_of(P))
        _check(db, r["run_id"], curve)
        assert any("metric_dict (hparam/final_reward)" in n for n in r["notes"]), r["notes"]


def test_a_dpo_run_logged_to_wandb_is_refused_by_its_keys(tmp_path):
    """HF/TRL's W&B callback on a DPO trainer: `train/rewards/accuracies` is preference
    accuracy; before, it could be picked as a reward function's accuracy."""
    rows = [[s, {"train/loss": 0.69 - s / 100, "train/rewards/chosen": s / 10,
                 "train/rewards/rejected": -s / 10, "train/rewards/accuracies": 0.5 + s / 20,
                 "train/rewards/margins": s / 5, "train/logps/chosen": -50.0,
                 "train/global_step": s}] for s in range(1, 6)]
    folder = tk.write_wandb(tmp_path, [{"name": "dpo", "config": {"beta": 0.1},
                                        "rows": rows, "explicit_step": False}])
    db = tmp_path / "s.db"
    _ingest(db, str(tk.write_csv(tmp_path / "csv")[0]), "--batch-prompts", "4",
            "--group-size", "8")  # a store with a run in it
    with sqlite3.connect(db) as con:
        before = list(con.iterdump())
    proc = twoclocks("ingest", str(folder), "--map", "accuracy=train/rewards/accuracies",
                     "--batch-prompts", "4", "--group-size", "2", "--db", f"sqlite:///{db}")
    line = assert_one_line_error(proc, "preference-training (DPO-style)", "nothing imported")
    assert "(run dpo)" in line
    with sqlite3.connect(db) as con:
        assert list(con.iterdump()) == before


def test_an_mlflow_run_that_did_not_finish_is_stored_incomplete(tmp_path):
    curve = {s: row for s, row in tk.curve(P).items() if s <= 12}
    params = {"data/train_batch_size": P, "actor_rollout_ref/rollout/n": tk.GROUP,
              "actor_rollout_ref/actor/optim/lr": tk.lr_of(P)}
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tk.write_mlflow(uri, [{"experiment": "e", "name": "killed", "params": params,
                           "rows": tk._verl_metrics(curve), "status": "KILLED"},
                          {"experiment": "e", "name": "done", "params": params,
                           "rows": tk._verl_metrics(curve)}])
    db = tmp_path / "s.db"
    out = _ingest(db, "--from", f"mlflow:{uri}")
    by_name = {r["run"]: r for r in out}
    assert {n: _status(db, r["run_id"]) for n, r in by_name.items()} == {
        "e/killed": "incomplete", "e/done": "completed"}, list(by_name)
    for r in out:
        _check(db, r["run_id"], curve)
