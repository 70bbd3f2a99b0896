"""`runs show` and `export` through the real CLI on stores filled by `twoclocks ingest`: every
exported value and every summary number is checked against the curves the test wrote."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.curves import KEYS, Curve, ingest, make_curve, same
from twoclocks_cli.app import app

pytestmark = pytest.mark.one_worker

CELL = ("run_id", "run", "sweep", "backend", "batch_prompts", "group_size", "batch_samples", "lr",
        "clip_low", "clip_high", "seed", "status")


def cli(*args, input=None):
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """A SQLite store with sweep `lrs` (3 runs) and sweep `other` (1 run), ingested."""
    root = tmp_path_factory.mktemp("export")
    db = f"sqlite:///{root / 'store.db'}"
    curves = [make_curve("p64-s0", 64, 16, 0.001, 0, 40), make_curve("p128-s1", 128, 16,
                                                                         0.0014142135623730952,
                                                                         1, 25),
              make_curve("p8-s2", 8, 4, 3e-4, 2, 12)]
    other = [make_curve("q4-s0", 4, 8, 0.01, 0, 9)]
    ingest(db, "lrs", curves, root / "logs")
    ingest(db, "other", other, root / "logs2")
    return db, curves, other, root


def expected_long(curves: list[Curve], sweep: str, keys=KEYS) -> list[tuple]:
    """The export the test expects, computed from what it wrote: (cell..., step, samples, key,
    value) in run, step, key order."""
    rows = []
    for c in sorted(curves, key=lambda c: c.run_id):
        cell = (c.run_id, c.run_name, sweep, "csv", c.prompts, c.group, c.batch, c.lr, None,
                None, c.seed, "completed")
        for step, samples, vals in c.steps:
            rows += [cell + (step, samples, k, vals[k]) for k in sorted(keys) if k in vals]
    return rows


def as_tuples(df, columns) -> list[tuple]:
    """DataFrame rows as tuples of Python values (NaN cells of str/float columns → None
    where the column is a cell parameter that can be absent)."""
    out = []
    for rec in df[list(columns)].itertuples(index=False):
        out.append(tuple(None if (isinstance(v, float) and math.isnan(v) and c in
                                  ("clip_low", "clip_high")) else v
                         for c, v in zip(columns, rec, strict=True)))
    return out


def assert_rows_equal(got: list[tuple], want: list[tuple]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert len(g) == len(w)
        for a, b in zip(g, w, strict=True):
            if isinstance(b, float):
                assert same(float(a), b), (g, w)
            else:
                assert a == b, (g, w)


def test_export_long_csv_stdout_and_file(filled, tmp_path):
    import pandas as pd

    db, curves, _, _ = filled
    r = cli("export", "lrs", "--format", "csv", "--db", db)
    assert r.exit_code == 0, r.output
    out = tmp_path / "long.csv"
    r2 = cli("export", "lrs", "--out", out, "--db", db)  # format from the suffix
    assert r2.exit_code == 0, r2.output
    assert out.read_text() == r.stdout
    want = expected_long(curves, "lrs")
    assert len(want) == 77 * 3 + 14 + 9 + 4  # 40+25+12 steps x 3 keys + accuracy every 3rd
    assert f"wrote {len(want)} rows (3 run(s), 4 key(s), long)" in r2.stderr
    df = pd.read_csv(out)
    assert list(df.columns) == list(CELL) + ["step", "samples", "key", "value"]
    assert_rows_equal(as_tuples(df, df.columns), want)
    assert df["value"].map(math.isinf).sum() == 3 and df["value"].isna().sum() == 3
    assert df["batch_samples"].dtype.kind == "i" and df["lr"].dtype.kind == "f"


def test_export_wide_parquet(filled, tmp_path):
    import pandas as pd
    import pyarrow.parquet as pq

    db, curves, _, _ = filled
    out = tmp_path / "wide.parquet"
    r = cli("export", "lrs", "--format", "parquet", "--layout", "wide", "--out", out,
            "--db", db)
    assert r.exit_code == 0, r.output
    table = pq.read_table(out)
    # a key that is also a parameter column keeps its value under metric_<key>
    assert table.column_names == list(CELL) + ["step", "samples", "accuracy", "entropy",
                                               "metric_lr", "reward_mean"]
    assert str(table.schema.field("step").type) == "int64"
    # not logged at a step: null; logged NaN: NaN (parquet keeps the difference)
    acc, ent = table.column("accuracy"), table.column("entropy")
    assert acc.null_count == sum(1 for c in curves for s in c.steps if "accuracy" not in s[2])
    assert ent.null_count == 0
    df = pd.read_parquet(out)
    assert len(df) == sum(len(c.steps) for c in curves)
    by_id = {c.run_id: c for c in curves}
    for rec in df.itertuples(index=False):
        c = by_id[rec.run_id]
        step, samples, vals = c.steps[rec.step]
        assert (rec.run, rec.sweep, rec.batch_prompts, rec.group_size, rec.batch_samples,
                rec.lr, rec.seed, rec.samples) == (c.run_name, "lrs", c.prompts, c.group,
                                                   c.batch, c.lr, c.seed, samples)
        for col, key in (("accuracy", "accuracy"), ("entropy", "entropy"),
                         ("metric_lr", "lr"), ("reward_mean", "reward_mean")):
            got = getattr(rec, col)
            assert same(got, vals[key]) if key in vals else math.isnan(got), (rec, key)


def test_export_jsonl_one_run_some_keys(filled):
    import io

    import pandas as pd

    db, curves, _, _ = filled
    c = curves[1]
    r = cli("export", "--run", c.run_id, "-f", "jsonl", "--keys", "entropy,reward_mean",
            "--db", db)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    recs = [json.loads(line) for line in lines]  # strict JSON: NaN and inf are null
    assert len(recs) == 2 * len(c.steps)
    for rec, (step, samples, key) in zip(recs, [(s, x, k) for s, x, _ in c.steps
                                               for k in ("entropy", "reward_mean")],
                                         strict=True):
        want = c.steps[step][2][key]
        assert (rec["run_id"], rec["step"], rec["samples"], rec["key"]) == (
            c.run_id, step, samples, key)
        assert rec["value"] == (want if math.isfinite(want) else None)
    df = pd.read_json(io.StringIO(r.stdout), lines=True)
    assert set(df["key"]) == {"entropy", "reward_mean"} and set(df["run_id"]) == {c.run_id}


def test_export_wide_csv_by_run_name_reads_back(filled):
    import io

    import pandas as pd

    db, curves, other, _ = filled
    c = other[0]
    r = cli("export", "--run", c.run_name, "--layout", "wide", "--db", db)
    assert r.exit_code == 0, r.output
    df = pd.read_csv(io.StringIO(r.stdout))
    assert list(df["step"]) == [s for s, _, _ in c.steps]
    assert list(df["samples"]) == [x for _, x, _ in c.steps]
    for rec, (_, _, vals) in zip(df.itertuples(index=False), c.steps, strict=True):
        assert same(rec.reward_mean, vals["reward_mean"])
        assert same(rec.entropy, vals["entropy"])
        assert rec.sweep == "other" and rec.batch_samples == 32


def test_runs_show_json_summary_matches_the_curve(filled):
    db, curves, _, _ = filled
    c = curves[0]
    r = cli("runs", "show", c.run_id, "--json", "--db", db)
    assert r.exit_code == 0, r.output
    rec = json.loads(r.stdout)
    assert rec["run"]["id"] == c.run_id and rec["run"]["sweep"] == "lrs"
    assert (rec["run"]["batch_prompts"], rec["run"]["group_size"], rec["run"]["batch_samples"],
            rec["run"]["lr"], rec["run"]["seed"]) == (c.prompts, c.group, c.batch, c.lr, c.seed)
    assert rec["config"]["ingest"]["format"] == "csv"
    assert [(e["from"], e["to"]) for e in rec["events"]] == [("planned", "completed")]
    assert sorted(rec["metrics"]) == sorted(KEYS)
    for key, m in rec["metrics"].items():
        pts = [(s, x, v[key]) for s, x, v in c.steps if key in v]
        finite_or_inf = [v for _, _, v in pts if not math.isnan(v)]
        hi = max(finite_or_inf)
        want = {"n": len(pts), "n_nan": sum(math.isnan(v) for _, _, v in pts),
                "first_step": pts[0][0], "last_step": pts[-1][0],
                "first_samples": pts[0][1], "last_samples": pts[-1][1],
                "min": min(finite_or_inf), "max": hi if math.isfinite(hi) else None,
                "last": pts[-1][2]}
        assert m == want, key
    assert rec["metrics"]["entropy"]["n_nan"] == 1 and rec["metrics"]["entropy"]["max"] is None


def test_runs_show_human_tables(filled):
    db, curves, _, _ = filled
    c = curves[0]
    r = cli("runs", "show", c.run_name, "--keys", "reward_mean,entropy", "--db", db)
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert f"run {c.run_id}: {c.run_name}" in out
    assert "64 prompts x 16 = 1,024 samples" in out
    last_samples = c.steps[-1][1]
    assert last_samples == 39_936 and "0-39,936" in out  # thousands separators
    assert "40 (1 nan)" in out and "inf" in out
    assert "reward_mean" in out and "accuracy" not in out.split("metrics (2 keys)")[1]
    assert "planned" in out and "completed" in out


def test_lists_name_sweeps_and_ids(filled):
    db, curves, other, _ = filled
    sweeps = json.loads(cli("sweeps", "list", "--json", "--db", db).stdout)
    assert [(s["id"], s["name"]) for s in sweeps] == [(1, "lrs"), (2, "other")]
    runs = json.loads(cli("runs", "list", "--json", "--db", db).stdout)
    assert {(r["id"], r["sweep"], r["sweep_id"]) for r in runs} == \
        {(c.run_id, "lrs", 1) for c in curves} | {(other[0].run_id, "other", 2)}
    table = cli("runs", "list", "--db", db).stdout  # not a terminal: full width, no "…"
    row = next(line for line in table.splitlines() if "p128-s1.csv" in line)
    assert [c.strip() for c in row.split("│")[1:-1]] == [
        str(curves[1].run_id), "lrs", curves[1].run_name, "csv", "128", "2,048", "0.00141", "1",
        "completed"]
    sweeps_table = cli("sweeps", "list", "--db", db).stdout
    assert "3 completed" in sweeps_table and "other" in sweeps_table


@pytest.mark.parametrize("args, needles", [
    (["runs", "show", "999"], ["no run with id 999"]),
    (["runs", "show", "1", "--keys", "reward_mean,nope"], ["--keys 'nope'", "reward_mean"]),
    (["export", "nosuch", "--out", "{out}.csv"], ["no sweep named 'nosuch'", "lrs, other"]),
    (["export", "--run", "999", "--out", "{out}.csv"], ["no run with id 999"]),
    (["export", "lrs", "--keys", "loss", "--out", "{out}.csv"],
     ["--keys 'loss'", "not logged by sweep lrs", "accuracy, entropy"]),
    (["export", "lrs", "--format", "xlsx", "--out", "{out}.csv"],
     ["--format 'xlsx'", "csv, parquet, jsonl"]),
    (["export", "lrs", "--layout", "tall", "--out", "{out}.csv"],
     ["--layout 'tall'", "long, wide"]),
    (["export", "lrs", "--format", "parquet"], ["parquet needs --out"]),
    (["export", "lrs", "--out", "{missing}/x.csv"], ["does not exist"]),
    (["export", "lrs", "--out", "{dir}"], ["is a directory"]),
    (["export", "lrs", "--run", "1", "--out", "{out}.csv"], ["not both"]),
    (["export", "--out", "{out}.csv"], ["name a SWEEP"]),
])
def test_bad_input_is_one_line_and_writes_nothing(filled, tmp_path, args, needles):
    db, _, _, _ = filled
    subs = {"out": tmp_path / "out", "missing": tmp_path / "missing", "dir": tmp_path}
    args = [a.format(**subs) for a in args]
    before = sorted(tmp_path.iterdir())
    r = cli(*args, "--db", db)
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.output and r.stdout == ""
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert sorted(tmp_path.iterdir()) == before  # no output file, no partial temp file


@pytest.mark.subprocess
def test_new_command_modules_import_nothing_heavy():
    """runs/sweeps/export import no pandas, pyarrow, sqlalchemy or numpy at top level."""
    import subprocess
    import sys

    code = ("import sys, twoclocks_cli.commands.runs, twoclocks_cli.commands.sweeps, "
            "twoclocks_cli.commands.export, twoclocks_cli.export; "
            "print([m for m in ('pandas', 'pyarrow', 'sqlalchemy', 'numpy') "
            "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).parents[2], check=True)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.postgres
def test_export_and_show_on_postgres(pg_url, tmp_path):
    """The same reads on PostgreSQL (a server-side cursor streams the export)."""
    import io

    import pandas as pd

    curves = [make_curve("g0", 16, 8, 0.002, 0, 30), make_curve("g1", 32, 8, 0.003, 1, 7)]
    ingest(pg_url, "pg", curves, tmp_path / "logs")
    r = cli("export", "pg", "--db", pg_url)
    assert r.exit_code == 0, r.output
    df = pd.read_csv(io.StringIO(r.stdout))
    assert_rows_equal(as_tuples(df, df.columns), expected_long(curves, "pg"))
    out = tmp_path / "w.parquet"
    assert cli("export", "pg", "--layout", "wide", "--out", out, "--db", pg_url).exit_code == 0
    wide = pd.read_parquet(out)
    assert len(wide) == 37 and list(wide["samples"][:3]) == [0, 128, 256]
    rec = json.loads(cli("runs", "show", curves[0].run_id, "--json", "--db", pg_url).stdout)
    m = rec["metrics"]["reward_mean"]
    assert (m["n"], m["last_step"], m["last_samples"], m["last"]) == (
        30, 29, 29 * 128, curves[0].steps[-1][2]["reward_mean"])
