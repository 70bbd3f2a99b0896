"""`update_dtype` as a config states it and as a run resolves it (`trainer.precision`): bad
values and meaningless combinations are one line, auto reads the CPU's flags, the event says
what was chosen (a copy of the weights in one process, autocast under several), the forwards'
context is autocast exactly when the compute differs from the weights it reads, the copy folds
its gradients into the master ones and is re-cast from them, and a config without the key keeps
its record (so its checkpoints still resume)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from tests.support.cli import assert_one_line_error, twoclocks_inproc
from trainer import precision
from trainer.config import TrainConfig, load_config
from trainer.ownership import config_diff
from twoclocks_cli.core.errors import ConfigError

CPUINFO = "processor\t: 0\nflags\t\t: fpu avx2 avx512f{extra}\n"

REFUSALS = [
    ('update_dtype = "bf16"\n', ["key 'update_dtype' = 'bf16'", "'auto'", "'float32'",
                                 "'bfloat16'"]),
    ('update_dtype = "float16"\n', ["key 'update_dtype' = 'float16'", "loss scaling",
                                    "'bfloat16'"]),
    ('dtype = "bfloat16"\nupdate_dtype = "bfloat16"\n',
     ["key 'update_dtype' = 'bfloat16'", "float32 weights", "dtype = 'bfloat16'",
      "leave update_dtype unset"]),
    ('dtype = "bfloat16"\nupdate_dtype = "float32"\n',
     ["key 'update_dtype' = 'float32'", "dtype = 'bfloat16'"]),
    ('dtype = "float16"\nupdate_dtype = "auto"\n',
     ["key 'update_dtype' = 'auto'", "dtype = 'float16'"]),
    ("update_dtype = 16\n", ["key 'update_dtype' = 16", "'bfloat16'"]),
]


@pytest.mark.parametrize("toml,needles", REFUSALS, ids=[t[:34] for t, _ in REFUSALS])
def test_a_bad_value_is_one_line_naming_file_key_value_and_what_is_allowed(tmp_path, toml,
                                                                           needles):
    (tmp_path / "t.toml").write_text(toml)
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "t.toml")
    line = str(info.value)
    assert "\n" not in line and line.startswith(f"{tmp_path / 't.toml'}: ")
    for needle in needles:
        assert needle in line, (needle, line)


def test_the_cli_refuses_a_bad_update_dtype_in_one_line_and_leaves_the_store_as_it_was(
        tmp_path):
    import sqlite3

    from twoclocks_cli.store import Store

    db = tmp_path / "s.db"
    Store.open(f"sqlite:///{db}")  # a store that exists before the refusal

    def dump():
        with contextlib.closing(sqlite3.connect(db)) as conn:
            return list(conn.iterdump())

    before = dump()
    (tmp_path / "t.toml").write_text('dtype = "bfloat16"\nupdate_dtype = "bfloat16"\n')
    proc = twoclocks_inproc("train", str(tmp_path / "t.toml"), "--db", f"sqlite:///{db}",
                            "--workdir", str(tmp_path / "w"), cwd=tmp_path)
    assert_one_line_error(proc, "t.toml", "key 'update_dtype' = 'bfloat16'", "float32 weights")
    assert not (tmp_path / "w").exists()
    assert dump() == before


def _cpuinfo(tmp_path, extra: str = ""):
    path = tmp_path / f"cpuinfo{extra.strip()}"
    path.write_text(CPUINFO.format(extra=extra))
    return path


# (config, the update's compute dtype, the update part of the event, the TIS cap) on a CPU with
# native bf16: a bf16 update rounds apart from any sampler's forward, so the cap defaults on
CASES = [
    ({}, "float32", "the update runs in float32;", None),
    ({"update_dtype": "float32"}, "float32",
     "the update runs in float32 (update_dtype = 'float32');", None),
    ({"update_dtype": "bfloat16"}, "bfloat16",
     "the update computes in bfloat16 on a bfloat16 copy of the float32 weights "
     "(update_dtype = 'bfloat16');", 2.0),
    ({"update_dtype": "auto"}, "bfloat16",
     "the update computes in bfloat16 on a bfloat16 copy of the float32 weights "
     "(update_dtype = 'auto': this CPU has avx512_bf16);", 2.0),
    ({"update_dtype": "bfloat16", "rollout_dtype": "bfloat16"}, "bfloat16",
     "the update computes in bfloat16 on a bfloat16 copy", 2.0),
    ({"update_dtype": "bfloat16", "tis_cap": "off"}, "bfloat16",
     "the update computes in bfloat16 on a bfloat16 copy", None),
    ({"dtype": "bfloat16"}, "bfloat16", "the update runs in bfloat16;", None),
]


@pytest.mark.parametrize("over,compute,words,cap", CASES, ids=[str(c[0]) for c in CASES])
def test_the_update_precision_resolves_settles_and_is_named(tmp_path, over, compute, words,
                                                            cap):
    cfg = TrainConfig(**over)
    prec = precision.resolve(cfg, "cpu", _cpuinfo(tmp_path, " avx512_bf16"))
    assert prec.compute == compute and prec.train == cfg.dtype
    assert words in precision.describe(prec)
    assert prec.tis_cap == cap
    settled = precision.settle(cfg, prec)
    assert (settled.update_dtype, settled.tis_cap) == (compute, cap)
    assert cfg.model_dump() == TrainConfig(**over).model_dump()  # the record is untouched


def test_auto_without_native_bf16_stays_float32_and_an_explicit_bf16_says_it_is_emulated(
        tmp_path):
    plain = _cpuinfo(tmp_path)
    auto = precision.resolve(TrainConfig(update_dtype="auto"), "cpu", plain)
    assert (auto.compute, auto.compute_why) == ("float32",
                                                "update_dtype = 'auto': no native bf16 on cpu")
    asked = precision.resolve(TrainConfig(update_dtype="bfloat16"), "cpu", plain)
    assert asked.compute == "bfloat16" and "emulated on this CPU" in asked.compute_why


class _Run:
    writes = True

    def __init__(self):
        self.events = []
        self.sink = self

    def event(self, message):
        self.events.append(message)


@pytest.mark.parametrize("over,said", [({}, False), ({"update_dtype": "float32"}, True),
                                       ({"update_dtype": "bfloat16"}, True)])
def test_the_event_is_recorded_when_the_update_dtype_is_named(tmp_path, over, said):
    cfg = TrainConfig(**over)
    run = _Run()
    precision.announce(run, precision.resolve(cfg, "cpu", _cpuinfo(tmp_path, " amx_bf16")), cfg)
    assert len(run.events) == int(said)


def test_several_processes_compute_under_autocast_and_say_so(tmp_path):
    """Under DDP/FSDP the gradient sync hooks the master parameters: no copy, autocast."""
    cfg = TrainConfig(update_dtype="bfloat16")
    prec = precision.resolve(cfg, "cpu", _cpuinfo(tmp_path, " avx512_bf16"), alone=False)
    assert ("the update computes in bfloat16 under autocast over float32 weights "
            "(update_dtype = 'bfloat16');") in precision.describe(prec)


def test_the_forwards_run_under_autocast_exactly_when_the_compute_differs_from_the_weights():
    """Unset and float32 give no context at all (the forward as before, bit for bit); a settled
    bfloat16 gives CPU autocast to bfloat16 over float32 weights, under which a float32 matmul
    comes out bf16, and nothing over weights already in bf16 (a compute copy's); the copy is
    made in one process only."""
    fp32, bf16 = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4).to(torch.bfloat16)
    for value in (None, "float32"):
        assert isinstance(precision.autocast(TrainConfig(update_dtype=value), fp32),
                          contextlib.nullcontext)
        assert not precision.resolve(TrainConfig(update_dtype=value), "cpu").computes_on_copy
    cfg = TrainConfig(update_dtype="bfloat16")
    assert isinstance(precision.autocast(cfg, bf16), contextlib.nullcontext)
    a = torch.randn(4, 8)
    with precision.autocast(cfg, fp32):
        assert (a @ a.T).dtype == torch.bfloat16
    assert (a @ a.T).dtype == torch.float32
    assert precision.resolve(cfg, "cpu", alone=True).computes_on_copy
    assert not precision.resolve(cfg, "cpu", alone=False).computes_on_copy


def test_the_compute_copy_folds_gradients_in_float32_and_is_recast_from_the_master():
    """Two backwards through the copy: the master gradient is the float32 sum of the two bf16
    gradients (not their bf16 sum), the copy keeps none; after a master change `refresh` makes
    the copy the master's bf16 rounding; tied weights pair once."""
    torch.manual_seed(0)
    master = torch.nn.Sequential(torch.nn.Embedding(10, 6), torch.nn.Linear(6, 10, bias=False))
    master[1].weight = master[0].weight  # tied, as SmolLM2's embeddings and LM head
    cc = precision.compute_copy(master, master, "bfloat16", lambda m: m)
    assert len(cc.pairs) == 1 and cc.model is not master
    assert cc.model[1].weight is cc.model[0].weight
    grads = []
    for ids in (torch.tensor([1, 2, 3]), torch.tensor([4, 5])):
        cc.net(ids).float().square().sum().backward()
        grads.append(cc.model[0].weight.grad.clone())
        cc.fold()
        assert cc.model[0].weight.grad is None
    got = master[0].weight.grad
    assert got.dtype == torch.float32
    assert torch.equal(got, grads[0].float() + grads[1].float())
    with torch.no_grad():
        master[0].weight.add_(0.123)
    cc.refresh()
    assert torch.equal(cc.model[0].weight, master[0].weight.to(torch.bfloat16))


def test_a_bf16_sampler_copy_is_the_compute_copy():
    """One bf16 copy serves the sampler and the update where both are bf16."""
    model = torch.nn.Linear(4, 4)
    sampler = precision.sampling_model(model, "bfloat16", separate=False)
    cc = precision.compute_copy(model, sampler, "bfloat16", lambda m: m)
    assert cc.model is sampler and all(q.requires_grad for _, q in cc.pairs)
    apart = precision.compute_copy(model, model, "bfloat16", lambda m: m)
    assert apart.model is not model and next(apart.model.parameters()).dtype == torch.bfloat16



def test_a_config_without_the_key_keeps_its_record():
    """A record written before update_dtype existed differs in nothing from today's default
    config, so a checkpoint of such a run still resumes."""
    today = TrainConfig().model_dump(mode="json")
    before = {k: v for k, v in today.items() if k != "update_dtype"}
    assert today["update_dtype"] is None
    assert config_diff(before, today) == {}
