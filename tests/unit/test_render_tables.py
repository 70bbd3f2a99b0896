"""The shared table helpers: numbers with thousands separators (full precision stays in
--json), and tables at full width when stdout is not a terminal (a log), through the real CLI."""

from __future__ import annotations

import json
import math

import pytest

from tests.support.cli import twoclocks_inproc
from twoclocks_cli.core.numbers import count, num
from twoclocks_cli.render.tables import LOG_WIDTH, console


@pytest.mark.parametrize(("value", "text"), [
    (10175.3, "10,175"), (10175, "10,175"), (1024.0, "1,024"), (-2500.25, "-2,500"),
    (999.96, "1,000"),  # rounds up to 4 digits: written as the thousand it is
    (16.0, "16"), (0.01234, "0.01234"), (1.5e-05, "1.5e-05"), (12.345678, "12.35"),
    (None, "-"), (float("nan"), "nan"), (float("inf"), "inf"), (2.5e20, "2.5e+20"),
    (123_456_789_012, "123,456,789,012"),
])
def test_num(value, text):
    assert num(value) == text


def test_count_is_whole_with_separators():
    assert [count(x) for x in (10175.3, 10175.5, 999.6, None, math.inf)] == \
        ["10,175", "10,176", "1,000", "-", "inf"]


def test_console_is_log_wide_off_a_terminal():
    from rich.table import Table

    con = console()  # pytest captures stdout: not a terminal
    assert not con.is_terminal and con.width == LOG_WIDTH
    table = Table()
    table.add_column("id")
    table.add_column("name")
    table.add_row("1", "x" * 300)
    with con.capture() as cap:
        con.print(table)
    rows = [ln for ln in cap.get().splitlines() if "x" * 10 in ln]
    assert len(rows) == 1 and "x" * 300 in rows[0]  # one line, not wrapped at 80 columns


def test_a_long_row_is_one_line_and_a_number_has_separators_in_a_log(tmp_path):
    """`runs list`/`runs show` redirected (a pipe, COLUMNS=80 as in a batch job): the row with
    a 250-character name is whole on one line; a last value of 10175.3 reads 10,175 in the
    table and 10175.3 in --json."""
    from twoclocks_cli.store import Run, Store

    url = f"sqlite:///{tmp_path / 's.db'}"
    store = Store.open(url)
    name = "long-" + "n" * 245
    with store.session() as s:
        run = Run(cell_id="c-long", name=name, backend="grpo", status="completed",
                  batch_prompts=4, group_size=2048, batch_samples=8192, lr=1e-4, config={})
        s.add(run)
        s.flush()
        rid = run.id
    with store.metric_writer(rid) as w:
        w.log(1, 8192, {"samples_seen": 10175.3})
    store.close()
    env = {"COLUMNS": "80"}
    listed = twoclocks_inproc("runs", "list", "--db", url, env=env)
    assert listed.returncode == 0, listed.stderr
    rows = [ln for ln in listed.stdout.splitlines() if name in ln]
    assert len(rows) == 1 and "8,192" in rows[0] and "completed" in rows[0], listed.stdout
    assert len(rows[0]) > 250
    shown = twoclocks_inproc("runs", "show", str(rid), "--db", url, env=env)
    line = next(ln for ln in shown.stdout.splitlines() if "samples_seen" in ln)
    assert "10,175" in line and "10,175.3" not in line and "e+04" not in line, line
    rec = json.loads(twoclocks_inproc("runs", "show", str(rid), "--json", "--db", url).stdout)
    assert rec["metrics"]["samples_seen"]["last"] == 10175.3  # full precision in --json


def test_b_crit_estimates_read_with_separators():
    from twoclocks_cli.clocks.critical import Estimate
    from twoclocks_cli.render.analysis import estimate_text

    assert estimate_text(Estimate("empirical", 10240.0, bound="lower")) == ">= 10,240"
    assert estimate_text(Estimate("empirical", 8.0, bound="upper")) == "<= 8"
    assert estimate_text(Estimate("power", 10175.3, 9876.5, None)) == "10,175 [9,876, open]"
    assert estimate_text(Estimate("linear", 36.25, 30.5, 41.0)) == "36.25 [30.5, 41]"
    assert estimate_text(Estimate("linear", None)) == "none"


def test_plan_and_estimate_texts_use_the_shared_numbers():
    from pathlib import Path

    from twoclocks_cli.clocks.critical import Estimate

    assert Estimate("empirical", 10240.0, bound="lower").text() == ">= 10,240"
    assert Estimate("power", 10175.3, 9876.5, None).text() == "10,175 [9,876, open]"
    example = Path(__file__).parents[2] / "examples" / "sim-sweep.toml"
    out = twoclocks_inproc("plan", str(example), env={"COLUMNS": "80"}).stdout
    # budget 65,536 samples; 2 prompts x 8 = 16 samples a step -> 4,096 steps (by hand)
    assert "65,536 samples each" in out
    rows = [[c.strip() for c in ln.split("│")[1:-1]] for ln in out.splitlines()
            if ln.startswith("│")]
    first = rows[0]  # cell, prompts, G, samples/batch, lr, clip, seed, steps, samples
    assert first[1:4] == ["2", "8", "16"] and first[7:] == ["4,096", "65,536"], first
