"""Bad values for the newer commands (schedule, analyze, report, theory, suggest, probe, export,
runs delete, db upgrade) through the real CLI, in this process: each is one line on stderr,
exit 2, no traceback, nothing created, and the store byte-for-byte as it was (SQLite dump).

First every concrete case an outside fuzz found (a parametrized table), then hypothesis over
each command's numeric and path options: any float (nan, inf, negative, huge), any int up to
2^64, any path string gives exit 0 with output or exit 2 with one line; never exit 1, never past
a time limit. Source files (W&B, MLflow, verl, TensorBoard) are in test_fuzz_newer_sources.py.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tests.integration.simsweep import make_sweep
from tests.unit.test_fuzz_inputs import FUZZ, _dump
from twoclocks_cli.app import app

I64 = 2**63 - 1
LONG_NAME = "n" * 300
SECONDS = 60  # what any one refused or accepted value may take here


@pytest.fixture(scope="module")
def sim_store(tmp_path_factory) -> Path:
    """A sim sweep 'p' (batches 8 and 32 samples, two seeds each) with its analysis stored."""
    from twoclocks_cli.store import Store

    root = tmp_path_factory.mktemp("simstore")
    store = Store.open(f"sqlite:///{root / 's.db'}")
    make_sweep(store, "p", [2, 8], 2, 2000, {"log_every": 5, "flat_dims": 0}, root)
    store.close()
    result = CliRunner().invoke(app, ["analyze", "p", "--save", "--stability", "0",
                                      "--no-theory", "--bootstrap", "50", "--db",
                                      f"sqlite:///{root / 's.db'}", "--json"])
    assert result.exit_code == 0, result.output
    con = sqlite3.connect(root / "s.db")
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return root / "s.db"


class Here:
    """A scratch folder holding a copy of the store; runs the CLI there."""

    def __init__(self, root: Path, db: Path):
        self.root = root
        self.db = root / "s.db"
        shutil.copy(db, self.db)
        self.url = f"sqlite:///{self.db}"
        self.before = _dump(self.db)
        self.files = self._files()

    def _files(self) -> list[str]:
        """What the folder holds besides the store (and SQLite's -wal/-shm beside it)."""
        return sorted(p.name for p in self.root.iterdir() if not p.name.startswith("s.db"))

    def run(self, args: list[str]):
        args = [a.replace("DB", self.url).replace("ROOT", str(self.root)) for a in args]
        here = os.getcwd()
        os.chdir(self.root)
        start = time.monotonic()
        try:
            result = CliRunner().invoke(app, args, env={
                "TWOCLOCKS_CRASH_DIR": str(self.root / "crashes")})
        finally:
            os.chdir(here)
        assert time.monotonic() - start < SECONDS, args
        assert result.exception is None or isinstance(result.exception, SystemExit), \
            (args, repr(result.exception))
        assert "Traceback" not in result.output, (args, result.output[-2000:])
        return result

    def refuses(self, args: list[str], *needles: str) -> str:
        result = self.run(args)
        assert result.exit_code == 2, (args, result.output[-2000:])
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.stderr)
        for needle in needles:
            assert needle in lines[0], (needle, lines[0])
        self.unchanged(args)
        return lines[0]

    def unchanged(self, args) -> None:
        assert _dump(self.db) == self.before, args
        assert self._files() == self.files, args


def _here(tmp_path_factory, sim_store) -> Here:
    return Here(tmp_path_factory.mktemp("case"), sim_store)


BRANCH = ["probe", "1", "--at", "100", "--batches", "8,16", "--branch-samples", "400",
          "--db", "DB"]
QUICK = ["--stability", "0", "--no-theory", "--bootstrap", "50", "--db", "DB"]

CASES = [
    # numbers that are not numbers
    (["schedule", "p", "--budget", "0", "--db", "DB"], "--budget 0.0: must be in (0,"),
    (["schedule", "p", "--budget", "-5", "--db", "DB"], "--budget -5.0"),
    (["schedule", "p", "--budget", "nan", "--db", "DB"], "--budget nan: must be a finite"),
    (["schedule", "p", "--budget", "inf", "--db", "DB"], "--budget inf: must be a finite"),
    (["analyze", "p", "--target", "nan", *QUICK], "--target 'nan'"),
    (["analyze", "p", "--target", "inf", *QUICK], "--target 'inf'"),
    (["analyze", "p", "--drop-rho", "nan", *QUICK], "--drop-rho nan"),
    (["analyze", "p", "--drop-rho", "1.5", *QUICK], "--drop-rho 1.5: must be in [0, 1]"),
    (["analyze", "p", "--drift-threshold", "nan", *QUICK], "--drift-threshold nan"),
    (["analyze", "p", "--drift-threshold", "-1", *QUICK], "--drift-threshold -1.0: must be > 0"),
    (["analyze", "p", "--entropy-low", "2", "--entropy-high", "1", *QUICK],
     "--entropy-low 2.0 > --entropy-high 1.0"),
    (["report", "p", "--out", "ROOT/rep", "--safety", "nan", "--db", "DB"], "--safety nan"),
    (["theory", "--batches", "nan"], "--batches 'nan': nan must be a finite number"),
    (["theory", "--batches", "16,inf"], "--batches '16,inf': inf must be a finite number"),
    (["theory", "--cap", "nan"], "--cap nan"),
    (["theory", "--lr0", "nan"], "--lr0 nan"),
    (["theory", "--lr0", "inf"], "--lr0 inf"),
    (["theory", "--lr0", "1e308"], "--lr0 1e+308: must be in (0, 1]"),
    (["theory", "--b0", "nan"], "--b0 nan"),
    (["theory", "--rule", "alpha=nan"], "--rule 'alpha=nan': alpha must be"),
    (["theory", "--rule", "alpha=1e308"], "--rule 'alpha=1e308': alpha must be"),
    (["theory", "--cap", "-1"], "--cap -1.0: must be > 0"),
    (["theory", "--lr-scan", "nan"], "--lr-scan 'nan'"),
    (["theory", "--simulate", "--budget", "nan"], "--budget nan"),
    (["theory", "--simulate", "--budget", "inf"], "--budget inf"),
    (["theory", "--simulate", "--seeds", "100000000"], "simulated runs; at most 10,000"),
    (["theory", "--simulate", "--budget", "1e12"], "steps; at most 5e+06"),
    (["suggest", "p", "--budget", "1e308", "--db", "DB"], "--budget 1e+308"),
    # work without a ceiling
    ([*BRANCH[:5], "1,8", "--branch-samples", "1e12", "--db", "DB"],
     "--branch-samples 1e+12: 6 branches x 1,000,000,000,000 steps"),
    ([*BRANCH[:5], ",".join(str(b) for b in range(1, 4001)), "--branch-samples", "8000",
      "--db", "DB"], "--batches: 4,000 values; at most 1,000"),
    ([*BRANCH[:5], ",".join(str(b) for b in range(1, 101)), "--branch-samples", "8000",
      "--db", "DB"], "--batches: 100 batch sizes; at most 64"),
    (["analyze", "p", "--bootstrap", "1000000000", "--stability", "0", "--db", "DB"],
     "--bootstrap 1000000000: must be between 1 and 20,000"),
    # ids, seeds and sizes out of range
    (["probe", "9223372036854775808", *BRANCH[2:]], "RUN 9223372036854775808: must be between"),
    ([*BRANCH, "--seed", "-1"], "--seed -1: must be between 0 and 2,147,483,647"),
    (["runs", "delete", "9223372036854775808", "--yes", "--db", "DB"],
     "no run with id 9223372036854775808"),
    (["report", "p", "--out", "ROOT/rep", "--run", str(2**64), "--db", "DB"],
     f"--run {2**64}: must be between"),
    (["ingest", "ROOT/none.csv", "--batch-prompts", "2147483647", "--group-size", "2147483647",
      "--db", "DB"], "--batch-prompts 2147483647 x --group-size 2147483647"),
    (["report", "p", "--out", "ROOT/rep", *["--run", "1"] * 1001, "--db", "DB"],
     "--run: 1,001 values; at most 1,000"),
    (["ingest", "ROOT/none.csv", "--follow", "--pid", "4294967296", "--db", "DB"],
     "--pid 4294967296: must be between 1 and 2,147,483,647"),
    # paths
    (["export", "p", "--out", f"ROOT/{LONG_NAME}.csv", "--db", "DB"],
     "a path component is 304 bytes"),
    (["export", "p", "--out", "ROOT/" + "d/" * 2500 + "x.csv", "--db", "DB"],
     "the absolute path is too long"),
    (["export", "p", "--out", f"ROOT/{'n' * 240}.csv", "--db", "DB"],
     "room for the temporary file"),
    (["export", "p", "--out", "/proc/twoclocks-export.csv", "--db", "DB"], "--out /proc/"),
    (["suggest", "p", "--out", f"ROOT/{LONG_NAME}.toml", "--db", "DB"],
     "a path component is 305 bytes"),
    (["ingest", f"ROOT/{LONG_NAME}.csv", "--db", "DB"], "a path component is 304 bytes"),
    (["analyze", "p", "--plot", "ROOT", *QUICK], "is a directory"),
    (["analyze", "p", "--csv", "ROOT/missing/x.csv", *QUICK], "does not exist"),
    (["schedule", "p", "--out", "ROOT/missing/x.toml", "--db", "DB"], "does not exist"),
    (["report", "p", "--out", "ROOT/rep", "--target", "frac:9", "--db", "DB"], "--target"),
    (["report", "p", "--out", "ROOT/rep", "--window", "0", "--db", "DB"], "--window 0"),
    (["report", "p", "--out", "ROOT/rep", "--smoothing", "x", "--db", "DB"], "--smoothing 'x'"),
    (["report", "p", "--out", "ROOT/a/b/rep", "--db", "DB"], "does not exist"),
    (["report", "nosuch", "--out", "ROOT/rep", "--db", "DB"], "no sweep named 'nosuch'"),
    # store revisions
    (["db", "upgrade", "zzzz", "--db", "DB"], "unknown revision 'zzzz'"),
]


@pytest.mark.parametrize("args,needle", CASES, ids=[" ".join(c[0])[:60] for c in CASES])
def test_each_case_the_fuzz_found_is_one_line(tmp_path_factory, sim_store, args, needle):
    _here(tmp_path_factory, sim_store).refuses(args, needle)


def test_a_store_at_a_revision_this_version_does_not_know(tmp_path_factory, sim_store):
    here = _here(tmp_path_factory, sim_store)
    con = sqlite3.connect(here.db)
    con.execute("UPDATE alembic_version SET version_num = 'ffff9999'")
    con.commit()
    con.close()
    here.before = _dump(here.db)
    here.refuses(["db", "upgrade", "--db", "DB"], "revision 'ffff9999', which this twoclocks")


def test_a_report_refused_leaves_no_folder_and_a_good_one_still_writes(tmp_path_factory,
                                                                       sim_store):
    here = _here(tmp_path_factory, sim_store)
    here.refuses(["report", "p", "--out", "ROOT/rep", "--window", "0", "--db", "DB"])
    assert not (here.root / "rep").exists()
    result = here.run(["report", "p", "--out", "ROOT/rep", "--db", "DB", "--json"])
    assert result.exit_code == 0, result.output
    assert (here.root / "rep" / "index.html").is_file()


def test_the_bounds_still_take_their_edges(tmp_path_factory, sim_store):
    """The checks refuse only what they should: each edge value is accepted."""
    here = _here(tmp_path_factory, sim_store)
    for args in (["schedule", "p", "--budget", "9e18", "--safety", "1", "--stability", "0",
                  "--db", "DB", "--json"],
                 ["analyze", "p", "--drop-rho", "1", "--seed", str(2**31 - 1), "--entropy-low",
                  "1", "--entropy-high", "1", *QUICK, "--json"],
                 [*BRANCH, "--seed", str(2**31 - 1), "--json"]):
        result = here.run(args)
        assert result.exit_code == 0, (args, result.output[-2000:])
    here.unchanged("edges")


def test_a_theory_the_model_cannot_reach_ends_in_reason(tmp_path_factory, sim_store):
    """lr0 1 (diverging at B = 1): the yardstick's pilot gives up, the answer says why; before,
    128 seeds ran the whole yardstick budget and then the grid (minutes)."""
    import json

    here = _here(tmp_path_factory, sim_store)
    start = time.monotonic()
    result = here.run(["theory", "--lr0", "1", "--json"])
    assert result.exit_code == 0, result.output[-2000:]
    crit = json.loads(result.stdout)["critical_batch"]
    assert crit["b_crit"] is None and "target not reached at B=1" in crit["mechanism"]
    assert time.monotonic() - start < SECONDS


# --- hypothesis: any number, any path --------------------------------------------------------

ANY_FLOAT = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                      st.sampled_from([0.0, -0.0, 1e308, -1e308, 5e-324, 1.0, 0.5]))
ANY_INT = st.one_of(st.integers(-(2**64), 2**64), st.sampled_from([0, -1, I64, I64 + 1]))
ANY_PATH = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=40),
    st.integers(250, 5000).map(lambda n: "p" * n),
    st.integers(1, 1200).map(lambda n: "d/" * n + "x"),
    st.sampled_from(["/proc/x", "/", ".", "..", "/nonexistent/dir/x", "-"]),
)
FLOAT_OPTIONS = [
    (["schedule", "p", "--stability", "0", "--db", "DB"], ["--budget", "--safety"]),
    (["analyze", "p", *QUICK], ["--drop-rho", "--drop-delta", "--drift-threshold",
                                "--entropy-low", "--entropy-high", "--length-max",
                                "--truncated-max", "--span-samples", "--ema-alpha",
                                "--dip-recover", "--invariance-margin"]),
    (["suggest", "p", "--db", "DB"], ["--budget"]),
    (BRANCH[:2] + ["--batches", "8,16", "--db", "DB"], ["--at", "--branch-samples"]),
]
INT_OPTIONS = [
    (["schedule", "p", "--db", "DB"], ["--stability"]),
    (["analyze", "p", "--stability", "0", "--no-theory", "--db", "DB"],
     ["--window", "--drop-k", "--bootstrap", "--seed"]),
    (BRANCH, ["--seed", "--seeds"]),
    (["runs", "show", "--db", "DB"], [""]),  # the run id itself
]


def _outcome(here: Here, args: list[str]) -> None:
    """Exit 0, or exit 2 with one line; the store unchanged either way."""
    result = here.run(args)
    assert result.exit_code in (0, 2), (args, result.output[-2000:])
    if result.exit_code == 2:
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.stderr)
    assert _dump(here.db) == here.before, args


def _float_text(x: float) -> str:
    return repr(x) if x == x else "nan"


@settings(FUZZ, max_examples=40)
@given(case=st.sampled_from(FLOAT_OPTIONS).flatmap(
    lambda c: st.tuples(st.just(c[0]), st.sampled_from(c[1]))), value=ANY_FLOAT)
def test_any_float_in_a_numeric_option(tmp_path_factory, sim_store, case, value):
    base, option = case
    here = _here(tmp_path_factory, sim_store)
    _outcome(here, [*base, option, _float_text(value), "--json"])


@settings(FUZZ, max_examples=30)
@given(case=st.sampled_from(INT_OPTIONS).flatmap(
    lambda c: st.tuples(st.just(c[0]), st.sampled_from(c[1]))), value=ANY_INT)
def test_any_int_in_an_integer_option_or_id(tmp_path_factory, sim_store, case, value):
    base, option = case
    here = _here(tmp_path_factory, sim_store)
    extra = [str(value)] if not option else [option, str(value)]
    _outcome(here, [*base, *extra, "--json"])


OUT_OPTIONS = [
    ["export", "p", "--db", "DB", "--out"],
    ["suggest", "p", "--db", "DB", "--out"],
    ["analyze", "p", *QUICK, "--csv"],
    ["schedule", "p", "--stability", "0", "--db", "DB", "--out"],
    ["report", "p", "--db", "DB", "--out"],
]


@settings(FUZZ, max_examples=30)
@given(command=st.sampled_from(OUT_OPTIONS), path=ANY_PATH)
def test_any_path_as_an_output(tmp_path_factory, sim_store, command, path):
    """A path is written (exit 0) or refused in one line; a refusal creates nothing."""
    here = _here(tmp_path_factory, sim_store)
    result = here.run([*command, path])
    assert result.exit_code in (0, 2), (command, path, result.output[-2000:])
    if result.exit_code == 2:
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), (command, path,
                                                                    result.stderr)
        here.unchanged((command, path))
    assert _dump(here.db) == here.before


INGEST_OPTIONS = {"--batch-prompts": ANY_INT, "--group-size": ANY_INT, "--seed": ANY_INT,
                  "--lr": ANY_FLOAT}


@settings(FUZZ, max_examples=30)
@given(option=st.sampled_from(sorted(INGEST_OPTIONS)), data=st.data())
def test_any_number_in_an_ingest_option(tmp_path_factory, sim_store, option, data):
    """Imported with exactly that value in the run's column (exit 0), or refused in one line
    with the store as it was (exit 2)."""
    import json

    value = data.draw(INGEST_OPTIONS[option])
    here = _here(tmp_path_factory, sim_store)
    (here.root / "log.csv").write_text("step,reward_mean\n1,0.1\n2,0.2\n")
    here.files = here._files()
    given_ = {"--batch-prompts": "2", "--group-size": "4", "--seed": "0", "--lr": "0.01"}
    given_[option] = _float_text(value) if isinstance(value, float) else str(value)
    args = ["ingest", "ROOT/log.csv", "--db", "DB", "--json"]
    for k, v in given_.items():
        args += [k, v]
    result = here.run(args)
    assert result.exit_code in (0, 2), (option, value, result.output[-2000:])
    if result.exit_code == 2:
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"error: {option} "), (value, lines)
        here.unchanged((option, value))
        return
    (run,) = json.loads(result.stdout)
    column = {"--batch-prompts": "batch_prompts", "--group-size": "group_size",
              "--seed": "seed", "--lr": "lr"}[option]
    assert run[column] == value, (option, value, run)
    assert run["batch_samples"] == run["batch_prompts"] * run["group_size"] <= 2**31 - 1
