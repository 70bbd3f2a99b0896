"""Numbers beyond what the store holds in an imported log: one line, nothing written.

Steps go to metrics.step (INTEGER: at most 2^31 - 1 on PostgreSQL), samples to metrics.samples
(BIGINT: 2^63 - 1); a value beyond a float (10**400) is not a metric. Unchecked, each would raise
an OverflowError and leave a failed run with 0 rows.
"""

from __future__ import annotations

import json

import pytest

from tests.support.cli import assert_one_line_error, twoclocks_inproc
from twoclocks_cli.core.limits import INT32_MAX as STEP_MAX
from twoclocks_cli.core.limits import INT64_MAX as SAMPLES_MAX
from twoclocks_cli.ingest.base import to_number, to_step

CASES = [
    ("a.csv", "step,reward_mean\n0,0.1\n9223372036854775808,0.2\n", "csv", ["a.csv:3", "'step'"]),
    ("b.csv", f"step,reward_mean\n0,0.1\n{STEP_MAX + 1},0.2\n", "csv", ["b.csv:3", "'step'"]),
    ("c.jsonl", '{"step": 0, "reward_mean": 0.1, "samples": 8}\n'
     '{"step": 1, "reward_mean": 0.2, "samples": 1e30}\n', "jsonl", ["c.jsonl:2", "'samples'"]),
    ("trainer_state.json", json.dumps({"log_history": [{"step": 1, "reward": 10**400}],
                                       "train_batch_size": 4, "global_step": 1}),
     "trl", ["trainer_state.json", "'reward'", "out of a float's range"]),
]


@pytest.mark.parametrize("name,text,fmt,needles", CASES, ids=[c[0] for c in CASES])
def test_out_of_range_numbers_are_one_line_and_write_nothing(tmp_path, name, text, fmt, needles):
    (tmp_path / name).write_text(text)
    db = tmp_path / "s.db"
    proc = twoclocks_inproc("ingest", str(tmp_path / name), "--format", fmt,
                            "--db", f"sqlite:///{db}", "--group-size", "4", "--batch-prompts", "2")
    assert_one_line_error(proc, *needles, "nothing was written")
    if db.exists():
        import sqlite3

        con = sqlite3.connect(db)
        assert [con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("sweeps", "runs", "metrics")] == [0, 0, 0]
        con.close()


def test_the_bounds_themselves():
    assert to_step(STEP_MAX) == STEP_MAX and to_step(str(STEP_MAX)) == STEP_MAX
    assert to_step(SAMPLES_MAX, limit=SAMPLES_MAX) == SAMPLES_MAX  # exact, no float rounding
    for bad in (STEP_MAX + 1, -1, 1.5, "1e30", float("inf")):
        with pytest.raises(ValueError):
            to_step(bad)
    with pytest.raises(ValueError, match="out of a float's range"):
        to_number(10**400)
