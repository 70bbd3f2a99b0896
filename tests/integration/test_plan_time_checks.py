"""What a sweep's cells will need is checked by `plan` and by `sweep` before anything is written:
the grpo trainer's model, datasets and their rows, reward module, rollout engine and prompt
template, and an adaptive cell's `from_sweep` in the store the sweep uses. Each refusal is one
line, exit 2; the store, read with sqlite3 itself, holds no sweep and no run afterwards."""

from __future__ import annotations

import importlib.util
import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import assert_one_line_error, twoclocks

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

SWEEP = """name = "needs"
backend = "grpo"
sample_budget = 4096
executor = "debug"
workdir = "{workdir}"
[scaling]
reference_batch = 64
reference_lr = 1e-4
[grid]
batch = [2, 4]
group_size = 8
[trainer]
max_new_tokens = 8
{extra}
"""


def _rows(db: Path) -> tuple[int, int]:
    """(sweeps, runs) in the SQLite file, read without twoclocks; (0, 0) when there is none."""
    if not db.exists():
        return 0, 0
    con = sqlite3.connect(db)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "sweeps" not in tables:
            return 0, 0
        return (con.execute("SELECT count(*) FROM sweeps").fetchone()[0],
                con.execute("SELECT count(*) FROM runs").fetchone()[0])
    finally:
        con.close()


def _config(tmp_path: Path, extra: str) -> Path:
    cfg = tmp_path / "cfg" / "sweep.toml"
    cfg.parent.mkdir(exist_ok=True)
    cfg.write_text(SWEEP.format(workdir=tmp_path / "runs", extra=extra))
    return cfg


def _refused(tmp_path: Path, extra: str, *needles: str, env: dict | None = None) -> str:
    """`plan` and `sweep` both refuse the config in one line; nothing is written."""
    cfg = _config(tmp_path, extra)
    db = tmp_path / "store.db"
    line = assert_one_line_error(twoclocks("plan", str(cfg), cwd=tmp_path, env=env, timeout=120),
                                 *needles)
    proc = twoclocks("sweep", str(cfg), "--db", f"sqlite:///{db}", "--executor", "debug",
                     cwd=tmp_path, env=env, timeout=120)
    assert assert_one_line_error(proc, *needles) == line
    assert _rows(db) == (0, 0)
    assert not (tmp_path / "runs").exists()
    return line


def _model_folder(path: Path, *files: str) -> Path:
    """A folder with the named files (config.json a JSON object, the rest placeholders)."""
    path.mkdir(parents=True)
    for name in files:
        (path / name).write_text("{}" if name.endswith(".json") else "x")
    return path


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


CASES = [
    ('model = "/nonexistent/model"', ["trainer.model", "/nonexistent/model", "does not exist"]),
    ('dataset = "/nonexistent/data.jsonl"', ["trainer.dataset", "/nonexistent/data.jsonl",
                                              "not found"]),
    ('model = "builtin:bogus"', ["trainer.model", "unknown built-in model", "builtin:tiny-arith"]),
    ('dataset = "builtin:bogus"', ["trainer.dataset", "unknown built-in dataset",
                                   "builtin:arithmetic"]),
    ('reward = "nomodule_xyz:fn"', ["trainer.reward", "nomodule_xyz", "not importable"]),
    ('eval_dataset = "/nonexistent/eval.csv"', ["trainer.eval_dataset", "not found"]),
    ('dataset = "notes.txt"', ["trainer.dataset", "unsupported dataset file type '.txt'"]),
    ('prompt_template = "{question} {oops}"', ["trainer.prompt_template",
                                               "unknown placeholder {oops}"]),
    ('arith_min_value = -3', ["arithmetic task", "min_value"]),
]


@pytest.mark.parametrize("extra,needles", CASES, ids=[c[0].split(" =")[0] + str(i)
                                                     for i, c in enumerate(CASES)])
def test_what_a_cell_needs_is_checked_before_anything_is_written(tmp_path, extra, needles):
    _refused(tmp_path, extra, *needles)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_the_vllm_engine_needs_vllm(tmp_path):
    _refused(tmp_path, 'rollout_engine = "vllm"', "trainer.rollout_engine", "vllm extra")


def test_a_model_folder_needs_config_weights_and_tokenizer(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    _refused(tmp_path, f'model = "{empty}"', "trainer.model", "has no config.json")
    bare = _model_folder(tmp_path / "bare", "config.json")
    _refused(tmp_path, f'model = "{bare}"', "holds no weights")
    untok = _model_folder(tmp_path / "untok", "config.json", "model.safetensors")
    _refused(tmp_path, f'model = "{untok}"', "holds no tokenizer files")
    bad = _model_folder(tmp_path / "bad", "model.safetensors", "tokenizer.json")
    (bad / "config.json").write_text("[1, 2")
    _refused(tmp_path, f'model = "{bad}"', "config.json is not a readable JSON object")
    whole = _model_folder(tmp_path / "whole", "config.json", "model.safetensors",
                          "tokenizer.json")
    cfg = _config(tmp_path, f'model = "{whole}"')
    assert twoclocks("plan", str(cfg), cwd=tmp_path).returncode == 0


def test_a_hub_id_plans_only_from_the_local_cache(tmp_path):
    """Offline a hub id loads only from the cache: not there, it is refused, saying so."""
    cache = tmp_path / "hf"
    env = {"HF_HUB_CACHE": str(cache), "HF_HOME": str(tmp_path / "hfhome"),
           "HF_HUB_OFFLINE": "1"}
    line = _refused(tmp_path, 'model = "someorg/some-model"', "trainer.model",
                    "not in the local cache", str(cache), "hf download someorg/some-model",
                    env=env)
    assert "cannot be checked here" in line
    _refused(tmp_path, 'model = "a--b"', "neither an existing folder nor a Hugging Face hub id",
             env=env)
    # the layout huggingface_hub writes: refs/main names the snapshot holding config.json
    repo = cache / "models--someorg--some-model"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    (repo / "snapshots" / ("0" * 40)).mkdir(parents=True)
    (repo / "snapshots" / ("0" * 40) / "config.json").write_text("{}")
    proc = twoclocks("plan", str(_config(tmp_path, 'model = "someorg/some-model"')),
                     "--json", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert {c["config"]["model"] for c in json.loads(proc.stdout)["cells"]} == \
        {"someorg/some-model"}
    # online, an id not cached here plans: the cells' nodes may download it
    online = {k: v for k, v in env.items() if k != "HF_HUB_OFFLINE"}
    proc = twoclocks("plan", str(_config(tmp_path, 'model = "otherorg/other-model"')),
                     cwd=tmp_path, env={**online, "HF_HUB_OFFLINE": "0"})
    assert proc.returncode == 0, proc.stderr


def test_an_hf_dataset_plans_only_from_a_folder_or_the_local_cache(tmp_path):
    if importlib.util.find_spec("datasets") is None:
        _refused(tmp_path, 'dataset = "hf:someorg/data"', "needs the `datasets` package")
        return
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_DATASETS_CACHE": str(tmp_path / "ds"),
           "HF_HUB_OFFLINE": "1"}
    _refused(tmp_path, 'dataset = "hf:someorg/data"', "trainer.dataset", "neither local cache",
             "hf download --repo-type dataset someorg/data", env=env)
    _refused(tmp_path, f'dataset = "hf:{tmp_path / "nowhere"}"', "does not exist", env=env)
    # the datasets library's own cache holds it: offline it loads from there
    (tmp_path / "ds" / "someorg___data").mkdir(parents=True)
    cfg = _config(tmp_path, 'dataset = "hf:someorg/data"')
    assert twoclocks("plan", str(cfg), cwd=tmp_path, env=env).returncode == 0
    # online, an id not cached here plans: the runs may download it
    cfg = _config(tmp_path, 'dataset = "hf:otherorg/data"')
    online = twoclocks("plan", str(cfg), cwd=tmp_path, env={**env, "HF_HUB_OFFLINE": "0"})
    assert online.returncode == 0, online.stderr


def test_every_row_of_a_dataset_file_is_read_at_plan_time(tmp_path):
    good = [{"question": f"{i}+1", "answer": str(i + 1)} for i in range(300)]
    nul = _jsonl(tmp_path / "nul.jsonl", [*good, {"question": "1\u00002", "answer": "3"}])
    _refused(tmp_path, f'dataset = "{nul}"', "nul.jsonl", "line 301", "NUL character")
    short = _jsonl(tmp_path / "short.jsonl", good[:10])
    _refused(tmp_path, f'dataset = "{short}"', "10 rows", "eval_size = 256")
    keyless = _jsonl(tmp_path / "keyless.jsonl", [{"q": "1+1", "answer": "2"}] * 300)
    _refused(tmp_path, f'dataset = "{keyless}"', "missing column 'question'")


def test_a_relative_dataset_path_is_read_from_the_config_folder(tmp_path):
    """A cell runs in a folder of its own: its dataset path is the one the check read."""
    cfg = _config(tmp_path, 'dataset = "data.jsonl"')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _jsonl(elsewhere / "data.jsonl", [{"question": "1+1", "answer": "2"}] * 300)  # not this one
    line = assert_one_line_error(twoclocks("plan", str(cfg), cwd=elsewhere),
                                 f"{cfg.parent / 'data.jsonl'}: dataset file not found")
    assert "elsewhere" not in line
    _jsonl(cfg.parent / "data.jsonl", [{"question": "1+1", "answer": "2"}] * 300)
    proc = twoclocks("plan", str(cfg), "--json", cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    assert {c["config"]["dataset"] for c in json.loads(proc.stdout)["cells"]} == \
        {str(cfg.parent / "data.jsonl")}


def test_plan_checks_without_importing_torch(tmp_path):
    cfg = _config(tmp_path, 'model = "/nonexistent/model"')
    (tmp_path / "ok").mkdir()
    ok = _config(tmp_path / "ok", "")
    code = ("import sys\nfrom twoclocks_cli.config import load_plan\n"
            "from twoclocks_cli.core.errors import ConfigError\n"
            f"load_plan({str(ok)!r})\n"
            f"try:\n    load_plan({str(cfg)!r})\nexcept ConfigError:\n    pass\n"
            "print(sorted(m for m in ('torch', 'transformers', 'datasets') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr)


# --- adaptive cells: the sweep they calibrate from ---------------------------------------------

def _example(tmp_path: Path, name: str) -> Path:
    text = (EXAMPLES / name).read_text()
    text = text.replace('executor = "local"', 'executor = "debug"')
    text = re.sub(r"sample_budget = \d+", "sample_budget = 8192", text)
    text = text.replace('workdir = "twoclocks-runs"', f'workdir = "{tmp_path / "runs"}"')
    out = tmp_path / name
    out.write_text(text)
    return out


def test_sweep_refuses_a_from_sweep_its_store_lacks_or_has_not_analysed(tmp_path):
    db = tmp_path / "store.db"
    url = f"sqlite:///{db}"
    adaptive = _example(tmp_path, "sim-adaptive.toml")
    assert twoclocks("plan", str(adaptive), cwd=tmp_path).returncode == 0  # plan has no store
    proc = twoclocks("sweep", str(adaptive), "--db", url, cwd=tmp_path)
    assert_one_line_error(proc, "sim.adaptive.from_sweep", "'sim-demo'", "no sweep named",
                          "twoclocks analyze sim-demo --save")
    assert _rows(db) == (0, 0)
    demo = _example(tmp_path, "sim-sweep.toml")
    done = twoclocks("sweep", str(demo), "--db", url, "--wait", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    before = _rows(db)
    proc = twoclocks("sweep", str(adaptive), "--db", url, cwd=tmp_path)
    assert_one_line_error(proc, "sim.adaptive.from_sweep", "no stored analysis",
                          "twoclocks analyze sim-demo --save")
    assert _rows(db) == before  # sim-demo alone: no adaptive sweep, no adaptive run
    con = sqlite3.connect(db)
    assert [r[0] for r in con.execute("SELECT name FROM sweeps")] == ["sim-demo"]
    con.close()
