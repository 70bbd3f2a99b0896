"""A cell's `branch` table (what `twoclocks probe` writes for the grpo backend): its keys and
values are checked, one line for each problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.adaptive.branch import Branch, stream_seeds
from twoclocks_cli.core.errors import ConfigError


def test_a_branch_table_round_trips():
    b = Branch.from_dict({"from_workdir": "/x/cells/abc", "replicate": 2}, "cell")
    assert b == Branch(Path("/x/cells/abc"), 2)
    assert Branch.from_dict(b.to_dict(), "cell") == b
    assert Branch.from_dict({"from_workdir": None}, "cell") == Branch(None, 0)


@pytest.mark.parametrize("table, needle", [
    ([1], "must be a table"),
    ({"from": "/x"}, "unknown key 'branch.from'"),
    ({"replicate": -1}, "'branch.replicate' = -1"),
    ({"replicate": True}, "'branch.replicate' = True"),
    ({"from_workdir": 3}, "'branch.from_workdir' = 3"),
])
def test_a_bad_branch_table_is_one_line(table, needle):
    with pytest.raises(ConfigError) as err:
        Branch.from_dict(table, "cell config")
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_folder_without_a_checkpoint_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        Branch(tmp_path, 0).checkpoint()
    assert Branch(None, 1).checkpoint() is None


def test_replicate_streams_differ_from_each_other_and_repeat():
    assert stream_seeds(0, 1) == stream_seeds(0, 1)
    assert stream_seeds(0, 1) != stream_seeds(0, 2) != stream_seeds(1, 1)
    assert stream_seeds(0, 1)[1] != [0, 0]  # never the run's own data stream
