"""Bad training configs through the real `twoclocks train` CLI: one line, exit 2, no run row."""

from __future__ import annotations

import pytest

from tests.support.cli import assert_one_line_error, twoclocks_inproc
from trainer.config import TrainConfig, load_config
from twoclocks_cli.core.errors import ConfigError


def _train(tmp_path, toml: str, *files: tuple[str, str]):
    for name, text in files:
        (tmp_path / name).write_text(text)
    (tmp_path / "train.toml").write_text(toml)
    db = f"sqlite:///{tmp_path / 'store.db'}"
    proc = twoclocks_inproc(
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
    assert_one_line_error(twoclocks_inproc("train", str(tmp_path / "nope.toml")), "nope.toml",
                          "not found")


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


# the train config is strict like the sweep config (none of these may start training)
STRICT_REJECTIONS = [
    ("lr = true\n", ["key 'lr' = True", "not a string or a bool"]),
    ('lr = "1e-4"\n', ["key 'lr' = '1e-4'", "must be a number"]),
    ("lr = inf\n", ["key 'lr' = inf", "finite"]),
    ("lr = nan\n", ["key 'lr' = nan", "finite"]),
    ("temperature = inf\n", ["key 'temperature' = inf", "finite"]),
    ('group_size = "8"\n', ["key 'group_size' = '8'", "integer"]),
    ("group_size = 8.0\n", ["key 'group_size' = 8.0", "integer"]),
    ('reward = "bogus"\n', ["key 'reward' = 'bogus'", "'module:function'"]),
    ('reward = "no_such_module_xyz:fn"\n', ["key 'reward'", "no_such_module_xyz", "importable"]),
    ('model = ""\n', ["key 'model' = ''", "must not be empty"]),
    ('model = "m\\u0000x"\n', ["'model'", "NUL"]),
    (f'model = "./{"m" * 300}"\n', ["key 'model'", "300 bytes", "at most 255"]),
    ("seed = 100000000000000000000\n", ["key 'seed'", "2147483647"]),
    ("seed = -1\n", ["key 'seed' = -1", "greater than or equal to 0"]),
    ("sample_budget = 9223372036854775807\n", ["sample_budget", "steps", "step column"]),
    ("prompts_per_batch = 2147483647\n", ["prompts_per_batch", "at most 2147483647"]),
    ("[[phases]]\nprompts_per_batch = 4\nlr = inf\n", ["key 'phases.0.lr' = inf", "finite"]),
    ("arith_ops = []\n", ["arith_ops", "at least 1"]),
    ("tis_cap = 0\n", ["key 'tis_cap' = 0", "greater than 0"]),
    ('hf_decoder = "fast"\n', ["key 'hf_decoder' = 'fast'", "'auto'", "'generate'"]),
    ('scorer = "own"\n', ["key 'scorer' = 'own'", "'auto'", "'hf'"]),
    ("noise_every = -1\n", ["key 'noise_every' = -1", "greater than or equal to 0"]),
    ("lr_warmup_samples = -8\n", ["key 'lr_warmup_samples' = -8", "greater than or equal to 0"]),
    ("lr_warmup_samples = 0.5\n", ["key 'lr_warmup_samples' = 0.5", "integer"]),
    ("x = " + "[" * 5000 + "]" * 5000 + "\n", ["nested too deeply"]),
]


@pytest.mark.parametrize("toml,needles", STRICT_REJECTIONS,
                         ids=[t[:20] for t, _ in STRICT_REJECTIONS])
def test_strict_values_are_rejected_before_anything_loads(tmp_path, toml, needles):
    (tmp_path / "t.toml").write_text(toml)
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "t.toml")
    line = str(info.value)
    assert "\n" not in line and line.startswith(str(tmp_path / "t.toml"))
    for needle in needles:
        assert needle in line, (needle, line)


@pytest.mark.parametrize("toml,needles", [
    ("lr = true\n", ["key 'lr' = True"]),
    ('model = ""\n', ["key 'model' = ''", "must not be empty"]),
    ("temperature = inf\n", ["key 'temperature' = inf"]),
])
def test_strict_rejections_through_the_cli_write_nothing(tmp_path, toml, needles):
    assert_one_line_error(_train(tmp_path, toml), *needles)


def test_ints_stay_valid_for_floats_and_sweep_cells_validate():
    cfg = TrainConfig.from_dict({"lr": 1, "temperature": 2, "clip_eps_high": 0})
    assert (cfg.lr, cfg.temperature, cfg.clip_eps_high) == (1.0, 2.0, 0.0)
    assert isinstance(cfg.lr, float)


def test_the_warm_up_scales_the_lr_by_the_share_reached_at_the_steps_end():
    cfg = TrainConfig(lr_warmup_samples=1000)
    assert cfg.warm_lr(2e-4, 0, 100) == pytest.approx(2e-5, rel=1e-12)  # 100 / 1000
    assert cfg.warm_lr(2e-4, 650, 100) == pytest.approx(1.5e-4, rel=1e-12)  # 750 / 1000
    assert cfg.warm_lr(2e-4, 900, 100) == 2e-4  # the step ending at 1000 has the whole lr
    assert cfg.warm_lr(2e-4, 5000, 100) == 2e-4
    assert TrainConfig().warm_lr(2e-4, 0, 100) == 2e-4  # none by default


def test_the_eta_is_never_negative_when_the_last_step_passes_the_budget():
    from twoclocks_cli.render.progress import eta_text

    assert eta_text(3600 * 100, 100.0) == "01:00:00"
    assert eta_text(-1536, 369.0) == "00:00:00"  # 34,304 of 32,768 samples
    assert eta_text(100, 0.0) == "-"


def test_a_rate_below_one_sample_a_second_is_not_printed_as_zero():
    from twoclocks_cli.render.progress import rate_text

    assert rate_text(0.3125) == "0.31 samples/s"  # a 135M model: 32 samples in 102 s
    assert rate_text(0.049) == "0.049 samples/s"
    assert rate_text(3.0) == "3 samples/s"
    assert rate_text(9.96) == "10 samples/s"
    assert rate_text(1234.4) == "1,234 samples/s"
