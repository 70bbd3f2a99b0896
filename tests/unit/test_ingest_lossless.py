"""`twoclocks ingest` of log-file shapes real writers produce that were lost, distorted or refused
with the wrong reason: a verl recipe counting prompts in `rollout/total_num_samples`, verl names in
CSV/JSONL, verl's `file` logger, a crashed verl log that starts with Ray's banner, a verl log
without its config, a NaN in a W&B panel export, DPO/SFT logs of LLaMA-Factory and verl. These
writers are services or libraries not installed here, so the files are written by hand in their
shape; every stored row is read back with sqlite3 and compared with what was written."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.support.cli import assert_one_line_error, twoclocks_inproc
from tests.support.stored import ingest as _ingest
from tests.support.stored import metric_rows as _rows

BANNER = ("2025-06-01 10:00:00,123\tINFO worker.py:1832 -- Started a local Ray instance. View "
          "the dashboard at 127.0.0.1:8265 \n")


def _dump(db: Path) -> list[str]:
    if not db.exists():
        return []
    with sqlite3.connect(db) as con:
        return list(con.iterdump())


def _run(db: Path, run_id: int) -> tuple:
    with sqlite3.connect(db) as con:
        return con.execute("select batch_prompts, group_size, batch_samples, lr, status from runs "
                           "where id=?", (run_id,)).fetchone()


def _step_line(step: int, values: dict) -> str:
    return f"(TaskRunner pid=311) step:{step} - " + " - ".join(
        f"{k}:{v}" for k, v in values.items()) + "\n"


# -- 1. a recipe's sample counter that counts prompts --------------------------------------------


def _prompt_counting_log(path: Path, header: bool) -> dict[int, float]:
    """8 steps of 4 prompts x n 8; `rollout/total_num_samples` adds one per prompt kept."""
    reward = {s: s / 16 for s in range(1, 9)}
    head = ("+ python3 -m recipe.dapo.main_dapo algorithm.adv_estimator=grpo "
            "data.train_batch_size=4 actor_rollout_ref.rollout.n=8 "
            "actor_rollout_ref.actor.optim.lr=1e-6\n") if header else ""
    path.write_text(head + "".join(_step_line(s, {"critic/score/mean": reward[s],
                                                  "rollout/total_num_samples": 4 * s})
                                   for s in reward))
    return reward


def test_a_sample_counter_below_one_batch_a_step_is_not_the_samples_axis(tmp_path):
    """Before: samples 4..32 (the prompts kept) instead of 32..256: step 1 below one batch."""
    db = tmp_path / "s.db"
    for header, opts in ((True, []), (False, ["--batch-prompts", "4", "--group-size", "8"])):
        log = tmp_path / f"dapo_{header}.log"
        reward = _prompt_counting_log(log, header)
        (r,) = _ingest(db, str(log), "--sweep", f"h{header}", *opts)
        assert _rows(db, r["run_id"], "reward_mean") == [(s, 32 * s, v)
                                                         for s, v in reward.items()]
        assert r["batch_samples"] == 32 and "samples" not in r["sources"]
        assert any("rollout/total_num_samples" in n and "counts prompts, not completions" in n
                   for n in r["notes"]), r["notes"]


# -- 5. verl names in CSV and JSON Lines ---------------------------------------------------------

_VERL_ROWS = {  # step -> verl key -> value: the evaluation before training, then updates
    0: {"val-core/math/reward/mean@4": 0.25, "val-core/gsm8k/reward/mean@4": 0.5,
        "val-core/math/reward/mean@1": 0.0},
    1: {"critic/score/mean": 0.125, "actor/lr": 5e-7},
    2: {"critic/score/mean": 0.25, "actor/lr": 1e-6},
    3: {"critic/score/mean": 0.375, "actor/lr": 1e-6, "val-core/math/reward/mean@4": 0.5,
        "val-core/gsm8k/reward/mean@4": 0.75, "val-core/math/reward/mean@1": 0.0},
    4: {"critic/score/mean": 0.5, "actor/lr": 7.5e-7},
}
_KEYS = ["critic/score/mean", "actor/lr", "val-core/math/reward/mean@4",
         "val-core/gsm8k/reward/mean@4", "val-core/math/reward/mean@1"]


def _check_verl_names(db: Path, r: dict) -> None:
    rid = r["run_id"]
    assert _rows(db, rid, "reward_mean") == [
        (s, 16 * s, v["critic/score/mean"]) for s, v in _VERL_ROWS.items() if s]
    assert _rows(db, rid, "lr") == [(s, 16 * s, v["actor/lr"]) for s, v in _VERL_ROWS.items()
                                    if s]
    # the held-out score: the mean over sources of mean@N at the largest N
    assert _rows(db, rid, "eval_accuracy") == [(0, 0, 0.375), (3, 48, 0.625)]
    assert _run(db, rid) == (4, 4, 16, 1e-6, "completed")  # lr: the peak actor/lr logged
    assert r["params_from"]["lr"] == "log (peak actor/lr logged)"
    assert not [k for k in r["unmapped"] if k.startswith("val-core/")]


def test_verl_names_in_csv_and_jsonl_keep_eval_points_and_lr(tmp_path):
    """Before: every val-core point was lost and the run's lr stayed empty."""
    db = tmp_path / "s.db"
    csv = tmp_path / "verl.csv"
    csv.write_text(",".join(["step", *_KEYS]) + "\n" + "".join(
        ",".join([str(s), *(repr(v[k]) if k in v else "" for k in _KEYS)]) + "\n"
        for s, v in _VERL_ROWS.items()))
    jsonl = tmp_path / "verl.jsonl"
    jsonl.write_text("".join(json.dumps({"step": s, **v}) + "\n" for s, v in _VERL_ROWS.items()))
    for path in (csv, jsonl):
        (r,) = _ingest(db, str(path), "--sweep", path.suffix[1:], "--batch-prompts", "4",
                       "--group-size", "4")
        _check_verl_names(db, r)


# -- 6. verl's `file` logger, and --map into nested objects --------------------------------------


def test_verls_file_logger_rows_are_read(tmp_path):
    """verl's `file` logger writes `{"step": N, "data": {...}}`: before, refused."""
    db = tmp_path / "s.db"
    f = tmp_path / "file_logger.jsonl"
    f.write_text("".join(json.dumps({"step": s, "data": v}) + "\n" for s, v in _VERL_ROWS.items()))
    (r,) = _ingest(db, str(f), "--batch-prompts", "4", "--group-size", "4")
    assert r["format"] == "jsonl"
    _check_verl_names(db, r)


def test_map_reaches_nested_keys(tmp_path):
    db = tmp_path / "s.db"
    f = tmp_path / "nested.jsonl"
    f.write_text("".join(json.dumps({"it": s, "metrics": {"train": {"rew": s / 8}}}) + "\n"
                         for s in (1, 2, 3)))
    (r,) = _ingest(db, str(f), "--map", "step=it,reward_mean=metrics.train.rew",
                   "--batch-prompts", "2", "--group-size", "4")
    assert _rows(db, r["run_id"], "reward_mean") == [(1, 8, 0.125), (2, 16, 0.25),
                                                     (3, 24, 0.375)]
    assert r["sources"]["reward_mean"] == "metrics.train.rew"


# -- 7. a crashed verl log that starts with Ray's banner -----------------------------------------


def test_a_crashed_log_with_rays_banner_is_skipped_and_the_good_one_imported(tmp_path):
    """Before: taken for a CSV ("no step column"); --skip-bad aborted the whole command."""
    db = tmp_path / "s.db"
    crashed = tmp_path / "crashed.log"
    crashed.write_text(BANNER + "(TaskRunner pid=311) Traceback (most recent call last):\n"
                       "(TaskRunner pid=311)   File \"main.py\", line 1, in <module>\n"
                       "(TaskRunner pid=311) torch.OutOfMemoryError: CUDA out of memory, tried "
                       "to allocate 2.00 GiB\n")
    good = tmp_path / "good.log"
    reward = _prompt_counting_log(good, header=True)
    _ingest(db, str(good), "--sweep", "before")  # a store with a run in it
    before = _dump(db)
    proc = twoclocks_inproc("ingest", str(crashed), str(good), "--db", f"sqlite:///{db}")
    assert_one_line_error(proc, f"{crashed}: no `step:N - key:value` line",
                          "logged no training step")
    assert _dump(db) == before
    out = _ingest(db, str(crashed), str(good), "--skip-bad")
    assert [(o["path"], o["action"]) for o in out] == [(str(crashed), "skipped"),
                                                       (str(good), "created")]
    assert out[0]["format"] == "verl" and "logged no training step" in out[0]["notes"][0]
    assert _rows(db, out[1]["run_id"], "reward_mean") == [(s, 32 * s, v)
                                                          for s, v in reward.items()]


# -- 8. a verl log without its config (W&B's output.log) -----------------------------------------


def test_a_verl_log_without_config_or_critic_asks_for_the_group_size(tmp_path):
    """Before: n = 1 (verl's PPO default) with only a note, for a GRPO run's log."""
    db = tmp_path / "s.db"
    f = tmp_path / "output.log"
    reward = {s: s / 16 for s in range(1, 6)}
    f.write_text(BANNER + "".join(_step_line(s, {"critic/score/mean": v,
                                                 "critic/advantages/mean": 0.0,
                                                 "actor/pg_loss": -0.01})
                                  for s, v in reward.items()))
    _ingest(db, str(f), "--sweep", "before", "--batch-prompts", "4", "--group-size", "8")
    before = _dump(db)
    proc = twoclocks_inproc("ingest", str(f), "--batch-prompts", "4", "--db", f"sqlite:///{db}")
    assert_one_line_error(proc, f"{f}: samples are not logged", "pass --group-size",
                          "no verl config", "not PPO")
    assert _dump(db) == before
    (r,) = _ingest(db, str(f), "--batch-prompts", "4", "--group-size", "8")
    assert _rows(db, r["run_id"], "reward_mean") == [(s, 32 * s, v) for s, v in reward.items()]
    assert _run(db, r["run_id"])[:3] == (4, 8, 32)
    # a PPO log (a value model's critic/vf_loss) still gets verl's default n = 1
    ppo = tmp_path / "ppo.log"
    ppo.write_text("".join(_step_line(s, {"critic/score/mean": v, "critic/vf_loss": 0.5})
                           for s, v in reward.items()))
    (r,) = _ingest(db, str(ppo), "--batch-prompts", "4")
    assert r["group_size"] == 1 and _rows(db, r["run_id"], "reward_mean")[0] == (1, 4, 1 / 16)


# -- 9. a NaN in a W&B panel export --------------------------------------------------------------


def test_a_nan_cell_in_a_panel_export_is_not_a_downsampling(tmp_path):
    db = tmp_path / "s.db"
    f = tmp_path / "panel.csv"
    head = ["Step", "r - critic/score/mean", "r - critic/score/mean__MIN",
            "r - critic/score/mean__MAX"]
    values = {1: "0.125", 2: "NaN", 3: "0.375"}
    f.write_text(",".join(f'"{h}"' for h in head) + "\n"
                 + "".join(f"{s},{v},{v},{v}\n" for s, v in values.items()))
    (r,) = _ingest(db, str(f), "--batch-prompts", "2", "--group-size", "4")
    assert not any("downsampled" in n for n in r["notes"]), r["notes"]
    rows = _rows(db, r["run_id"], "reward_mean")
    assert [(s, n) for s, n, _ in rows] == [(1, 8), (2, 16), (3, 24)]
    assert [v for _, _, v in rows] == [0.125, None, 0.375]  # the store keeps NaN as NULL


# -- 10. preference and SFT logs, refused by their keys in every reader --------------------------


def _llama_factory_log(path: Path, dpo: bool) -> Path:
    """LLaMA-Factory's trainer_log.jsonl as its LogCallback writes it (a DPO run copies the
    trainer's rewards/accuracies into `accuracy`)."""
    lines = []
    for s in range(1, 4):
        row = {"current_steps": s * 10, "total_steps": 30, "loss": 0.69 - 0.1 * s,
               **({"accuracy": 0.5 + 0.1 * s} if dpo else {}), "lr": 5e-6, "epoch": 0.1 * s,
               "percentage": 33.33 * s, "elapsed_time": f"0:0{s}:00",
               "remaining_time": f"0:0{3 - s}:00"}
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_preference_and_sft_logs_are_refused_by_their_keys(tmp_path):
    """Before: a LLaMA-Factory DPO log imported with `--map step=current_steps` landed as an RL
    run with preference accuracy as `accuracy`; a verl SFT log got a generic refusal."""
    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    _prompt_counting_log(tmp_path / "good.log", header=True)
    _ingest(db, str(tmp_path / "good.log"))  # a store with a run in it
    before = _dump(db)
    dpo = _llama_factory_log(tmp_path / "trainer_log.jsonl", dpo=True)
    for args in ([], ["--map", "step=current_steps", "--batch-prompts", "2", "--group-size", "2"]):
        proc = twoclocks_inproc("ingest", str(dpo), *args, "--db", url)
        assert_one_line_error(proc, f"{dpo}: a LLaMA-Factory trainer_log.jsonl",
                              "preference accuracy", "nothing imported")
    (tmp_path / "sft").mkdir()
    sft = _llama_factory_log(tmp_path / "sft" / "trainer_log.jsonl", dpo=False)
    assert_one_line_error(twoclocks_inproc("ingest", str(sft), "--db", url),
                          "LLaMA-Factory trainer_log.jsonl", "no reward (SFT)")
    pref = tmp_path / "dpo.csv"
    pref.write_text("step,rewards/chosen,rewards/rejected,rewards/accuracies\n1,0.1,-0.1,0.6\n")
    assert_one_line_error(twoclocks_inproc("ingest", str(pref),
                                           "--map", "accuracy=rewards/accuracies", "--db", url),
                          "preference-training (DPO-style)")
    verl_sft = tmp_path / "sft.log"
    verl_sft.write_text("+ torchrun -m verl.trainer.fsdp_sft_trainer data.train_batch_size=64\n"
                        + "".join(f"step:{s} - train/loss:{2 - s / 10} - train/lr(1e-3):0.01\n"
                                  for s in range(1, 4)))
    assert_one_line_error(twoclocks_inproc("ingest", str(verl_sft), "--db", url),
                          f"{verl_sft}: an SFT log")
    assert _dump(db) == before


# -- analyze repeats what ingest doubted ---------------------------------------------------------


def test_analyze_repeats_the_resumed_run_caveat_ingest_printed(tmp_path):
    """Before: ingest said the first step was 101 (a resumed run); analyze said nothing."""
    db = tmp_path / "s.db"
    f = tmp_path / "resumed.log"
    f.write_text("+ python3 -m verl.trainer.main_ppo data.train_batch_size=4 "
                 "actor_rollout_ref.rollout.n=8 actor_rollout_ref.actor.optim.lr=1e-6\n"
                 + "".join(_step_line(s, {"critic/score/mean": (s - 100) / 16})
                           for s in range(101, 113)))
    (r,) = _ingest(db, str(f), "--sweep", "res")
    caveat = next(n for n in r["notes"] if "first training step is 101" in n)
    proc = twoclocks_inproc("analyze", "res", "--db", f"sqlite:///{db}", "--json")
    assert proc.returncode == 0, proc.stderr
    warnings = json.loads(proc.stdout)["warnings"]
    assert any(w.endswith(caveat) and w.startswith(f"run {r['run_id']} (") for w in warnings)


# -- 11. where the progress crossing is placed (docs/concepts.md says the same) ------------------


def test_the_crossing_lies_on_the_chord_of_the_logged_points_that_bracket_it(tmp_path):
    """The smoothed curve crosses 0.5 between steps 4 and 5 (its 5-point mean at step 5 is
    0.508); the logged points that bracket 0.5 are step 6 (0.49) and step 7 (0.9): the clock is
    where their chord meets 0.5, step 6 + 0.01 / 0.41, never before step 6."""
    db = tmp_path / "s.db"
    f = tmp_path / "c.csv"
    values = [0.1, 0.2, 0.3, 0.4, 0.45, 0.49, 0.9, 0.9, 0.9, 0.9]
    f.write_text("step,reward_mean\n" + "".join(f"{s},{v}\n" for s, v in enumerate(values, 1)))
    _ingest(db, str(f), "--batch-prompts", "4", "--group-size", "8", "--lr", "1e-3")
    proc = twoclocks_inproc("analyze", "imported", "--target", "0.5", "--db", f"sqlite:///{db}",
                            "--json")
    assert proc.returncode == 0, proc.stderr
    progress = json.loads(proc.stdout)["runs"][0]["progress"]
    step = 6 + 0.01 / 0.41
    assert progress["samples"] == pytest.approx(step * 32)
    assert progress["steps"] == pytest.approx(step)
    # a one-step spike at step 4 is a bracket too (3 -> 4), but the smoothed curve first reaches
    # 0.5 at step 7.875 (between smoothed points 7, 0.36, and 8, 0.52): the bracket nearest it is
    # steps 7 (0.3) and 8 (0.5), whose chord meets 0.5 at step 8
    values = [0.1, 0.1, 0.1, 0.6, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 0.9, 0.9]
    f.write_text("step,reward_mean\n" + "".join(f"{s},{v}\n" for s, v in enumerate(values, 1)))
    _ingest(db, str(f), "--sweep", "spike", "--batch-prompts", "4", "--group-size", "8",
            "--lr", "1e-3")
    proc = twoclocks_inproc("analyze", "spike", "--target", "0.5", "--db", f"sqlite:///{db}",
                            "--json")
    progress = json.loads(proc.stdout)["runs"][0]["progress"]
    assert progress["samples"] == pytest.approx(8 * 32)
