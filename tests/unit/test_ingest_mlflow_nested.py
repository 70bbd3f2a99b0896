"""`twoclocks ingest` of MLflow stores with nested runs, written here by the real mlflow library
as a nested sweep writes them (tests/support/mlflow_family.py: a parent run holding params only,
runs started under it with `mlflow.start_run(nested=True)` logging metrics by step, as HF's
MLflowCallback does with MLFLOW_NESTED_RUN); `--run` by a run's own name. A damaged or older
store refused by the real CLI process is tests/integration/test_ingest_mlflow_damaged.py's."""

from __future__ import annotations

import json
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

from tests.support.cli import assert_one_line_error, twoclocks_inproc
from tests.support.mlflow_family import STEPS, content, digest, ingest, reward, write_family
from twoclocks_cli.ingest import scalars
from twoclocks_cli.ingest.base import IngestOptions

pytest.importorskip("mlflow")


@pytest.fixture(scope="module")
def family(tmp_path_factory) -> Path:
    """The nested MLflow sweep of tests/support/mlflow_family.py, written once."""
    return write_family(tmp_path_factory.mktemp("mlflow") / "mlflow.db")


def stored(url: str) -> dict[str, dict]:
    """run name -> its columns, config and {step: (samples, reward_mean)}, read with sqlite3."""
    con = sqlite3.connect(url[len("sqlite:///"):])
    try:
        runs = {}
        for rid, name, p, g, lr, seed, config, status in con.execute(
                "select id, name, batch_prompts, group_size, lr, seed, config, status from runs"):
            steps = {s: (n, v) for s, n, v in con.execute(
                "select step, samples, value from metrics where run_id = ? and key = "
                "'reward_mean'", (rid,))}
            runs[name] = {"columns": (p, g, lr, seed), "config": json.loads(config),
                          "status": status, "steps": steps}
        return runs
    finally:
        con.close()


def test_the_runs_under_a_params_only_parent_import_each_with_its_params(family, tmp_path):
    url = f"sqlite:///{tmp_path / 'tc.db'}"
    before = digest(family)
    code, results, err = ingest(family, url, "--experiment", "sweep")
    assert code == 0, err
    assert [r["run"] for r in results] == ["sweep/grpo-bs4", "sweep/grpo-bs8"]
    bs4, bs8 = results
    # its own params: TRL's per-device count -> 32 completions / 8 = 4 prompts
    assert (bs4["batch_prompts"], bs4["group_size"], bs4["lr"], bs4["seed"]) == \
        (4, 8, 2.0 ** -11, 42)
    assert all("parent" not in v for v in bs4["params_from"].values())
    # its batch is its own; group size, lr and seed are the parent's, and say so
    assert (bs8["batch_prompts"], bs8["group_size"], bs8["lr"], bs8["seed"]) == \
        (8, 8, 2.0 ** -10, 7)
    assert bs8["params_from"] == {
        "batch_prompts": "MLflow params (prompts_per_batch)",
        "group_size": "MLflow params of the parent run sweep/hf-sweep (num_generations)",
        "lr": "MLflow params of the parent run sweep/hf-sweep (learning_rate)",
        "seed": "MLflow params of the parent run sweep/hf-sweep (seed)"}
    assert any(n.startswith("group_size = 8 (num_generations), lr = 0.0009765625 "
                            "(learning_rate), seed = 7 (seed): from the params of the parent "
                            "run sweep/hf-sweep") for n in bs8["notes"]), bs8["notes"]
    left_out = ("the parent run sweep/hf-sweep is not imported as a run of its own: it logged "
                "no step of its own; the runs under it did")
    assert left_out in bs4["notes"] and left_out in bs8["notes"]
    runs = stored(url)
    assert sorted(runs) == ["sweep/grpo-bs4", "sweep/grpo-bs8"]
    for name, p, g, lr, seed in (("grpo-bs4", 4, 8, 2.0 ** -11, 42),
                                 ("grpo-bs8", 8, 8, 2.0 ** -10, 7)):
        run = runs[f"sweep/{name}"]
        assert run["columns"] == (p, g, lr, seed)
        assert run["status"] == "completed"
        assert run["steps"] == {s: (s * p * g, reward(name, s))
                                for s in range(1, STEPS[name] + 1)}
    assert digest(family) == before  # only read


def test_an_option_overrides_a_parents_param_and_is_credited_as_the_option(family, tmp_path):
    code, results, err = ingest(family, f"sqlite:///{tmp_path / 'tc.db'}", "--run",
                                "sweep/grpo-bs8", "--seed", "5")
    assert code == 0, err
    (bs8,) = results
    assert (bs8["group_size"], bs8["lr"], bs8["seed"]) == (8, 2.0 ** -10, 5)
    assert bs8["params_from"]["seed"] == "option"
    assert bs8["params_from"]["lr"] == \
        "MLflow params of the parent run sweep/hf-sweep (learning_rate)"
    credited = [n for n in bs8["notes"] if "from the params of the parent run" in n]
    assert credited == ["group_size = 8 (num_generations), lr = 0.0009765625 (learning_rate): "
                        "from the params of the parent run sweep/hf-sweep (not logged by this "
                        "run itself)"]
    assert "--seed 5 overrides 7 from the MLflow params of the parent run sweep/hf-sweep " \
        "(seed)" in bs8["notes"]


def test_importing_again_changes_nothing(family, tmp_path):
    url = f"sqlite:///{tmp_path / 'tc.db'}"
    assert ingest(family, url, "--experiment", "sweep")[0] == 0
    once = content(url)
    code, results, err = ingest(family, url, "--experiment", "sweep")
    assert code == 0, err
    assert [r["action"] for r in results] == ["unchanged", "unchanged"]
    assert content(url) == once


def test_a_parent_outside_the_filter_still_gives_its_params(family, tmp_path):
    """--filter leaves the parent out of the listing: it is fetched by its id for its params."""
    code, results, err = ingest(family, f"sqlite:///{tmp_path / 'tc.db'}", "--filter",
                                "params.prompts_per_batch = '8'")
    assert code == 0, err
    assert [r["run"] for r in results] == ["sweep/grpo-bs8"]
    assert (results[0]["group_size"], results[0]["lr"], results[0]["seed"]) == (8, 2.0 ** -10, 7)
    assert not any("not imported as a run" in n for n in results[0]["notes"])


@pytest.mark.parametrize("glob, expected", [
    ("grpo-*", ["sweep/grpo-bs4", "sweep/grpo-bs8", "other/grpo-bs4"]),  # own names
    ("grpo-bs4", ["sweep/grpo-bs4", "other/grpo-bs4"]),
    ("sweep/grpo-bs4", ["sweep/grpo-bs4"]),  # experiment/run
    ("other/*", ["other/grpo-bs4"]),
    ("*bs8", ["sweep/grpo-bs8"]),
])
def test_run_globs_match_a_runs_own_name_and_experiment_slash_run(family, tmp_path, glob,
                                                                  expected):
    url = f"sqlite:///{tmp_path / 'tc.db'}"
    code, results, err = ingest(family, url, "--run", glob)
    assert code == 0, err
    assert sorted(r["run"] for r in results) == sorted(expected)
    assert sorted(stored(url)) == sorted(expected)
    other = [r for r in results if r["run"] == "other/grpo-bs4"]
    if other:
        assert (other[0]["batch_prompts"], other[0]["group_size"], other[0]["lr"]) == \
            (16, 4, 2.0 ** -9)
        assert stored(url)["other/grpo-bs4"]["steps"] == {
            s: (s * 64, reward("other", s)) for s in range(1, STEPS["other"] + 1)}


def test_a_parent_chosen_alone_is_refused_naming_its_runs(family, tmp_path):
    url = f"sqlite:///{tmp_path / 'tc.db'}"
    assert ingest(family, url, "--run", "other/*")[0] == 0
    before = content(url)
    r = twoclocks_inproc("ingest", str(family), "--run", "hf-sweep", "--sweep", "nested",
                         "--db", url)
    assert_one_line_error(r, "run sweep/hf-sweep is a parent run: it logged no step of its own",
                          "sweep/grpo-bs4, sweep/grpo-bs8", "--run names them")
    assert content(url) == before


def test_a_glob_on_the_parent_and_its_runs_leaves_the_parent_out(family, tmp_path):
    code, results, err = ingest(family, f"sqlite:///{tmp_path / 'tc.db'}", "--run", "sweep/*")
    assert code == 0, err
    assert [r["run"] for r in results] == ["sweep/grpo-bs4", "sweep/grpo-bs8"]


@pytest.mark.parametrize("names, glob, expected", [
    # TensorBoard runs are folder paths: a glob matches the path or its last folders
    (["bs32/seed0", "bs64/seed0", "bs64/seed1"], "seed0", ["bs32/seed0", "bs64/seed0"]),
    (["bs32/seed0", "bs64/seed0", "bs64/seed1"], "bs64/*", ["bs64/seed0", "bs64/seed1"]),
    (["bs32/seed0", "bs64/seed0"], "s*0", ["bs32/seed0", "bs64/seed0"]),
    # W&B runs: a plain name, or the id
    (["bs32", "bs64"], "bs6?", ["bs64"]),
    (["bs32", "bs64"], "id-bs32", ["bs32"]),
])
def test_run_globs_on_other_sources_match_the_name_and_its_tails(names, glob, expected):
    runs = [scalars.TrackedRun(key=f"id-{n}", name=n, sha256="", size=0) for n in names]
    chosen = scalars.select_runs("src", runs, IngestOptions(runs=(glob,)))
    assert [r.name for r in chosen] == expected


def test_no_match_names_the_runs(family, tmp_path):
    r = twoclocks_inproc("ingest", str(family), "--run", "bs99", "--db",
                         f"sqlite:///{tmp_path / 'tc.db'}")
    assert_one_line_error(r, "no run matches --run bs99", "sweep/hf-sweep, sweep/grpo-bs4")


@pytest.fixture(scope="module")
def crashed(family, tmp_path_factory) -> Path:
    """The family's store with one more run in 'sweep' that logged params and no step (it
    crashed before its first step), and no run under it."""
    from mlflow.tracking import MlflowClient

    db = tmp_path_factory.mktemp("crashed") / "mlflow.db"
    shutil.copy(family, db)
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name("sweep").experiment_id
    run = client.create_run(exp, run_name="grpo-bs16")
    client.log_param(run.info.run_id, "prompts_per_batch", "16")
    client.set_terminated(run.info.run_id, "FAILED")
    return db


def test_a_run_without_steps_or_runs_under_it_is_refused_as_before(crashed, tmp_path):
    url = f"sqlite:///{tmp_path / 'tc.db'}"
    assert ingest(crashed, url, "--run", "other/*")[0] == 0
    before = content(url)
    r = twoclocks_inproc("ingest", str(crashed), "--experiment", "sweep", "--db", url)
    assert_one_line_error(r, "(run sweep/grpo-bs16): no step was logged")
    assert content(url) == before


def test_skip_bad_leaves_out_only_the_run_without_steps(crashed, tmp_path):
    url = f"sqlite:///{tmp_path / 'tc.db'}"
    code, results, err = ingest(crashed, url, "--experiment", "sweep", "--skip-bad")
    assert code == 0, err
    by_run = {r["run"]: r for r in results}
    assert sorted(by_run) == ["sweep/grpo-bs16", "sweep/grpo-bs4", "sweep/grpo-bs8"]
    skipped = by_run["sweep/grpo-bs16"]
    assert skipped["action"] == "skipped" and skipped["run_id"] is None
    assert "(run sweep/grpo-bs16): no step was logged" in skipped["notes"][0]
    assert [by_run[n]["action"] for n in ("sweep/grpo-bs4", "sweep/grpo-bs8")] == \
        ["created", "created"]
    runs = stored(url)
    assert sorted(runs) == ["sweep/grpo-bs4", "sweep/grpo-bs8"]
    assert runs["sweep/grpo-bs8"]["steps"] == {s: (s * 64, reward("grpo-bs8", s))
                                              for s in range(1, STEPS["grpo-bs8"] + 1)}
    r = twoclocks_inproc("ingest", str(crashed), "--experiment", "sweep", "--skip-bad",
                         "--sweep", "nested", "--db", url)
    assert r.returncode == 0, r.stderr
    assert "skipped (--skip-bad)" in r.stdout and "sweep/grpo-bs16" in r.stdout


def test_skip_bad_with_only_runs_without_steps_skips_everything(crashed, tmp_path):
    url = f"sqlite:///{tmp_path / 'tc.db'}"
    r = twoclocks_inproc("ingest", str(crashed), "--run", "grpo-bs16", "--skip-bad",
                         "--db", url)
    assert_one_line_error(r, "every file was skipped", "(run sweep/grpo-bs16): no step")


def test_without_the_mlflow_package_the_store_is_refused_in_one_line(family, tmp_path,
                                                                      monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # `import mlflow` fails
    r = twoclocks_inproc("ingest", str(family), "--db", f"sqlite:///{tmp_path / 'tc.db'}")
    assert_one_line_error(r, "reading an MLflow store needs the mlflow package",
                          "pip install -e '.[sources]'")
