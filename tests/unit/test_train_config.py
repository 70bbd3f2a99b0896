"""Bad training configs through the real `twoclocks train` CLI: one line, exit 2, no run row."""

from __future__ import annotations

import pytest

from tests.support.cli import assert_one_line_error, twoclocks
from trainer.config import TrainConfig, load_config
from twoclocks_cli.errors import ConfigError


def _train(tmp_path, toml: str, *files: tuple[str, str]):
    for name, text in files:
        (tmp_path / name).write_text(text)
    (tmp_path / "train.toml").write_text(toml)
    db = f"sqlite:///{tmp_path / 'store.db'}"
    proc = twoclocks(
        "train",
        str(tmp_path / "train.toml"),
        "--db",
        db,
        "--workdir",
        str(tmp_path / "work"),
        cwd=tmp_path,
    )
    assert not (tmp_path / "work").exists()  # nothing half-written
    if (tmp_path / "store.db").exists():
        from twoclocks_cli.store import Store

        assert Store.open(db).list_runs() == []
    return proc


@pytest.mark.parametrize(
    "toml,files,needles",
    [
        ('model = "./no-such-model"\n', [], ["model path", "no-such-model", "does not exist"]),
        ('dataset = "missing.jsonl"\n', [], ["missing.jsonl", "not found"]),
        (
            'dataset = "p.jsonl"\n',
            [("p.jsonl", '{"question": "1+1", "answer": "2"}\n{"question": "2+2"}\n')],
            ["p.jsonl", "line 2", "answer"],
        ),
        ('dataset = "p.csv"\n', [("p.csv", "question,answer\n1+1,2\n3+3\n")], ["p.csv", "line 3"]),
        (
            "samples_per_batch = 100\ngroup_size = 8\n",
            [],
            ["samples_per_batch", "100", "group_size"],
        ),
        ("lr = 1e-4\nclip_eps_hgh = 0.3\n", [], ["unknown key 'clip_eps_hgh'", "clip_eps_high"]),
        (
            "[[phases]]\nprompts_per_batch = 4\nlr = 1e-3\nuntil_sample = 10\n",
            [],
            ["phases.0.until_sample", "until_samples"],
        ),
        ('loss_agg = "sum"\n', [], ["loss_agg", "token-mean"]),
        ("lr = \n", [], ["not valid TOML"]),
        ('rollout_engine = "vllm"\n', [], ["vllm extra"]),
    ],
)
def test_bad_input_is_one_line(tmp_path, toml, files, needles):
    proc = _train(tmp_path, toml, *files)
    assert_one_line_error(proc, *needles)


def test_missing_config_file(tmp_path):
    assert_one_line_error(twoclocks("train", str(tmp_path / "nope.toml")), "nope.toml", "not found")


def test_defaults_and_batch_forms(tmp_path):
    cfg = TrainConfig()
    assert (cfg.prompts_per_batch, cfg.samples_per_batch, cfg.updates_per_batch) == (16, 128, 1)
    assert TrainConfig(samples_per_batch=64, group_size=4).prompts_per_batch == 16
    with pytest.raises(ConfigError, match="give one of them"):
        TrainConfig.from_dict({"prompts_per_batch": 4, "samples_per_batch": 64})
    # a sweep cell may carry its trainer overrides in a sub-table
    cell = TrainConfig.from_dict({"prompts_per_batch": 4, "trainer": {"ppo_epochs": 2}})
    assert cell.updates_per_batch == 2
    (tmp_path / "c.toml").write_text(
        "[[phases]]\nuntil_samples = 64\nprompts_per_batch = 4\nlr = 1e-3\n"
        "[[phases]]\nprompts_per_batch = 32\nlr = 3e-3\nclip_eps_high = 0.28\n"
    )
    cfg = load_config(tmp_path / "c.toml")
    assert cfg.phase_at(0)[0] == 0 and cfg.phase_at(63)[1].lr == 1e-3
    index, phase = cfg.phase_at(64)
    assert (index, phase.prompts_per_batch, phase.clip_eps_low, phase.clip_eps_high) == (
        1,
        32,
        0.2,
        0.28,
    )
