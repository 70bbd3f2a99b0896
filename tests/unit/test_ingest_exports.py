"""CSV and JSON Lines logs in the shapes their writers give them: a W&B run's history exported
with pandas (`run.history()` then `to_csv` / `to_json(orient="records", lines=True)`, NaN cells
and all) of a TRL and of a verl run, JSON Lines whose config gives numbers as strings, and
LLaMA-Factory's `trainer_log.jsonl`. Each is imported through the CLI (in this process) into a
SQLite file, and every stored value is read back with sqlite3 and compared with what the test
wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.support.cli import assert_one_line_error, twoclocks_inproc
from tests.support.stored import dump, sql
from twoclocks_cli.ingest import mapping

P, G = 16, 8  # prompts per step and group size, given as options (a history export has none)
BATCH = P * G
T0 = 1_700_000_000.0


def _db(tmp_path: Path) -> tuple[Path, str]:
    db = tmp_path / "s.db"
    return db, f"sqlite:///{db}"


def _series(db: Path, run_id: int, key: str) -> dict[int, tuple[int, float]]:
    """step -> (samples, value) of one stored metric."""
    rows = sql(db, "select step, samples, value from metrics where run_id=? and key=?",
                run_id, key)
    return {step: (samples, value) for step, samples, value in rows}


def _ingest(url: str, path: Path, *options: str) -> dict:
    r = twoclocks_inproc("ingest", str(path), "--db", url, "--json", *options)
    assert r.returncode == 0, r.stderr
    (out,) = json.loads(r.stdout)
    return out


def _write(frame: pd.DataFrame, tmp_path: Path, how: str) -> Path:
    """The history as its user saves it: `to_csv` (with or without pandas' index column) or
    `to_json` as JSON Lines."""
    if how == "jsonl":
        path = tmp_path / "history.jsonl"
        frame.to_json(path, orient="records", lines=True)
    else:
        path = tmp_path / "history.csv"
        frame.to_csv(path, index=how == "csv+index")
    return path


# -- a TRL run's W&B history ------------------------------------------------------------------

LOG_EVERY, LAST, EVAL_EVERY = 2, 40, 10


def _trl_history(names: str) -> tuple[pd.DataFrame, dict]:
    """A TRL GRPO run's history as W&B's `run.history()` returns it, and the truth per global
    step. HF's WandbCallback logs each entry with a `train/` (or `eval/`) prefix and
    `train/global_step`; TRL logs its completions table in a call of its own, and evaluations
    are calls too, so W&B's `_step` counts more rows than the trainer's steps. `names`: TRL's
    newer (`rewards/<fn>/mean`, `completions/mean_length`) or older key names."""
    rows, truth, step = [], {}, 0
    fn = "train/rewards/accuracy_reward" + ("/mean" if names == "new" else "")
    length = "train/completions/mean_length" if names == "new" else "train/completion_length"
    for gs in range(LOG_EVERY, LAST + 1, LOG_EVERY):
        t = {"reward": round(0.1 + 0.02 * gs, 6), "accuracy": round(0.01 * gs, 6),
             "lr": round(2e-6 * min(1.0, gs / 10), 12), "loss": round(0.001 * (gs % 7), 6),
             "kl": round(1e-4 * gs, 8), "length": round(120 + 3.25 * gs, 4),
             "grad_norm": round(0.5 + 0.01 * gs, 6)}
        truth[gs] = t
        at = T0 + 3.5 * gs
        rows.append({"train/loss": t["loss"], "train/grad_norm": t["grad_norm"],
                     "train/learning_rate": t["lr"], length: t["length"], fn: t["accuracy"],
                     "train/reward": t["reward"], "train/reward_std": 0.25, "train/kl": t["kl"],
                     "train/epoch": gs / LAST, "train/global_step": gs,
                     "_step": step, "_runtime": at - T0, "_timestamp": at})
        rows.append({"completions": {"_type": "table-file", "ncols": 4, "nrows": 8,
                                     "path": f"media/table/completions_{step + 1}.table.json"},
                     "_step": step + 1, "_runtime": at - T0 + 0.2, "_timestamp": at + 0.2})
        step += 2
        if gs % EVAL_EVERY == 0:
            t["eval_accuracy"] = round(0.009 * gs, 6)
            rows.append({"eval/loss": 0.0, "eval/reward": round(0.012 * gs, 6),
                         "eval/rewards/accuracy_reward/mean": t["eval_accuracy"],
                         "eval/runtime": 12.5, "train/epoch": gs / LAST,
                         "train/global_step": gs, "_step": step, "_runtime": at - T0 + 13,
                         "_timestamp": at + 13})
            step += 1
    # the end of training: HF's summary values go to the run summary, the rest is one row
    rows.append({"train/epoch": 1.0, "train/global_step": LAST, "_step": step,
                 "_runtime": 3.5 * LAST + 20, "_timestamp": T0 + 3.5 * LAST + 20})
    return pd.DataFrame(rows), truth


@pytest.mark.parametrize("how", ["csv", "jsonl", "csv+index"])
@pytest.mark.parametrize("names", ["new", "old"])
def test_a_trl_runs_wandb_history_imports_on_its_own_global_step(tmp_path, how, names):
    """Before: refused as "an SFT log (train/loss and no reward)"; without train/loss, the
    steps were W&B's `_step` (about twice the global step here)."""
    frame, truth = _trl_history(names)
    path = _write(frame, tmp_path, how)
    db, url = _db(tmp_path)
    out = _ingest(url, path, "--batch-prompts", str(P), "--group-size", str(G))
    assert out["format"] == ("jsonl" if how == "jsonl" else "csv")
    assert out["sources"]["step"] == "train/global_step"
    assert out["sources"]["reward_mean"] == "train/reward"
    assert out["sources"]["eval_accuracy"] == "eval/rewards/accuracy_reward/mean"
    assert out["steps"] == len(truth) and out["skipped_lines"] == []
    rid = out["run_id"]
    for key, name in [("reward_mean", "reward"), ("accuracy", "accuracy"), ("lr", "lr"),
                      ("loss", "loss"), ("kl_init", "kl"), ("resp_len_mean", "length"),
                      ("grad_norm", "grad_norm"), ("eval_accuracy", "eval_accuracy")]:
        want = {gs: (gs * BATCH, t[name]) for gs, t in truth.items() if name in t}
        assert _series(db, rid, key) == want, key
    # the run's lr is the peak logged (the export keeps no config), said in a note; no seed
    assert sql(db, "select batch_prompts, group_size, batch_samples, lr, seed from runs "
                    "where id=?", rid) == [(P, G, BATCH, 2e-6, None)]
    assert any("peak train/learning_rate logged" in n for n in out["notes"])
    completions = len(truth)  # one completions-table row per logged step
    assert any(n.startswith(f"{completions} row(s) with no 'train/global_step'")
               for n in out["notes"]), out["notes"]
    assert {"_step", "_runtime", "_timestamp", "train/epoch"} <= set(out["unmapped"])


def test_without_train_loss_the_steps_are_still_the_global_steps(tmp_path):
    """Before: `_step` was the step (0, 2, 5, ... here), the sample axis off by its ratio."""
    frame, truth = _trl_history("new")
    path = _write(frame.drop(columns=["train/loss"]), tmp_path, "jsonl")
    db, url = _db(tmp_path)
    out = _ingest(url, path, "--batch-prompts", str(P), "--group-size", str(G))
    assert _series(db, out["run_id"], "reward_mean") == {gs: (gs * BATCH, t["reward"])
                                                         for gs, t in truth.items()}


def test_the_same_export_with_a_full_map_is_read_as_mapped(tmp_path):
    """Before: `--map` did not help; the guard saw `train/loss` and no reward name."""
    frame, truth = _trl_history("new")
    path = _write(frame, tmp_path, "csv")
    db, url = _db(tmp_path)
    out = _ingest(url, path, "--batch-prompts", str(P), "--group-size", str(G), "--lr", "3e-6",
                  "--seed", "7", "--map", "step=train/global_step,reward_mean=train/reward,"
                  "accuracy=train/rewards/accuracy_reward/mean,lr=train/learning_rate")
    rid = out["run_id"]
    assert _series(db, rid, "reward_mean") == {gs: (gs * BATCH, t["reward"])
                                               for gs, t in truth.items()}
    assert sql(db, "select lr, seed from runs where id=?", rid) == [(3e-6, 7)]


def _sft_history() -> pd.DataFrame:
    """A TRL SFTTrainer run's W&B history: train/loss, no reward."""
    return pd.DataFrame([
        {"train/loss": round(2.0 - 0.1 * i, 6), "train/grad_norm": 1.5,
         "train/learning_rate": 2e-5, "train/mean_token_accuracy": round(0.4 + 0.01 * i, 6),
         "train/num_tokens": 4096.0 * i, "train/epoch": i / 10, "train/global_step": i,
         "_step": i - 1, "_runtime": 2.0 * i, "_timestamp": T0 + 2.0 * i}
        for i in range(1, 11)])


@pytest.mark.parametrize("how", ["csv", "jsonl"])
def test_an_sft_or_dpo_export_is_still_refused_in_one_line(tmp_path, how):
    db, url = _db(tmp_path)
    rl = _write(_trl_history("new")[0], _fresh(tmp_path, "rl"), how)
    _ingest(url, rl, "--batch-prompts", str(P), "--group-size", str(G))  # a store with a run
    before = dump(db)
    sft = _write(_sft_history(), tmp_path, how)
    r = twoclocks_inproc("ingest", str(sft), "--db", url, "--batch-prompts", "4",
                         "--group-size", "2")
    assert_one_line_error(r, str(sft), "an SFT log (train/loss and no reward", "nothing imported")
    assert dump(db) == before
    dpo = _sft_history().rename(columns={"train/mean_token_accuracy": "train/rewards/accuracies"})
    dpo["train/rewards/chosen"], dpo["train/rewards/margins"] = 0.5, 0.2
    path = _write(dpo, _fresh(tmp_path), how)
    r = twoclocks_inproc("ingest", str(path), "--db", url, "--batch-prompts", "4",
                         "--group-size", "2")
    assert_one_line_error(r, "a preference-training (DPO-style) log", "nothing imported")
    assert dump(db) == before


def test_a_reward_named_by_map_makes_a_train_loss_log_rl(tmp_path):
    """A logger of its own (`train/loss` and a reward under a name no trainer uses): refused as
    SFT without a map, imported with `--map reward_mean=...`; a DPO export stays refused."""
    frame = _sft_history().drop(columns=["train/mean_token_accuracy"])
    frame["train/score"] = [round(0.05 * i, 6) for i in range(1, 11)]
    path = _write(frame, tmp_path, "csv")
    db, url = _db(tmp_path)
    r = twoclocks_inproc("ingest", str(path), "--db", url, "--batch-prompts", "4",
                         "--group-size", "2")
    assert_one_line_error(r, "an SFT log (train/loss and no reward")
    out = _ingest(url, path, "--batch-prompts", "4", "--group-size", "2",
                  "--map", "reward_mean=train/score")
    assert _series(db, out["run_id"], "reward_mean") == {i: (8 * i, round(0.05 * i, 6))
                                                         for i in range(1, 11)}
    before = dump(db)
    dpo = _sft_history().rename(columns={"train/mean_token_accuracy": "train/rewards/chosen"})
    dpo_path = _write(dpo, _fresh(tmp_path), "csv")
    r = twoclocks_inproc("ingest", str(dpo_path), "--db", url, "--batch-prompts", "4",
                         "--group-size", "2", "--map", "reward_mean=train/rewards/chosen")
    assert_one_line_error(r, "a preference-training (DPO-style) log")
    assert dump(db) == before


def _fresh(tmp_path: Path, name: str = "other") -> Path:
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    return folder


def test_the_guard_judges_names_as_mapped():
    assert mapping.not_rl(["train/loss", "train/reward", "train/global_step"]) is None
    assert mapping.not_rl(["train/loss", "train/rewards/acc/mean"]) is None
    assert "an SFT log" in mapping.not_rl(["train/loss", "train/learning_rate"])
    assert "preference" in mapping.not_rl(["train/loss", "train/rewards/chosen"])
    # a reward named by --map answers train/loss, never a preference trainer's keys
    assert mapping.not_rl(["train/loss", "score"], mapped=["reward_mean"]) is None
    assert "an SFT log" in mapping.not_rl(["train/loss", "score"], mapped=["loss"])
    assert "preference" in mapping.not_rl(["rewards/chosen"], mapped=["reward_mean"])
    assert mapping.console_name("eval/rewards/acc/mean") == "eval_rewards/acc/mean"
    assert mapping.console_name("training/global_step") == "training/global_step"


# -- a verl run's W&B history (stays as it was: verl logs at its global step) ------------------


def test_a_verl_runs_wandb_history_keeps_its_step(tmp_path):
    """verl logs every row at its global step, so `_step` is that step; its validation before
    training is step 0 (without training/global_step)."""
    rows, truth = [], {}
    rows.append({"val-core/gsm8k/reward/mean@1": 0.05, "_step": 0, "_runtime": 30.0,
                 "_timestamp": T0 + 30})
    truth[0] = {"eval_accuracy": 0.05}
    for s in range(1, 21):
        t = {"reward_mean": round(0.2 + 0.01 * s, 6), "lr": 1e-6,
             "entropy": round(0.9 - 0.01 * s, 6)}
        row = {"actor/entropy": t["entropy"], "actor/lr": 1e-6, "actor/pg_loss": 0.01,
               "critic/score/mean": t["reward_mean"], "response_length/mean": 200.0,
               "training/global_step": s, "training/epoch": 0}
        if s % 5 == 0:
            t["eval_accuracy"] = round(0.05 + 0.02 * s, 6)
            row["val-core/gsm8k/reward/mean@1"] = t["eval_accuracy"]
        truth[s] = t
        rows.append({**row, "_step": s, "_runtime": 30.0 + 10 * s, "_timestamp": T0 + 30 + 10 * s})
    db, url = _db(tmp_path)
    for how in ("csv", "jsonl"):
        path = _write(pd.DataFrame(rows), tmp_path, how)
        out = _ingest(url, path, "--batch-prompts", str(P), "--group-size", str(G))
        assert out["sources"]["step"] == "_step" and out["skipped_lines"] == []
        for key in ("reward_mean", "entropy", "eval_accuracy", "lr"):
            want = {s: (s * BATCH, t[key]) for s, t in truth.items() if key in t}
            assert _series(db, out["run_id"], key) == want, (how, key)


# -- JSON Lines whose config gives numbers as strings -----------------------------------------


def _config_log(tmp_path: Path, config: dict, name: str = "run.jsonl") -> Path:
    """A config object first (as many loggers write it), then one object per step."""
    lines = [json.dumps({"cfg": config})]
    lines += [json.dumps({"step": s, "reward": round(0.1 * s, 6),
                          "lr": 1.95e-06 if s > 1 else 1e-06}) for s in (1, 2, 3)]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_config_numbers_given_as_strings_are_read(tmp_path):
    """Before: the run got the peak logged lr 1.95e-06 and no seed, with a note that the file
    states no lr."""
    db, url = _db(tmp_path)
    path = _config_log(tmp_path, {"lr": "2e-06", "seed": "3", "prompts_per_batch": "16",
                                  "group_size": " 8 "})
    out = _ingest(url, path)
    assert (out["lr"], out["seed"], out["batch_prompts"], out["group_size"]) == (2e-6, 3, 16, 8)
    assert sql(db, "select lr, seed, batch_samples from runs where id=?",
                out["run_id"]) == [(2e-6, 3, 128)]
    assert out["params_from"]["lr"] == "log line 1 (cfg.lr)"
    assert not any("lr" in n and "peak" in n for n in out["notes"]), out["notes"]
    assert not any(k.startswith("cfg.") for k in out["unmapped"])  # read as the run's settings
    assert _series(db, out["run_id"], "reward_mean") == {1: (128, 0.1), 2: (256, 0.2),
                                                         3: (384, 0.3)}


def test_a_config_number_that_is_no_number_is_said(tmp_path):
    """`"lr": "auto"`: the run's lr is the peak logged, and the note says the file's lr is
    'auto'; a batch size that is no number stops the import in one line naming it."""
    db, url = _db(tmp_path)
    path = _config_log(tmp_path, {"lr": "auto", "seed": "3", "prompts_per_batch": "16",
                                  "group_size": "8"})
    out = _ingest(url, path)
    assert (out["lr"], out["seed"]) == (1.95e-06, 3)
    assert any("the file's lr is 'auto' at log line 1 (cfg.lr), not a number" in n
               for n in out["notes"]), out["notes"]
    assert not any("states no configured lr" in n for n in out["notes"])
    before = dump(db)
    bad = _config_log(tmp_path, {"lr": "2e-06", "prompts_per_batch": "sixteen",
                                 "group_size": "8"}, "bad.jsonl")
    r = twoclocks_inproc("ingest", str(bad), "--db", url)
    assert_one_line_error(r, str(bad), "batch_prompts is 'sixteen' at log line 1 "
                          "(cfg.prompts_per_batch), not a number")
    assert dump(db) == before
    seedless = _config_log(tmp_path, {"lr": "2e-06", "seed": "n/a", "prompts_per_batch": 16,
                                      "group_size": 8}, "seedless.jsonl")
    out = _ingest(url, seedless)
    assert out["seed"] is None and out["lr"] == 2e-6
    assert "seed is 'n/a' at log line 1 (cfg.seed), not a number: not read" in out["notes"]


# -- LLaMA-Factory's trainer_log.jsonl --------------------------------------------------------


def _llama_factory_log(tmp_path: Path, lr_key: str, reward: bool = True) -> tuple[Path, dict]:
    """trainer_log.jsonl as LLaMA-Factory's LogCallback writes it: one json.dumps per log call,
    its keys in its order, None values left out."""
    total, truth, lines = 12, {}, []
    for step in range(1, total + 1):
        t = {"loss": round(0.05 - 0.001 * step, 6), "lr": round(1e-6 * (1 - step / 24), 12)}
        if reward:
            t["reward"] = round(0.3 + 0.025 * step, 6)
        truth[step] = t
        entry = {"current_steps": step, "total_steps": total, "loss": t["loss"],
                 "reward": t.get("reward"), lr_key: t["lr"], "epoch": round(step / total, 2),
                 "percentage": round(step / total * 100, 2),
                 "elapsed_time": f"0:00:{step * 4:02d}",
                 "remaining_time": f"0:00:{(total - step) * 4:02d}"}
        lines.append(json.dumps({k: v for k, v in entry.items() if v is not None}))
    path = tmp_path / lr_key / "trainer_log.jsonl"
    path.parent.mkdir(exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path, truth


@pytest.mark.parametrize("lr_key", ["lr", "learning_rate"])
def test_a_llama_factory_ppo_log_imports_without_a_map(tmp_path, lr_key):
    """Before: no step column; `--map step=current_steps` was needed."""
    db, url = _db(tmp_path)
    path, truth = _llama_factory_log(tmp_path, lr_key)
    out = _ingest(url, path, "--batch-prompts", "4", "--group-size", "4")
    assert out["sources"]["step"] == "current_steps" and out["steps"] == len(truth)
    for key, name in (("reward_mean", "reward"), ("loss", "loss"), ("lr", "lr")):
        assert _series(db, out["run_id"], key) == {s: (s * 16, t[name])
                                                   for s, t in truth.items()}, key
    assert out["lr"] == max(t["lr"] for t in truth.values())
    sft, _ = _llama_factory_log(_fresh(tmp_path), lr_key, reward=False)
    before = dump(db)
    r = twoclocks_inproc("ingest", str(sft), "--db", url, "--batch-prompts", "4",
                         "--group-size", "4")
    assert_one_line_error(r, "a LLaMA-Factory trainer_log.jsonl without a reward")
    assert dump(db) == before
