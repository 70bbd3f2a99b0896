"""The held-out drop rule (`analyze --drop-metric`): a failure on a second metric while the
progress metric rises (training reward up, held-out accuracy down: memorisation).

Logs in the shape a trainer writes them (reward every step, held-out accuracy every tenth step),
imported by `ingest`; the failure is checked against a hand computation on the noise-free
curves."""

import json

from typer.testing import CliRunner

from tests.support.cli import assert_one_line_error, twoclocks_inproc
from twoclocks_cli.app import app

GROUP = 8
PROMPTS = (4, 16)
BUDGET = 16_384
EVAL_EVERY = 10  # steps


def reward(samples: float) -> float:
    return min(0.9, 0.1 + samples / 10_000)


def heldout(samples: float) -> float:
    """Flat at 0.5, then falling 0.1 per 1,000 samples from 8,000 on."""
    return 0.5 if samples <= 8_000 else 0.5 - (samples - 8_000) / 10_000


def _write(folder, p: int, seed: int):
    b = p * GROUP
    path = folder / f"p{p}_s{seed}.jsonl"
    with path.open("w") as fh:
        for step in range(1, BUDGET // b + 1):
            row = {"step": step, "reward_mean": reward(step * b)}
            if step % EVAL_EVERY == 0:
                row["eval_accuracy"] = heldout(step * b)
            fh.write(json.dumps(row) + "\n")
    return path


def _ingest(tmp_path, url):
    for p in PROMPTS:
        for seed in (0, 1):
            r = CliRunner().invoke(app, [
                "ingest", str(_write(tmp_path, p, seed)), "-f", "jsonl", "--sweep", "mem",
                "--batch-prompts", str(p), "--group-size", str(GROUP),
                "--lr", str(1e-4 * (p / 4) ** 0.5), "--seed", str(seed), "--db", url])
            assert r.exit_code == 0, r.output


def _analyze(url, *extra):
    r = CliRunner().invoke(app, ["analyze", "mem", "--metric", "reward_mean", "--smoothing",
                                 "none", "--bootstrap", "50", "--db", url, "--json", *extra])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def _first_drop(b: int) -> int:
    """By hand: the first held-out point below 0.5 - 0.05 (peak 0.5 = initial, so the floor is
    the 0.05 minimum fall); the curve keeps falling, so three in a row start there."""
    step = EVAL_EVERY
    while heldout(step * b) >= 0.45:
        step += EVAL_EVERY
    return step * b


def test_the_heldout_drop_is_the_failure_while_the_reward_rises(tmp_path, sqlite_url):
    _ingest(tmp_path, sqlite_url)
    plain = _analyze(sqlite_url)
    assert all(r["failure"]["censored"] for r in plain["runs"])  # the reward never falls

    a = _analyze(sqlite_url, "--drop-metric", "eval_accuracy")
    assert a["metric"] == "reward_mean"
    for run in a["runs"]:
        b = run["batch_samples"]
        assert run["failure"]["rule"] == "heldout_drop"
        assert run["failure"]["samples"] == _first_drop(b), (b, run["failure"])
        assert run["progress"]["samples"] is not None  # progress read on the reward, as before
    # 8,640 (32-sample batches: every 320) and 8,960 (128: every 1,280): per sample, not per step
    assert sorted({r["failure"]["samples"] for r in a["runs"]}) == [8_640, 8_960]


def test_a_drop_metric_no_run_logged_is_one_line(tmp_path, sqlite_url):
    _ingest(tmp_path, sqlite_url)
    r = twoclocks_inproc("analyze", "mem", "--drop-metric", "eval_acc", "--db", sqlite_url)
    assert_one_line_error(r, "--drop-metric 'eval_acc': not logged by any run of 'mem'")
