"""What an import of OpenRLHF's logs (written by tests/support/trackers.py) must read: every
step's training values and every evaluation's pass@1 at the global step OpenRLHF logged them."""

from __future__ import annotations

from typer.testing import CliRunner

from tests.support import trackers as tk
from twoclocks_cli.app import app
from twoclocks_cli.ingest import IngestOptions
from twoclocks_cli.ingest.importer import parse_source

# store key -> OpenRLHF's status name, as its trainer logs it under train/
TRAIN = {"reward_mean": "reward", "kl_init": "kl", "loss": "policy_loss", "lr": "actor_lr",
         "resp_len_mean": "response_length", "truncated_frac": "truncated",
         "clip_frac": "ppo_clip_ratio", "approx_kl": "ppo_kl"}
STEPS = list(range(1, tk.ORLHF_STEPS + 1))
EVAL_STEPS = [s for s in STEPS if s % tk.ORLHF_EVAL_EVERY == 0]


def logs(source, **kw) -> dict:
    """{run name: parsed log} of every run under `source`."""
    return {log.run_name: log for log in parse_source(source, IngestOptions(**kw))}


def ingest(*args):
    """`twoclocks ingest ARGS` in this process (typer's runner: exit code, stdout, stderr)."""
    return CliRunner().invoke(app, ["ingest", *map(str, args)])


def assert_written(log, sources=("gsm8k",)):
    """Every step's training values and every evaluation's pass@1 are what OpenRLHF logged,
    at the global step it logged them."""
    assert sorted(log.steps) == STEPS
    for s in STEPS:
        want = tk.openrlhf_train(s)
        assert {k: log.steps[s][k] for k in TRAIN} == {k: want[v] for k, v in TRAIN.items()}
    evals = {s: v["eval_accuracy"] for s, v in log.steps.items() if "eval_accuracy" in v}
    if len(sources) == 1:
        assert evals == {s: tk.openrlhf_eval(s, sources)[f"eval_{sources[0]}_pass1"]
                         for s in EVAL_STEPS}
    assert {k: v for k, v in log.sources.items() if k in TRAIN} == \
        {k: f"train/{v}" for k, v in TRAIN.items()}
