"""`twoclocks train` refuses what its run would fail on before it writes the run row (one line,
exit 2, no row: read with sqlite3 itself), exits promptly when the model fails only while
loading, and sends a bug raised inside training to the crash log (exit 1) with its run marked
failed."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

from tests.support.cli import assert_one_line_error, twoclocks

pytestmark = pytest.mark.tiny_model

QUICK = ("sample_budget = 8\ngroup_size = 2\nprompts_per_batch = 2\nmax_new_tokens = 2\n"
         "eval_every_samples = 0\nkl_init_every = 0\nthreads = 1\ncheckpoint_every_steps = 0\n")


def _runs(db: Path) -> list[tuple]:
    """(id, status, error) of every run in the SQLite file, read without twoclocks."""
    if not db.exists():
        return []
    con = sqlite3.connect(db)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "runs" not in tables:
            return []
        return con.execute("SELECT id, status, error FROM runs ORDER BY id").fetchall()
    finally:
        con.close()


def _train(tmp_path: Path, toml: str, env: dict | None = None, timeout: float = 120):
    cfg = tmp_path / "t.toml"
    cfg.write_text(toml)
    db = tmp_path / "store.db"
    proc = twoclocks("train", str(cfg), "--db", f"sqlite:///{db}", "--workdir",
                     str(tmp_path / "work"), cwd=tmp_path, timeout=timeout,
                     env={"TWOCLOCKS_CRASH_DIR": str(tmp_path / "crashes"), **(env or {})})
    return proc, db


def _refused(tmp_path: Path, toml: str, *needles: str, env: dict | None = None) -> str:
    proc, db = _train(tmp_path, toml, env)
    line = assert_one_line_error(proc, *needles)
    assert _runs(db) == []
    assert not (tmp_path / "work").exists() and not (tmp_path / "twoclocks-train").exists()
    assert not (tmp_path / "crashes").exists()
    return line


def test_a_dataset_row_with_a_nul_character_is_refused(tmp_path):
    rows = [{"question": f"{i}+1", "answer": str(i + 1)} for i in range(20)]
    rows[7]["answer"] = "8\u0000"
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _refused(tmp_path, 'dataset = "p.jsonl"\neval_size = 4\n', "p.jsonl", "line 8",
             "column 'answer' contains a NUL character")


@pytest.mark.parametrize("template,needles", [
    ("{question} {oops}", ["unknown placeholder {oops}", "{question}"]),
    ("{question", ["not a format string"]),
    ("{}", ["unknown placeholder {}"]),
    ("plain", ["must contain {question}"]),
])
def test_a_prompt_template_has_one_placeholder(tmp_path, template, needles):
    _refused(tmp_path, f"prompt_template = {json.dumps(template)}\n", "prompt_template",
             *needles)


def test_a_model_that_cannot_load_is_refused_before_the_run_row(tmp_path):
    env = {"HF_HUB_CACHE": str(tmp_path / "hf"), "HF_HOME": str(tmp_path / "hfhome"),
           "HF_HUB_OFFLINE": "1"}
    line = _refused(tmp_path, 'model = "nosuchorg/nosuchmodel"\n', "key 'model'",
                    "not in the local cache", env=env)
    assert "without the network it cannot load" in line
    (tmp_path / "empty").mkdir()
    started = time.monotonic()
    _refused(tmp_path, f'model = "{tmp_path / "empty"}"\n', "has no config.json")
    assert time.monotonic() - started < 60  # it exits (refused before torch is even imported)
    _refused(tmp_path, 'model = "builtin:bogus"\n', "unknown built-in model")
    _refused(tmp_path, 'model = "/nonexistent/model"\n', "model path", "does not exist")


def test_a_from_sweep_the_store_lacks_is_refused_before_the_run_row(tmp_path):
    toml = ('batch_schedule = "adaptive"\n[adaptive]\nbatch_min = 2\nbatch_max = 8\n'
            'from_sweep = "nope"\n')
    _refused(tmp_path, toml, "adaptive.from_sweep", "no sweep named 'nope'",
             "twoclocks analyze nope --save")


def test_a_model_folder_that_fails_only_while_loading_exits_promptly(tmp_path):
    """config.json, weights and tokenizer files are there but are no model: only the loader
    finds out, after the run row was written; the run is failed and the process exits."""
    folder = tmp_path / "fake"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"not safetensors")
    (folder / "tokenizer.json").write_text("{}")
    started = time.monotonic()
    proc, db = _train(tmp_path, f'model = "{folder}"\n' + QUICK, timeout=120)
    assert time.monotonic() - started < 120
    line = assert_one_line_error(proc, f"model '{folder}': cannot load")
    assert "internal error" not in line
    (run,) = _runs(db)
    assert run[1] == "failed" and "cannot load" in run[2]


def test_a_bug_inside_training_goes_to_the_crash_log(tmp_path, tiny_model):
    """A user reward that raises AttributeError: not a project error, so a bug (exit 1, one
    line naming the log with the traceback), and its run is failed with the error."""
    (tmp_path / "mymod.py").write_text(
        "def fn(completions, problems):\n    return completions.no_such_attribute\n")
    proc, db = _train(tmp_path, 'reward = "mymod:fn"\n' + QUICK, timeout=600)
    line = assert_one_line_error(proc, "internal error", "AttributeError", "no_such_attribute",
                                 code=1)
    logs = list((tmp_path / "crashes").glob("twoclocks-crash-*.log"))
    assert len(logs) == 1 and str(logs[0]) in line
    text = logs[0].read_text()
    assert "Traceback (most recent call last)" in text and "mymod.py" in text
    assert "AttributeError" in text and "no_such_attribute" in text
    (run,) = _runs(db)
    assert run[1] == "failed" and run[2].startswith("AttributeError:")
