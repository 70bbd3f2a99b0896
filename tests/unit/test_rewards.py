"""Rewards: the answer-format policy and real math-verify (in this process, workers=0), the fork
pool (timeouts, restarts, dead workers), plug-ins."""

from __future__ import annotations

import sys
import time

import pytest

from trainer.data import Problem
from trainer.rewards import FINAL_BOXED, MathVerifyReward, load_reward
from twoclocks_cli.core.errors import ConfigError

# a pool of workers (workers >= 1) forks processes; a verdict is the same math-verify call in
# this process (workers=0) as in a worker, so only the pool's own behaviour needs one
forks = pytest.mark.subprocess

P = Problem("23+41", "64")
HOSTILE = ["\\boxed{9^{9^{9^{9}}}}", "\\boxed{10000000000!}"]


@pytest.fixture(scope="module")
def reward():
    with MathVerifyReward(timeout_s=1.0, workers=0) as r:
        yield r


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("\\boxed{64}", 1.0),
        ("\\boxed{64}  \n", 1.0),
        ("\\boxed{65}", 0.0),
        ("\\boxed{-64}", 0.0),
        ("", 0.0),
        ("}}{{\\boxed{", 0.0),
        ("\\boxed{64} because", 0.0),
        # format hacks math-verify alone would reward with 1
        ("64", 0.0),
        ("\\boxed{128/2}", 0.0),
        ("\\boxed{x=64}", 0.0),
        ("\\boxed{23+41}", 0.0),
    ],
)
def test_strict_policy_then_math_verify(reward, completion, expected):
    assert reward([completion], [P]) == [expected]


def test_the_format_hacks_do_verify_without_the_policy():
    """Proof the policy matters: with a permissive pattern math-verify accepts the hacks."""
    hacks = ["64", "\\boxed{128/2}", "\\boxed{x=64}", "\\boxed{23+41}"]
    with MathVerifyReward(answer_pattern="(?s).*", workers=0) as r:
        assert r(hacks, [P] * 4) == [1.0] * 4


def test_batch_mixed_answers_and_negative_gold(reward):
    probs = [Problem("3-10", "-7"), Problem("2*3", "6"), P, P]
    comps = ["\\boxed{-7}", "\\boxed{6}", "\\boxed{63}", "\\boxed{64}"]
    assert reward(comps, probs) == [1.0, 1.0, 0.0, 1.0]


def test_final_boxed_pattern_for_chat_models():
    with MathVerifyReward(answer_pattern=FINAL_BOXED, workers=0) as r:
        out = r(["So 23+41 = \\boxed{64}", "So \\boxed{64} or 63", "\\boxed{64.0}"], [P] * 3)
    assert out == [1.0, 0.0, 1.0]


@forks
def test_hostile_answers_are_cut_at_the_timeout():
    with MathVerifyReward(answer_pattern="(?s).*", timeout_s=1.0, workers=2) as r:
        t0 = time.monotonic()
        out = r(HOSTILE + ["\\boxed{64}", "nonsense"], [P] * 4)
        elapsed = time.monotonic() - t0
        assert out == [0.0, 0.0, 1.0, 0.0]
        assert r.timeouts == 2
        assert elapsed < 4.0  # two hung items on two workers in parallel, 1 s each, plus a fork
        # the replaced workers still serve
        assert r(["\\boxed{64}", "\\boxed{1}"], [P, P]) == [1.0, 0.0]
        # a timeout is never remembered: the same hostile answer is verified (and cut) again
        assert r(HOSTILE[:1], [P]) == [0.0] and r.timeouts == 3


def test_verdicts_are_remembered_per_completion_and_gold():
    """A pair math-verify already judged is not sent to it again; its verdict is reused."""
    with MathVerifyReward(workers=0) as r:
        asked = []
        score = r._score
        r._score = lambda items: asked.append(list(items)) or score(items)
        other = Problem("1+5", "6")
        assert r(["\\boxed{64}", "\\boxed{6}", "\\boxed{64}"], [P, other, other]) == [1.0, 1.0, 0.0]
        assert r(["\\boxed{6}", "\\boxed{64}", "\\boxed{65}"], [other, P, P]) == [1.0, 1.0, 0.0]
        assert asked == [
            [("\\boxed{64}", "64"), ("\\boxed{6}", "6"), ("\\boxed{64}", "6")],
            [("\\boxed{65}", "64")],
        ]


def test_serial_mode_uses_math_verify_timeout():
    with MathVerifyReward(workers=0) as r:
        assert r(["\\boxed{64}", "64", "\\boxed{63}"], [P] * 3) == [1.0, 0.0, 0.0]


@forks
def test_pool_survives_a_fork_and_close_is_idempotent():
    r = MathVerifyReward(workers=1)
    assert r(["\\boxed{64}"], [P]) == [1.0]
    r.close()
    r.close()
    assert r(["\\boxed{64}"], [P]) == [1.0]  # restarts its pool on demand
    r.close()


def test_length_mismatch_is_an_error(reward):
    with pytest.raises(ValueError):
        reward(["\\boxed{64}"], [P, P])


@pytest.mark.parametrize("kwargs", [{"answer_pattern": "(["}, {"timeout_s": 0}, {"workers": -1}])
def test_bad_options(kwargs):
    with pytest.raises(ConfigError):
        MathVerifyReward(**kwargs)


def _length_reward(completions, problems):
    return [float(len(c)) for c in completions]


def _bad_reward(completions, problems):
    return [1.0]


def test_load_reward_specs():
    mod = sys.modules[__name__].__name__
    with load_reward("math-verify", workers=0) as r:
        assert isinstance(r, MathVerifyReward) and r(["\\boxed{64}"], [P]) == [1.0]
    user = load_reward(f"{mod}:_length_reward")
    assert user(["ab", "c"], [P, P]) == [2.0, 1.0]
    with pytest.raises(ConfigError, match="returned 1 values for 2"):
        load_reward(f"{mod}:_bad_reward")(["a", "b"], [P, P])
    for spec in ["nope", "no_such_module_xyz:f", f"{mod}:missing", f"{mod}:P"]:
        with pytest.raises(ConfigError):
            load_reward(spec)
    with pytest.raises(ConfigError, match="only to math-verify"):
        load_reward(f"{mod}:_length_reward", workers=2)


def _score_in_daemon(queue):
    with MathVerifyReward(workers=1) as r:
        queue.put(r(["\\boxed{64}", "\\boxed{6}"], [P, P]))


@forks
def test_pool_inside_a_daemonic_process():
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_score_in_daemon, args=(queue,), daemon=True)
    proc.start()
    assert queue.get(timeout=60) == [1.0, 0.0]
    proc.join(30)
    assert proc.exitcode == 0


@forks
def test_a_dead_worker_is_replaced_without_losing_items():
    import os
    import signal

    with MathVerifyReward(workers=2) as r:
        assert r(["\\boxed{64}"], [P]) == [1.0]
        for w in r._workers:  # killed from outside, e.g. by the OOM killer
            os.kill(w.pid, signal.SIGKILL)
            os.waitpid(w.pid, 0)
        probs = [Problem(f"{k}+1", str(k + 1)) for k in range(40)]
        comps = [f"\\boxed{{{k + 1 if k % 2 else k}}}" for k in range(40)]
        assert r(comps, probs) == [float(k % 2) for k in range(40)]


def test_a_full_memo_is_refilled_without_losing_this_batchs_verdicts(monkeypatch):
    """When the memo overflows it is dropped — after the verdicts it already held for this batch
    were read, so remembered and fresh pairs in one batch are both scored."""
    import trainer.rewards as rewards_mod

    monkeypatch.setattr(rewards_mod, "_MEMO_SIZE", 2)
    with MathVerifyReward(workers=0) as r:
        assert r(["\\boxed{64}", "\\boxed{63}"], [P, P]) == [1.0, 0.0]  # memo now full
        assert r(["\\boxed{64}", "\\boxed{65}", "\\boxed{63}"], [P] * 3) == [1.0, 0.0, 0.0]
        assert set(r._memo) == {("\\boxed{65}", "64")}  # dropped, then refilled


@pytest.mark.parametrize(
    "completion, stated",
    [
        ("23 + 41 = 64", "\\boxed{64}"),
        ("The answer is 64.", "\\boxed{64}"),
        ("64", "\\boxed{64}"),
        ("So \\boxed{64} is it, not 65", "\\boxed{64}"),  # a box wins over later numbers
        ("\\boxed{63} no wait \\boxed{ 64 }", "\\boxed{64}"),  # the last box
        ("1,064 apples", "\\boxed{1064}"),  # thousands commas
        ("64, 65, 66", "\\boxed{66}"),  # a list: only the last number counts
        ("-12", "\\boxed{-12}"),
        ("\\boxed{128/2}", None),  # an expression in the box states no number
        ("\\boxed{23+41}", None),
        ("no digits here", None),
        ("", None),
    ],
)
def test_the_stated_final_answer(completion, stated):
    from trainer.rewards import final_answer

    assert final_answer(completion) == stated


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("23 + 41 = 64", 1.0),
        ("The answer is 64.", 1.0),
        ("\\boxed{64}", 1.0),
        ("23 + 41 = 65", 0.0),
        ("64 or 65", 0.0),  # candidates listed: the last one is the answer
        ("\\boxed{128/2}", 0.0),  # format hacks still fail
        ("\\boxed{23+41}", 0.0),
        ("23+41", 0.0),  # the question's own numbers
        ("", 0.0),
    ],
)
def test_the_final_answer_reward_through_math_verify(completion, expected):
    with load_reward("math-verify-final", workers=0) as r:
        assert r([completion], [P]) == [expected]
