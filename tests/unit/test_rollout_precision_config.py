"""`rollout_dtype` and `tis_cap` as a config states them and as a run resolves them
(`trainer.precision`): bad values are one line, auto reads the CPU's flags, the TIS cap
defaults on exactly when the sampler differs from the trainer, and a config without the new
keys keeps its record (so its checkpoints still resume)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import assert_one_line_error, twoclocks_inproc
from trainer import precision
from trainer.config import TrainConfig, load_config
from trainer.ownership import config_diff
from twoclocks_cli.core.errors import ConfigError

# /proc/cpuinfo as Linux writes it, one core, with and without native bf16
FLAGS = "fpu vme de pse tsc msr pae mce cx8 apic sep avx2 avx512f avx512bw avx512vl"
CPUINFO = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: {flags}\nbugs\t\t: spectre_v1\n"

REFUSALS = [
    ('rollout_dtype = "bf16"\n',
     ["key 'rollout_dtype' = 'bf16'", "'auto'", "'float32'", "'bfloat16'", "'float16'"]),
    ("rollout_dtype = 16\n", ["key 'rollout_dtype' = 16", "'auto'"]),
    ('tis_cap = "none"\n', ["key 'tis_cap' = 'none'", "greater than 0", "'off'"]),
    ("tis_cap = -1.5\n", ["key 'tis_cap' = -1.5", "greater than 0", "'off'"]),
    ("tis_cap = 0\n", ["key 'tis_cap' = 0", "greater than 0"]),
    ("tis_cap = true\n", ["key 'tis_cap' = True", "a number", "'off'"]),
    ("tis_cap = inf\n", ["key 'tis_cap' = inf", "finite"]),
    ('rollout_engine = "vllm"\nrollout_dtype = "bfloat16"\n',
     ["key 'rollout_dtype' = 'bfloat16'", "hf engine", "rollout_engine = 'vllm'"]),
]


@pytest.mark.parametrize("toml,needles", REFUSALS, ids=[t[:28] for t, _ in REFUSALS])
def test_a_bad_value_is_one_line_naming_file_key_value_and_what_is_allowed(tmp_path, toml,
                                                                           needles):
    (tmp_path / "t.toml").write_text(toml)
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "t.toml")
    line = str(info.value)
    assert "\n" not in line and line.startswith(f"{tmp_path / 't.toml'}: ")
    for needle in needles:
        assert needle in line, (needle, line)


def test_the_cli_refuses_a_bad_rollout_dtype_in_one_line_and_writes_nothing(tmp_path):
    (tmp_path / "t.toml").write_text('rollout_dtype = "half"\n')
    db = tmp_path / "s.db"
    proc = twoclocks_inproc("train", str(tmp_path / "t.toml"), "--db", f"sqlite:///{db}",
                            "--workdir", str(tmp_path / "w"), cwd=tmp_path)
    assert_one_line_error(proc, "t.toml", "key 'rollout_dtype' = 'half'", "'bfloat16'")
    assert not (tmp_path / "w").exists()
    if db.exists():
        from twoclocks_cli.store import Store

        assert Store.open(f"sqlite:///{db}").list_runs() == []


def test_good_values_validate_and_an_int_cap_is_a_float():
    for value in ("auto", "float32", "bfloat16", "float16", None):
        assert TrainConfig(rollout_dtype=value).rollout_dtype == value
    assert TrainConfig(tis_cap=2).tis_cap == 2.0 and isinstance(TrainConfig(tis_cap=2).tis_cap,
                                                                float)
    assert TrainConfig(tis_cap="off").tis_cap == "off"


def _cpuinfo(tmp_path, *extra: str):
    path = tmp_path / f"cpuinfo{len(extra)}{''.join(extra)}"
    path.write_text(CPUINFO.format(flags=" ".join([FLAGS, *extra])))
    return path


def test_auto_reads_the_native_bf16_flags_of_the_cpu(tmp_path):
    plain, avx, amx = (_cpuinfo(tmp_path), _cpuinfo(tmp_path, "avx512_bf16"),
                       _cpuinfo(tmp_path, "amx_tile", "amx_bf16"))
    assert precision.bf16_native("cpu", plain) is None  # avx512f alone emulates bf16
    assert precision.bf16_native("cpu", avx) == "this CPU has avx512_bf16"
    assert precision.bf16_native("cpu", amx) == "this CPU has amx_bf16"
    assert precision.bf16_native("cpu", tmp_path / "absent") is None  # not Linux: no flags
    auto = TrainConfig(rollout_dtype="auto")
    assert precision.resolve(auto, "cpu", avx).sample == "bfloat16"
    assert precision.resolve(auto, "cpu", plain).sample == "float32"
    assert "no native bf16 on cpu" in precision.resolve(auto, "cpu", plain).why


def test_this_machines_answer_is_its_cpuinfo_flags():
    info = Path("/proc/cpuinfo")
    words = set(info.read_text().split()) if info.exists() else set()
    native = precision.bf16_native("cpu")
    assert (native is not None) == bool(words & {"avx512_bf16", "amx_bf16"})


# (config, sample dtype, TIS cap) with a CPU that has native bf16 (auto chooses bfloat16)
CASES = [
    ({}, "float32", None),
    ({"rollout_dtype": "float32"}, "float32", None),
    ({"rollout_dtype": "bfloat16"}, "bfloat16", 2.0),
    ({"rollout_dtype": "auto"}, "bfloat16", 2.0),
    ({"rollout_dtype": "bfloat16", "tis_cap": "off"}, "bfloat16", None),
    ({"rollout_dtype": "bfloat16", "tis_cap": 1.5}, "bfloat16", 1.5),
    ({"rollout_dtype": "float32", "tis_cap": 3}, "float32", 3.0),
    ({"dtype": "bfloat16"}, "bfloat16", None),
    ({"dtype": "bfloat16", "rollout_dtype": "float32"}, "float32", 2.0),
    ({"rollout_engine": "vllm"}, "float32", 2.0),
    ({"rollout_engine": "vllm", "tis_cap": "off"}, "float32", None),
]


@pytest.mark.parametrize("over,sample,cap", CASES, ids=[str(c[0]) for c in CASES])
def test_tis_defaults_on_exactly_when_the_sampler_differs(tmp_path, over, sample, cap):
    cfg = TrainConfig(**over)
    prec = precision.resolve(cfg, "cpu", _cpuinfo(tmp_path, "avx512_bf16"))
    assert (prec.sample, prec.tis_cap) == (sample, cap)
    if "tis_cap" not in over:
        assert (cap is not None) == (sample != cfg.dtype or cfg.rollout_engine != "hf")
    settled = precision.settle(cfg, prec)
    assert (settled.rollout_dtype, settled.tis_cap) == (sample, cap)
    assert cfg.model_dump() == TrainConfig(**over).model_dump()  # the record is untouched


def test_the_event_names_what_auto_chose_and_the_cap(tmp_path):
    prec = precision.resolve(TrainConfig(rollout_dtype="auto"), "cpu",
                             _cpuinfo(tmp_path, "amx_bf16"))
    assert precision.describe(prec) == (
        "rollouts sample in bfloat16 (rollout_dtype = 'auto': this CPU has amx_bf16), the "
        "update runs in float32; tis_cap 2 (tis_cap unset, the sampler differs from the "
        "trainer: the default cap)")


def test_a_config_without_the_new_keys_keeps_its_record():
    """A record written before rollout_dtype existed (no key, tis_cap None) differs in nothing
    from today's default config, so a checkpoint of such a run still resumes."""
    today = TrainConfig().model_dump(mode="json")
    before = {k: v for k, v in today.items() if k != "rollout_dtype"}
    assert today["rollout_dtype"] is None and today["tis_cap"] is None
    assert config_diff(before, today) == {}


def test_the_sampling_copy_is_cast_in_place_on_every_sync():
    """The bf16 copy keeps its tensors (no new allocation per sync), holds the cast of the
    trainer's weights bit for bit, keeps buffers as they were, and carries no gradients."""
    import torch

    from trainer.sharding import copy_full_weights

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 3))
    model.register_buffer("freq", torch.linspace(0, 1, 5))
    assert precision.sampling_model(model, "float32", separate=False) is model
    twin = precision.sampling_model(model, "bfloat16", separate=False)
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in twin.parameters())
    assert twin.freq.dtype == torch.float32
    where = [p.data_ptr() for p in twin.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    copy_full_weights(model, twin)
    assert [p.data_ptr() for p in twin.parameters()] == where
    for mine, theirs in zip(twin.parameters(), model.parameters(), strict=True):
        assert torch.equal(mine, theirs.detach().to(torch.bfloat16))
