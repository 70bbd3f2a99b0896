"""The cost file (`--cost FILE`): what it models, and every bad file one ConfigError line."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twoclocks_cli.clocks.cost import CostFile, load_cost, measured_throughput
from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.core.toml import dumps


def test_seconds_per_sample_amortise_the_step_overhead(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("step_overhead_s = 20\ngen_s_per_sample = 0.05\nupdate_s_per_sample = 0.03\n"
                    "price_per_hour = 20\n")
    cost = load_cost(path)
    assert cost.seconds_per_sample(512) == pytest.approx(20 / 512 + 0.08)
    assert cost.seconds_per_sample(2048) < cost.seconds_per_sample(512)
    assert cost.price_per_hour == 20.0 and cost.timed
    price_only = tmp_path / "p.toml"
    price_only.write_text("price_per_hour = 3.5\n")
    assert not load_cost(price_only).timed


@pytest.mark.parametrize(("text", "needle"), [
    ("step_overhead_s = -0.5\n", "step_overhead_s = -0.5: must be a number >= 0"),
    ("gen_s_per_sample = inf\n", "gen_s_per_sample = inf: must be a finite number"),
    ("update_s_per_sample = [1]\n", "update_s_per_sample = [1]: must be a finite number"),
    ("price_per_hour = -2\n", "price_per_hour = -2: must be a number > 0"),
    ("[gpu]\nprice = 1\n", "unknown key 'gpu': allowed are step_overhead_s"),
    ("step_overhead_s = 0\ngen_s_per_sample = 0\n", "every timing is 0"),
    ("", "no key given"),
    ("price_per_hour = \n", "not valid TOML"),
])
def test_bad_cost_file_is_one_line(tmp_path, text, needle):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_cost(path)
    line = str(err.value)
    assert "\n" not in line and line.startswith(str(path)) and needle in line, line


_values = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 10**9),
                    st.booleans(), st.text(max_size=5), st.lists(st.integers(), max_size=2))
_keys = st.sampled_from(["step_overhead_s", "gen_s_per_sample", "update_s_per_sample",
                         "price_per_hour", "gpus", "price"])


@settings(derandomize=True, database=None, deadline=None, max_examples=150)
@given(doc=st.dictionaries(_keys, _values, max_size=4))
def test_any_cost_file_is_a_model_or_one_line(tmp_path_factory, doc):
    """Whatever a cost file holds, it is read into a valid model or refused in one line."""
    path = tmp_path_factory.mktemp("fuzz") / "c.toml"
    try:
        path.write_text(dumps(doc))
    except (ValueError, TypeError):
        return  # not writable as TOML (NaN, infinity): the TOML reader's own cases above
    try:
        cost = load_cost(path)
    except ConfigError as err:
        assert "\n" not in str(err)
        return
    assert isinstance(cost, CostFile)
    if cost.timed:
        assert cost.seconds_per_sample(64) > 0


def test_measured_throughput_needs_finite_positive_steps():
    """No logged step, or only steps without time, is no throughput (not a zero one)."""
    import numpy as np

    from twoclocks_cli.store.store import Series

    rng = np.random.default_rng(0)
    assert measured_throughput(64, [], rng) is None
    empty = Series(np.array([1, 2]), np.array([64, 128]), np.array([np.nan, np.nan]))
    assert measured_throughput(64, [[empty]], rng) is None
    one = Series(np.array([1]), np.array([64]), np.array([6.4]))
    tp = measured_throughput(64, [[one]], rng)
    assert tp.seconds_per_sample == pytest.approx(0.1) and tp.low is None and tp.steps == 1
