"""Parsers of foreign logs: TRL and verl in old and new key names, CSV and JSONL tables."""

import math
from pathlib import Path

import pytest

from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.ingest import IngestOptions, parse_file, parse_map

FIX = Path(__file__).parents[1] / "fixtures" / "ingest"


def _opts(fmt, **kw):
    return IngestOptions(fmt=fmt, **kw)


def test_trl_old_key_names():
    log = parse_file(FIX / "trl_old", _opts("trl"))  # a checkpoint folder works too
    assert sorted(log.steps) == list(range(1, 31))
    s10 = log.steps[10]
    assert s10["accuracy"] == pytest.approx(s10["reward_mean"] - 0.9, abs=1e-9)
    assert s10["resp_len_mean"] == 45.0 and s10["kl_init"] == pytest.approx(0.005)
    assert "eval_accuracy" in s10 and "eval_accuracy" not in log.steps[9]
    assert log.sources["accuracy"] == "rewards/accuracy_reward"
    assert log.sources["eval_accuracy"] == "eval_rewards/accuracy_reward"
    assert log.params == {"lr": 1e-06} and "peak" in log.params_from["lr"]
    assert "rewards/format_reward" in log.unmapped and log.bad_lines == []
    # the Trainer's summary entry: the whole run's seconds, at its last step
    assert log.steps[30]["time_total_s"] == 812.3 and log.sources["time_total_s"] == "train_runtime"


def test_trl_new_key_names_and_nonfinite():
    log = parse_file(FIX / "trl_new" / "trainer_state.json", _opts("trl"))
    s = log.steps[20]
    assert log.sources["accuracy"] == "rewards/correctness_reward/mean"
    assert log.sources["resp_len_mean"] == "completions/mean_length"
    assert log.sources["clip_frac"] == "clip_ratio/region_mean"
    assert s["clip_frac_low"] == pytest.approx(0.01) and s["clip_frac_high"] == pytest.approx(0.02)
    assert s["entropy"] == pytest.approx(0.7) and s["zero_std_frac"] == 0.25
    assert s["truncated_frac"] == 0.02 and "eval_accuracy" in s
    assert math.isnan(log.steps[37]["loss"]) and log.steps[37]["nonfinite"] == 1.0
    assert "nonfinite" not in log.steps[36]


def test_verl_old_names_and_command_line_header():
    log = parse_file(FIX / "verl_old.log", _opts("verl"))
    assert log.params == {"batch_prompts": 32, "group_size": 8, "lr": 1e-6}
    assert all("command line" in v for v in log.params_from.values())
    assert log.steps[0] == {"eval_accuracy": 0.11}
    s = log.steps[10]
    assert {"reward_mean", "entropy", "clip_frac", "approx_kl", "time_gen_s", "time_update_s",
            "eval_accuracy", "resp_len_mean", "truncated_frac", "grad_norm", "lr"} <= set(s)
    assert log.sources["entropy"] == "actor/entropy_loss"
    assert log.sources["time_gen_s"] == "timing/gen"
    assert len(log.steps) == 31 and log.bad_lines == []


def test_verl_new_names_config_dict_numpy_values_and_tqdm_prefix():
    log = parse_file(FIX / "verl_new.log", _opts("verl"))
    assert log.params == {"batch_prompts": 128, "group_size": 8, "lr": 2e-6}
    assert all("log config" in v for v in log.params_from.values())
    assert log.steps[0]["eval_accuracy"] == pytest.approx((0.12 + 0.05) / 2)  # mean of sources
    assert 3 in log.steps and "reward_mean" in log.steps[3]  # line behind a tqdm bar
    s = log.steps[10]
    assert log.sources["time_gen_s"] == "timing_s/gen" and log.sources["entropy"] == "actor/entropy"
    assert s["entropy"] == pytest.approx(0.56) and s["kl_init"] == pytest.approx(0.007)
    assert s["tokens_per_s"] == 1234.5 and "time_reward_s" in s
    assert "training/global_step" in log.unmapped


def test_csv_with_column_map_and_missing_cells():
    log = parse_file(FIX / "table.csv", _opts("csv", column_map=parse_map(
        ["reward_mean=rew", "accuracy=acc"])))
    assert log.samples[24] == 24 * 256 and sorted(log.steps) == list(range(25))
    assert "accuracy" in log.steps[5] and "accuracy" not in log.steps[6]  # empty cell = missing
    assert log.sources["entropy"] == "actor/entropy"  # a verl name is recognised in a table
    assert log.unmapped == {"notes"}


def test_jsonl_store_names():
    log = parse_file(FIX / "table.jsonl", _opts("jsonl"))
    assert set(log.steps[5]) == {"reward_mean", "kl_init", "eval_accuracy"}
    assert set(log.steps[4]) == {"reward_mean", "kl_init"}
    assert log.unmapped == {"tag"}


@pytest.mark.parametrize("item, needle", [
    ("reward_mean", "expected STORE_KEY=SOURCE_COLUMN"),
    ("rewards=rew", "unknown store key 'rewards'"),
])
def test_bad_map_option(item, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_map([item])


def test_csv_without_step_column_names_the_columns(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("iteration,rew\n1,0.5\n")
    with pytest.raises(ConfigError, match=r"no step column.*columns: iteration, rew"):
        parse_file(f, _opts("csv"))
    log = parse_file(f, _opts("csv", column_map=parse_map(["step=iteration,reward_mean=rew"])))
    assert log.steps == {1: {"reward_mean": 0.5}}


def test_map_to_absent_column_is_refused(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("step,rew\n1,0.5\n")
    with pytest.raises(ConfigError, match="--map reward_mean=reward: no such column"):
        parse_file(f, _opts("csv", column_map={"reward_mean": "reward"}))


def test_file_with_no_known_metric_is_refused(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"step": 1, "foo": 2}\n')
    with pytest.raises(ConfigError, match=r"no metric this tool knows.*foo"):
        parse_file(f, _opts("jsonl"))


def test_not_a_trainer_state(tmp_path):
    f = tmp_path / "trainer_state.json"
    f.write_text('{"global_step": 3}')
    with pytest.raises(ConfigError, match="no 'log_history' list"):
        parse_file(f, _opts("trl"))


def test_verl_tqdm_carriage_returns_keep_line_numbers(tmp_path):
    f = tmp_path / "v.log"
    f.write_text("data.train_batch_size=4 actor_rollout_ref.rollout.n=2\n"
                 "bar  0%|\rbar 50%|\rstep:1 - critic/score/mean:0.25\rbar 100%|\n"
                 "step:2 - critic/score/mean:0.5\n"
                 "step:3 - critic/score/mean:oops\n")
    log = parse_file(f, _opts("verl", skip_bad=True))
    assert log.steps == {1: {"reward_mean": 0.25}, 2: {"reward_mean": 0.5}}
    line, why = log.bad_lines[0]
    assert line == 4 and "'critic/score/mean' has value 'oops'" in why
    assert log.params == {"batch_prompts": 4, "group_size": 2}


def test_crlf_csv_and_unicode_line_separator_in_jsonl(tmp_path):
    f = tmp_path / "t.csv"
    f.write_bytes(b'step,reward_mean,note\r\n1,0.5,"two\r\nlines"\r\n2,0.6,x\r\n')
    assert parse_file(f, _opts("csv")).steps == {1: {"reward_mean": 0.5}, 2: {"reward_mean": 0.6}}
    g = tmp_path / "t.jsonl"
    g.write_text('{"step": 1, "reward_mean": 0.5, "note": "a\u2028b"}\n'
                 '{"step": 2, "reward_mean": x}\n')
    log = parse_file(g, _opts("jsonl", skip_bad=True))
    assert log.steps == {1: {"reward_mean": 0.5}} and log.bad_lines[0][0] == 2


def test_jsonl_config_object_with_slash_and_nested_keys(tmp_path):
    """A config line in a JSONL log states the run's params whether its keys are nested or
    '/'-separated (as W&B and MLflow write them); step lines are read as usual."""
    f = tmp_path / "t.jsonl"
    f.write_text('{"actor/optim/lr": 3e-6, "rollout": {"n": 8}, "seed": 2}\n'
                 '{"step": 1, "reward": 0.25}\n{"step": 2, "reward": 0.5}\n')
    log = parse_file(f, _opts("jsonl"))
    assert log.params == {"lr": 3e-6, "group_size": 8, "seed": 2}
    assert log.params_from["lr"] == "log line 1 (actor.optim.lr)"
    assert sorted(log.steps) == [1, 2]
