"""verl console logs imported faithfully: what a real log does to a parser, in fixtures of its
shape (Ray-prefixed, other processes interleaved into the config dict, ANSI colours, a value in
units of 1e-4, initial/final validation dicts, a rounded lr, a resumed run, a crash before the
first step, a last line cut mid-write). Expected values are read off the fixture by hand."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.support.cli import assert_one_line_error, twoclocks_inproc
from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.ingest import IngestOptions, parse_file

FIX = Path(__file__).parents[1] / "fixtures" / "ingest"


def _parse(name, **kw):
    return parse_file(FIX / name, IngestOptions(fmt="verl", **kw))


def test_the_config_dict_is_read_through_other_processes_lines():
    log = _parse("verl_ray_interleaved.log")
    # the dict's 'optim': {'lr': 1e-06} sits between two WorkerDict lines and a driver line
    assert log.params == {"batch_prompts": 64, "group_size": 4, "lr": 1e-6}
    assert log.params_from["lr"] == "log config (actor_rollout_ref.actor.optim.lr)"
    assert log.params_from["group_size"] == "log config (actor_rollout_ref.rollout.n)"


def test_initial_and_final_validation_dicts_are_the_first_and_last_eval_points():
    log = _parse("verl_ray_interleaved.log")
    evals = {s: v["eval_accuracy"] for s, v in log.steps.items() if "eval_accuracy" in v}
    assert evals == {0: pytest.approx(0.2109), 2: pytest.approx(0.31), 4: pytest.approx(0.41),
                     6: pytest.approx(0.5321)}
    assert log.duplicates == 0


def test_scaled_keys_and_the_kl_in_the_reward():
    log = _parse("verl_ray_interleaved.log")
    s3 = log.steps[3]
    assert s3["lr"] == pytest.approx(0.010 * 1e-4)  # actor/lr(1e-4):0.010
    assert s3["kl_init"] == pytest.approx(0.003)  # critic/kl
    assert s3["clip_frac"] == 0.0  # a clip fraction of 0.000 is a value, kept
    assert log.sources["kl_init"] == "critic/kl"


def test_a_last_line_cut_mid_write_is_left_out_with_a_note():
    log = _parse("verl_ray_interleaved.log")
    assert max(log.steps) == 6 and 7 not in log.steps  # step 7 was cut mid-number
    assert any("ends mid-line" in n and "line 22" in n for n in log.notes)


def test_rounded_lr_is_not_data_and_a_resumed_log_says_so():
    log = _parse("verl_resumed_rounded.log")
    assert sorted(log.steps) == [101, 102, 103, 104, 105]
    assert all("lr" not in v for v in log.steps.values())  # actor/lr:0.000 x 5
    # the command line's lr and prompts; an old PPO log states no rollout.n: verl's n = 1
    assert log.params == {"batch_prompts": 16, "lr": 5e-7, "group_size": 1}
    assert log.params_from["group_size"] == "verl default (rollout.n not in the log)"
    assert any("verl's default n = 1" in n for n in log.notes)
    assert any("0.000 at 5 step(s)" in n for n in log.notes)
    assert any("first training step is 101" in n for n in log.notes)
    # test_score/<source> without the val/ prefix is the held-out score
    assert log.steps[103]["eval_accuracy"] == pytest.approx(0.43)


def test_a_crashed_log_says_it_has_no_step_and_skip_bad_skips_only_it(tmp_path):
    with pytest.raises(ConfigError, match="no `step:N - key:value` line"):
        _parse("verl_crashed.log")
    url = f"sqlite:///{tmp_path / 's.db'}"
    proc = twoclocks_inproc("ingest", str(FIX / "verl_crashed.log"), str(FIX / "verl_new.log"),
                            "-f", "verl", "--db", url)
    assert_one_line_error(proc, "verl_crashed.log: no `step:N - key:value` line")
    assert not (tmp_path / "s.db").exists() or _runs(tmp_path / "s.db") == 0  # nothing written
    proc = twoclocks_inproc("ingest", str(FIX / "verl_crashed.log"), str(FIX / "verl_new.log"),
                            "-f", "verl", "--db", url, "--skip-bad", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert [r["action"] for r in out] == ["skipped", "created"]
    assert out[0]["run_id"] is None and "crash before its first step" in out[0]["notes"][0]
    assert _runs(tmp_path / "s.db") == 1


def test_the_notes_reach_the_cli(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    proc = twoclocks_inproc("ingest", str(FIX / "verl_ray_interleaved.log"), "-f", "verl",
                            "--db", url)
    assert proc.returncode == 0, proc.stderr
    assert "note: the file ends mid-line" in proc.stdout
    assert "lr 1e-06" in proc.stdout
    proc = twoclocks_inproc("ingest", str(FIX / "verl_new.log"), "-f", "verl", "--db", url,
                            "--sweep", "nolr", "--json")
    out = json.loads(proc.stdout)
    assert not any("lr was not found" in n for n in out[0]["notes"])  # the config has it
    bare = tmp_path / "bare.log"
    bare.write_text("step:1 - critic/score/mean:0.25\nstep:2 - critic/score/mean:0.5\n")
    proc = twoclocks_inproc("ingest", str(bare), "-f", "verl", "--db", url, "--sweep", "bare",
                            "--batch-prompts", "4", "--group-size", "2")
    assert proc.returncode == 0, proc.stderr
    assert "note: the run's lr was not found in the log (pass --lr)" in proc.stdout


def _runs(db: Path) -> int:
    with sqlite3.connect(db) as con:
        tables = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
        return con.execute("select count(*) from runs").fetchone()[0] if "runs" in tables else 0


# -- TRL and generic tables ------------------------------------------------------------------


def test_dpo_and_sft_trainer_states_are_not_rl_runs(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    for folder, needle in (("trl_dpo", "a preference-training (DPO-style)"),
                           ("trl_sft", "no reward was logged")):
        proc = twoclocks_inproc("ingest", str(FIX / folder), "-f", "trl", "--db", url,
                                "--batch-prompts", "4", "--group-size", "2")
        assert_one_line_error(proc, f"{folder}/trainer_state.json: ", needle)
    assert _runs(tmp_path / "s.db") == 0


def test_trl_says_its_lr_is_the_peak_and_where_the_batch_size_is():
    with pytest.raises(ConfigError, match=r"train_batch_size \(8\) counts completions per device"):
        from twoclocks_cli.ingest.importer import _resolve

        opts = IngestOptions(fmt="trl")
        _resolve(parse_file(FIX / "trl_new", opts), opts)
    log = parse_file(FIX / "trl_new", IngestOptions(fmt="trl"))
    assert any("peak learning_rate logged" in n and "pass --lr" in n for n in log.notes)


def test_jsonl_config_and_summary_lines_are_not_steps_and_the_config_is_read():
    log = parse_file(FIX / "table_cfg_summary.jsonl", IngestOptions(fmt="jsonl"))
    assert sorted(log.steps) == [1, 2, 3, 4, 5]  # step 6 was cut mid-write
    assert log.steps[3]["reward_mean"] == pytest.approx(0.3)
    assert log.params == {"batch_prompts": 32, "group_size": 8, "lr": 1e-6, "seed": 3}
    assert log.params_from["lr"] == "log line 1 (config.optim.lr)"
    assert any("2 line(s) without 'step'" in n for n in log.notes)
    assert any("ends mid-line (line 8" in n for n in log.notes)
    assert log.bad_lines == []


def test_a_csv_cut_mid_number_never_stores_the_prefix(tmp_path):
    f = tmp_path / "cut.csv"
    f.write_text("step,samples,reward_mean\n1,64,0.912\n2,128,0.934\n3,192,0.9")  # 0.957 cut
    log = parse_file(f, IngestOptions(fmt="csv"))
    assert sorted(log.steps) == [1, 2] and log.steps[2]["reward_mean"] == pytest.approx(0.934)
    assert any("ends mid-line (line 4" in n for n in log.notes)


def test_grpo_without_rollout_n_still_asks_for_the_group_size(tmp_path):
    f = tmp_path / "grpo.log"
    f.write_text("+ python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo "
                 "data.train_batch_size=16\nstep:1 - critic/score/mean:0.2\n")
    log = parse_file(f, IngestOptions(fmt="verl"))
    assert "group_size" not in log.params  # GRPO needs n > 1: never defaulted to 1
    proc = twoclocks_inproc("ingest", str(f), "-f", "verl",
                            "--db", f"sqlite:///{tmp_path / 's.db'}")
    assert_one_line_error(proc, "pass --group-size")


def test_old_verl_first_update_at_step_0_shifts_the_samples(tmp_path):
    f = tmp_path / "old.log"
    f.write_text("+ python3 -m verl.trainer.main_ppo data.train_batch_size=4 "
                 "actor_rollout_ref.rollout.n=2\n"
                 + "".join(f"step:{s} - critic/score/mean:{0.1 * s:.1f}\n" for s in range(3)))
    url = f"sqlite:///{tmp_path / 's.db'}"
    proc = twoclocks_inproc("ingest", str(f), "-f", "verl", "--db", url, "--json")
    assert proc.returncode == 0, proc.stderr
    assert any("first update is logged as step 0" in n for n in json.loads(proc.stdout)[0]["notes"])
    with sqlite3.connect(tmp_path / "s.db") as con:
        rows = con.execute("select step, samples from metrics order by step").fetchall()
    assert rows == [(0, 8), (1, 16), (2, 24)]  # (step + 1) x 4 prompts x 2


@pytest.mark.parametrize("args, needle", [
    (["--lr", "inf"], "--lr inf: must be a finite number"),
    (["--lr", "-1e-3"], "--lr -0.001: must be a finite number > 0"),
    (["--sweep", ""], "--sweep '': a sweep name"),
    (["--sweep", "a b"], "--sweep 'a b': a sweep name"),
    (["--group-size", "0"], "--group-size 0: must be a whole number from 1 to 2,147,483,647"),
    (["--seed", "-2"], "--seed -2: must be a whole number from 0 to 2,147,483,647"),
])
def test_bad_ingest_options_are_one_line_and_write_nothing(tmp_path, args, needle):
    db = tmp_path / "s.db"
    proc = twoclocks_inproc("ingest", str(FIX / "verl_new.log"), "-f", "verl",
                            "--db", f"sqlite:///{db}", *args)
    assert_one_line_error(proc, needle)
    assert not db.exists() or _runs(db) == 0


def _verl_with_counts(tmp_path, counts, steps=None):
    """A GRPO verl log (4 prompts x n=2 = 8 per step) whose steps log rollout/total_num_samples."""
    f = tmp_path / "dapo.log"
    steps = steps or list(range(1, len(counts) + 1))
    f.write_text(
        "+ python3 -m recipe.dapo.main_dapo algorithm.adv_estimator=grpo data.train_batch_size=4 "
        "actor_rollout_ref.rollout.n=2\n"
        + "".join(f"(TaskRunner pid=311) step:{s} - critic/score/mean:{0.1 * s:.1f} - "
                  f"rollout/total_num_samples:{c} - train/num_gen_batches:2\n"
                  for s, c in zip(steps, counts, strict=True)))
    return f


def test_the_logs_own_running_sample_count_wins(tmp_path):
    # dynamic sampling: 12, 10, 14 samples consumed at steps 1-3 (not 8 = 4 prompts x n 2)
    log = parse_file(_verl_with_counts(tmp_path, [12, 22, 36]), IngestOptions(fmt="verl"))
    assert log.samples == {1: 12, 2: 22, 3: 36}
    assert log.sources["samples"] == "rollout/total_num_samples"
    assert "rollout/total_num_samples" not in log.unmapped
    assert any("a running total" in n for n in log.notes)
    url = f"sqlite:///{tmp_path / 's.db'}"
    proc = twoclocks_inproc("ingest", str(tmp_path / "dapo.log"), "-f", "verl", "--db", url)
    assert proc.returncode == 0, proc.stderr
    with sqlite3.connect(tmp_path / "s.db") as con:
        rows = con.execute("select distinct step, samples from metrics order by step").fetchall()
    assert rows == [(1, 12), (2, 22), (3, 36)]


def test_per_step_sample_counts_are_summed(tmp_path):
    # per step 12, 10, 10, 14: not increasing by half a batch a step -> a per-step count
    log = parse_file(_verl_with_counts(tmp_path, [12, 10, 10, 14]), IngestOptions(fmt="verl"))
    assert log.samples == {1: 12, 2: 22, 3: 32, 4: 46}
    assert any("per-step counts, summed" in n for n in log.notes)
    # an unchanging per-step count (no group filtered) is not a running total either
    log = parse_file(_verl_with_counts(tmp_path, [8, 8, 8]), IngestOptions(fmt="verl"))
    assert log.samples == {1: 8, 2: 16, 3: 24}


def test_trl_step_time_and_token_count_are_mapped(tmp_path):
    state = {"global_step": 2, "log_history": [
        {"step": s, "reward": 0.1 * s, "learning_rate": 1e-6, "step_time": 3.5 + s,
         "num_tokens": 2048.0 * s, "epoch": 0.01 * s} for s in (1, 2)]}
    f = tmp_path / "trainer_state.json"
    f.write_text(json.dumps(state, indent=1))
    log = parse_file(f, IngestOptions(fmt="trl"))
    assert log.steps[2]["time_step_s"] == 5.5 and log.steps[2]["num_tokens"] == 4096.0
    assert log.sources["time_step_s"] == "step_time" and log.sources["num_tokens"] == "num_tokens"
    assert not ({"step_time", "num_tokens"} & log.unmapped)
