"""FSDP settings read from accelerate's environment (`trainer.sharding.options_from_env`) and the
refusals of what the trainer does not implement: each one ConfigError line naming the setting.
(FSDP1 is refused end to end, through `accelerate launch`, in tests/integration/test_ddp.py.)"""

from __future__ import annotations

import pytest

from trainer.sharding import FsdpOptions, options_from_env, shard
from twoclocks_cli.core.errors import ConfigError

FSDP = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}


def _env(monkeypatch, values: dict) -> None:
    for key in ("ACCELERATE_USE_FSDP", "FSDP_VERSION", "FSDP_OFFLOAD_PARAMS",
                "FSDP_ACTIVATION_CHECKPOINTING", "FSDP_RESHARD_AFTER_FORWARD"):
        monkeypatch.delenv(key, raising=False)
    for key, value in values.items():
        monkeypatch.setenv(key, value)


def test_no_fsdp_and_fsdp2_with_its_reshard_setting(monkeypatch):
    _env(monkeypatch, {})
    assert options_from_env() is None
    _env(monkeypatch, FSDP)
    assert options_from_env() == FsdpOptions(reshard_after_forward=True)
    _env(monkeypatch, FSDP | {"FSDP_RESHARD_AFTER_FORWARD": "False"})
    assert options_from_env() == FsdpOptions(reshard_after_forward=False)


@pytest.mark.parametrize(("extra", "needle"), [
    ({"FSDP_VERSION": "1"}, "FSDP version 1 (FSDP_VERSION)"),
    ({"FSDP_OFFLOAD_PARAMS": "true"}, "parameter offload (FSDP_OFFLOAD_PARAMS=true)"),
    ({"FSDP_ACTIVATION_CHECKPOINTING": "true"},
     "activation checkpointing (FSDP_ACTIVATION_CHECKPOINTING=true)"),
    ({"FSDP_RESHARD_AFTER_FORWARD": "SHARD_GRAD_OP"},
     "FSDP_RESHARD_AFTER_FORWARD = 'shard_grad_op': allowed are true, false"),
])
def test_unsupported_settings_are_one_line(monkeypatch, extra, needle):
    _env(monkeypatch, FSDP | extra)
    with pytest.raises(ConfigError) as err:
        options_from_env()
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_model_without_twoclocks_forward_is_refused_before_any_sharding():
    """The transformers forward (scorer = "hf", other architectures) cannot be sharded: its
    call count depends on the batch. Refused before a device mesh or process group is needed."""
    import torch

    model = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError) as err:
        shard(model, model, "cpu", 2, FsdpOptions())
    assert "FSDP runs with twoclocks' own forward" in str(err.value)
    assert "\n" not in str(err.value)
