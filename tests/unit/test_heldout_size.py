"""The arithmetic task's held-out count against what its own draws show."""

import numpy as np

from trainer.data import ArithmeticTask


def test_heldout_size_is_the_distinct_heldout_draws_and_the_rest_of_the_space():
    task = ArithmeticTask(0, 20, ("+", "-"))  # 882 problems
    size = task.heldout_size()
    # drawn with replacement far past the pool, every held-out problem turns up
    held = {p.question for p in task.heldout(20 * task.space, seed=3)}
    trained = {p.question for p in task.sample(np.random.default_rng(0), 40 * task.space)}
    assert size == len(held)
    assert not held & trained
    assert size + len(trained) == task.space


def test_heldout_size_of_a_space_too_large_to_enumerate_is_unknown():
    assert ArithmeticTask(0, 999, ("+", "-", "*")).heldout_size() is None
