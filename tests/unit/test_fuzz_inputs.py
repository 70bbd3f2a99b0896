"""Invalid-by-construction inputs through the real CLI (hypothesis, seeded, bounded in time).

Every case is an input the CLI must refuse: exactly one line on stderr (`error: ...`), exit code
2 (a project error: a traceback's exit 1 fails the case), no traceback, and the store it was
pointed at byte-for-byte the same (SQLite dump before/after). Cases: sweep configs (`plan` and
`sweep`), training configs (`train`; each is first checked to fail validation, so no case can
ever start training), database URLs across commands, and import files (CSV, JSONL, TRL) whose
steps, sample counts or values the store cannot hold. tests/unit/test_sweep_config_fuzz.py
mutates configs into valid and invalid ones alike; this suite only builds invalid ones.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import tests.unit.test_sweep_config_fuzz as mutate_fuzz  # its TOML writer, not its test
from twoclocks_cli.app import app

pytestmark = pytest.mark.slow

FUZZ = settings(derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
I32, I64 = 2**31 - 1, 2**63 - 1
PASSWORD = "pw-never-shown"


# --- a store with data in it, and the checks every case makes --------------------------------

@pytest.fixture(scope="module")
def seeded(tmp_path_factory) -> Path:
    """A twoclocks SQLite store holding one sweep, one run and a few metric rows."""
    from twoclocks_cli.store import Run, Store, Sweep

    path = tmp_path_factory.mktemp("seed") / "store.db"
    store = Store.open(f"sqlite:///{path}")
    with store.session() as s:
        sweep = Sweep(name="kept", backend="sim", config={"name": "kept"})
        s.add(sweep)
        s.flush()
        run = Run(sweep_id=sweep.id, cell_id="c0", name="r0", backend="sim", batch_prompts=4,
                  group_size=8, batch_samples=32, lr=1e-3, seed=0, config={})
        s.add(run)
        s.flush()
        run_id = run.id
    with store.metric_writer(run_id) as w:
        for step in range(5):
            w.log(step, 32 * step, {"reward_mean": step / 10})
    store.close()
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return path


def _dump(path: Path) -> list[str]:
    con = sqlite3.connect(path)
    try:
        return list(con.iterdump())
    finally:
        con.close()


class Case:
    """A scratch folder with a copy of the seeded store; runs the CLI there, checks a refusal."""

    def __init__(self, root: Path, seeded: Path):
        self.root = root
        self.db = root / "store.db"
        shutil.copy(seeded, self.db)
        self.url = f"sqlite:///{self.db}"
        self.before = _dump(self.db)

    def refuses(self, args: list[str], *needles: str, what: object = None) -> str:
        here = os.getcwd()
        os.chdir(self.root)  # a default ./twoclocks.db or workdir would land here
        try:
            result = CliRunner().invoke(app, args, env={  # offline: an uncached hub id is refused
                "TWOCLOCKS_CRASH_DIR": str(self.root / "crashes"), "HF_HUB_OFFLINE": "1"})
        finally:
            os.chdir(here)
        context = (args, what, result.output[-2000:])
        assert result.exception is None or isinstance(result.exception, SystemExit), \
            (context, repr(result.exception))
        assert result.exit_code == 2, context
        assert "Traceback" not in result.output, context
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), context
        assert PASSWORD not in result.output, context
        for needle in needles:
            assert needle in lines[0], (needle, context)
        assert _dump(self.db) == self.before, context
        assert not (self.root / "twoclocks.db").exists(), context
        return lines[0]


def _case(tmp_path_factory, seeded) -> Case:
    return Case(tmp_path_factory.mktemp("case"), seeded)


def _typo(name: str) -> st.SearchStrategy[str]:
    """`name` with one letter doubled or dropped (still letters, so TOML keeps it bare)."""
    return st.integers(0, len(name) - 1).flatmap(lambda i: st.sampled_from(
        [name[:i] + name[i] + name[i:], name[:i] + name[i + 1:] or name + "x"]))


NONFINITE = st.sampled_from([float("inf"), float("-inf"), float("nan")])
HUGE_INT = st.one_of(st.integers(I32 + 1, I64), st.integers(I64 + 1, 10**30))
NOT_A_NUMBER = st.one_of(st.booleans(), st.text("0123456789.e", min_size=1, max_size=5))
NOT_AN_INT = st.one_of(NOT_A_NUMBER, st.floats(0.5, 1e6).filter(lambda x: x != int(x)))


# --- sweep configs ---------------------------------------------------------------------------

SIM_BASE = {
    "name": "fz", "backend": "sim", "sample_budget": 512, "executor": "debug",
    "scaling": {"reference_batch": 64, "reference_lr": 0.01, "rule": "sqrt"},
    "grid": {"batch": [2, 4], "group_size": 8, "seeds": [0], "clip_low": 0.2},
    "sim": {"dim": 4, "flat_dims": 4, "checkpoint_every": 50},
}
GRPO_BASE = {
    "name": "fg", "backend": "grpo", "sample_budget": 4096, "executor": "debug",
    "scaling": {"reference_batch": 64, "reference_lr": 1e-4},
    "grid": {"batch": [2, 4], "group_size": 8}, "trainer": {"max_new_tokens": 8},
}
SIM_KEYS = ["dim", "flat_dims", "sigma", "log_every", "eval_every", "checkpoint_every",
            "beta1", "adam_eps", "theta0", "micro_fraction", "optimizer"]
TRAIN_FLOATS = ["lr", "temperature", "top_p", "kl_coef", "weight_decay", "adam_epsilon",
                "max_grad_norm", "eval_temperature", "clip_eps_high"]
TRAIN_INTS = ["group_size", "max_new_tokens", "micro_batch_size", "ppo_epochs", "eval_size",
              "num_minibatches", "checkpoint_every_steps", "seed", "tiny_seed"]
URL_BAD = ["postgresql://u:" + PASSWORD + "@127.0.0.1:abc/db", "mysql://u@h/d", "", " ",
           "sqlite+aiosqlite:///x.db", "postgresql://u@h:0/d", "nonsense"]


def _set(doc: dict, path: tuple, value) -> dict:
    table = doc
    for key in path[:-1]:
        table = table.setdefault(key, {})
    table[path[-1]] = value
    return doc


SWEEP_MUTATIONS = st.one_of(
    # numbers of the wrong type, out of the store's range, or not finite
    st.tuples(st.sampled_from([("sample_budget",), ("scaling", "reference_batch"),
                               ("local", "threads_per_job"), ("min_steps",),
                               ("slurm", "timeout_min")]), st.one_of(NOT_AN_INT, HUGE_INT)),
    st.tuples(st.sampled_from([("scaling", "reference_lr"), ("scaling", "adam_eps"),
                               ("grid", "clip_low"), ("local", "timeout_min")]),
              st.one_of(NONFINITE, NOT_A_NUMBER)),
    st.tuples(st.just(("scaling", "rule")), st.one_of(NONFINITE, st.floats(4.01, 1e308),
                                                      st.text("abc", min_size=1, max_size=4))),
    st.tuples(st.just(("grid", "seeds")), st.lists(st.one_of(HUGE_INT, st.integers(-10**6, -1)),
                                                   min_size=1, max_size=2)),
    st.tuples(st.just(("grid", "batch")), st.lists(HUGE_INT, min_size=1, max_size=2)),
    # batch ranges that cannot terminate quickly or overflow
    st.tuples(st.just(("grid", "batch")), st.fixed_dictionaries({
        "start": st.integers(1, 8), "stop": st.integers(64, I32),
        "factor": st.one_of(st.floats(1 + 1e-12, 1 + 1e-4), NONFINITE)})),
    # grids too large
    st.tuples(st.just(("grid", "seeds")), st.integers(5001, 20000).map(lambda n: list(range(n)))),
    # unknown keys (typos) in every table
    st.tuples(st.sampled_from(["sample_budget", "executor", "workdir"]).flatmap(_typo)
              .map(lambda k: (k,)), st.just(1)),
    st.tuples(st.sampled_from(["reference_lr", "reference_batch", "rule"]).flatmap(_typo)
              .map(lambda k: ("scaling", k)), st.just(1)),
    st.tuples(st.sampled_from(SIM_KEYS).flatmap(_typo).map(lambda k: ("sim", k)), st.just(1)),
    st.tuples(st.sampled_from(SIM_KEYS).flatmap(_typo).map(lambda k: ("grid", "sim", k)),
              st.just([1, 2])),
    # the sim table's own types and ranges
    st.tuples(st.sampled_from(["dim", "log_every", "eval_every", "checkpoint_every"])
              .map(lambda k: ("sim", k)), st.one_of(NOT_AN_INT, HUGE_INT, st.integers(-5, 0))),
    st.tuples(st.sampled_from(["sigma", "beta1", "adam_eps", "theta0", "micro_fraction"])
              .map(lambda k: ("sim", k)), st.one_of(NONFINITE, NOT_A_NUMBER, st.just(-1.0))),
    st.tuples(st.just(("sim", "log_every")), st.integers(257, I32)),  # > the cells' steps
    st.tuples(st.just(("grid", "sim", "sigma")), st.lists(NOT_A_NUMBER, min_size=1,
                                                          max_size=2, unique=True)),
    # paths and URLs
    st.tuples(st.just(("workdir",)), st.one_of(
        st.integers(256, 6000).map(lambda n: "w" * n),
        st.text("ab/", min_size=1, max_size=8).map(lambda t: t + "\x00"))),
    st.tuples(st.just(("store",)), st.sampled_from(URL_BAD)),
)

GRPO_MUTATIONS = st.one_of(
    st.tuples(st.sampled_from(TRAIN_FLOATS).map(lambda k: ("trainer", k)),
              st.one_of(NONFINITE, NOT_A_NUMBER)),
    st.tuples(st.sampled_from(TRAIN_INTS[1:]).map(lambda k: ("trainer", k)),
              st.one_of(NOT_AN_INT, HUGE_INT)),
    st.tuples(st.sampled_from(TRAIN_INTS[1:]).map(lambda k: ("grid", "trainer", k)),
              st.lists(NOT_AN_INT, min_size=1, max_size=2, unique=True)),
    st.tuples(st.sampled_from(TRAIN_FLOATS + TRAIN_INTS + ["model", "reward", "dataset"])
              .flatmap(_typo).map(lambda k: ("trainer", k)), st.just(1)),
    st.tuples(st.sampled_from([("trainer", "model"), ("trainer", "dataset")]),
              st.one_of(st.just(""), st.integers(256, 3000).map(lambda n: "m" * n))),
    st.tuples(st.just(("trainer", "reward")), st.text("abc -", min_size=1, max_size=6)),
    st.tuples(st.just(("trainer", "loss_agg")), st.text("xyz", min_size=1, max_size=4)),
)


@settings(FUZZ, max_examples=200)
@given(mutation=SWEEP_MUTATIONS)
def test_invalid_sweep_configs_are_refused_by_plan_and_sweep(tmp_path_factory, seeded, mutation):
    case = _case(tmp_path_factory, seeded)
    path, value = mutation
    doc = _set(copy.deepcopy(SIM_BASE), path, value)
    (case.root / "s.toml").write_text(mutate_fuzz.to_toml(doc))
    cfg = str(case.root / "s.toml")
    case.refuses(["plan", cfg], what=mutation)
    case.refuses(["sweep", cfg, "--db", case.url, "--executor", "debug"], what=mutation)
    assert not (case.root / "twoclocks-runs").exists()


@settings(FUZZ, max_examples=120)
@given(mutation=GRPO_MUTATIONS)
def test_invalid_grpo_cells_are_refused_by_plan(tmp_path_factory, seeded, mutation):
    """`plan` only: a case that wrongly passed would make `sweep` train a model."""
    case = _case(tmp_path_factory, seeded)
    path, value = mutation
    doc = _set(copy.deepcopy(GRPO_BASE), path, value)
    (case.root / "g.toml").write_text(mutate_fuzz.to_toml(doc))
    case.refuses(["plan", str(case.root / "g.toml")], what=mutation)


# --- what grpo cells need: the trainer keys that name a model, a file, a module or an engine ----

# values the check cannot pass, each with the phrase its one line says; "@..." values are files
# the test writes into the case's folder first (see _materialise)
_WORD = st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=8)
MODEL_VALUES = st.one_of(
    _WORD.map(lambda w: (f"/nonexistent-fz/{w}", "does not exist")),
    _WORD.map(lambda w: (f"./fz-missing-{w}", "does not exist")),
    _WORD.filter(lambda w: w != "tiny").map(lambda w: (f"builtin:{w}", "unknown built-in model")),
    st.tuples(_WORD, _WORD).map(lambda p: (f"fz-nocache-{p[0]}/{p[1]}", "not in the local cache")),
    st.sampled_from(["a--b", "a/..b", "x/y z"]).map(lambda v: (v, "neither an existing folder")),
    st.sampled_from([("@empty_dir", "has no config.json"), ("@config_only", "holds no weights"),
                     ("@no_tokenizer", "holds no tokenizer files"),
                     ("@bad_config", "not a readable JSON object"),
                     ("@a_file", "is not a directory")]),
)
DATASET_VALUES = st.one_of(
    st.tuples(_WORD, st.sampled_from([".jsonl", ".csv", ".parquet"]))
    .map(lambda p: (f"/nonexistent-fz/{p[0]}{p[1]}", "not found")),
    st.tuples(_WORD, st.sampled_from([".txt", ".json", "", ".jsonl.gz", ".tsv"]))
    .map(lambda p: (f"fz-{p[0]}{p[1]}", "unsupported dataset file type")),
    _WORD.filter(lambda w: w != "arithmetic")
    .map(lambda w: (f"builtin:{w}", "unknown built-in dataset")),
    _WORD.map(lambda w: (f"hf:/nonexistent-fz/{w}", "does not exist"
                         if importlib.util.find_spec("datasets") else "`datasets` package")),
    st.sampled_from([("@nul_rows", "NUL character"), ("@folder.jsonl", "not a file"),
                     ("@missing_column", "missing column 'question'"),
                     ("@not_json", "not valid JSON")]),
)
REWARD_VALUES = st.tuples(st.from_regex(r"fz_nomod_[a-z]{1,6}(\.[a-z]{1,4})?", fullmatch=True),
                          st.from_regex(r"[a-z_]{1,6}", fullmatch=True)) \
    .map(lambda p: (f"{p[0]}:{p[1]}", "not importable"))
TEMPLATE_VALUES = st.one_of(
    st.from_regex(r"[a-z]{1,8}", fullmatch=True).filter(lambda w: w != "question")
    .map(lambda w: ("{question} {" + w + "}", "unknown placeholder")),
    _WORD.map(lambda w: (w, "must contain {question}")),
    st.sampled_from([("{question", "not a format string"), ("{question:d}", "cannot be rendered"),
                     ("{}{question}", "unknown placeholder {}")]),
)
_NEEDS = [("model", MODEL_VALUES), ("dataset", DATASET_VALUES), ("eval_dataset", DATASET_VALUES),
          ("reward", REWARD_VALUES), ("prompt_template", TEMPLATE_VALUES)]
if importlib.util.find_spec("vllm") is None:
    _NEEDS.append(("rollout_engine", st.just(("vllm", "vllm extra"))))
NEEDS_MUTATIONS = st.one_of(*[
    st.tuples(st.sampled_from([("trainer", key), ("grid", "trainer", key)]), values)
    for key, values in _NEEDS])


def _materialise(root: Path, value: str) -> str:
    """An "@..." value as the path of a file or folder written for it; others as they are."""
    if not value.startswith("@"):
        return value
    path = root / value[1:]
    files = {"config_only": ["config.json"], "no_tokenizer": ["config.json", "model.safetensors"],
             "bad_config": ["model.safetensors", "tokenizer.json"]}
    if value == "@a_file":
        path.write_text("x")
    elif value[1:] in files or value == "@empty_dir" or value == "@folder.jsonl":
        path.mkdir()
        for name in files.get(value[1:], []):
            (path / name).write_text("{}")
        if value == "@bad_config":
            (path / "config.json").write_text("{not json")
    else:
        path = path.with_suffix(".jsonl")
        row = {"question": "1+1", "answer": "2"}
        lines = [json.dumps(row)] * 300
        if value == "@nul_rows":
            lines.append(json.dumps({"question": "1\u00002", "answer": "3"}))
        elif value == "@missing_column":
            lines = [json.dumps({"q": "1+1", "answer": "2"})] * 300
        elif value == "@not_json":
            lines.append("{oops")
        path.write_text("\n".join(lines) + "\n")
    return str(path)


@settings(FUZZ, max_examples=120)
@given(mutation=NEEDS_MUTATIONS)
def test_what_grpo_cells_need_is_refused_by_plan_and_sweep(tmp_path_factory, seeded, mutation):
    """Every trainer key that names a model, dataset file, reward module or rollout engine is
    checked at plan time, as [trainer] and as a grid axis beside a good value; `sweep` then
    refuses it too (the plan's refusal comes first, so no case can train) and writes nothing."""
    case = _case(tmp_path_factory, seeded)
    path, (value, phrase) = mutation
    value = _materialise(case.root, value)
    good = TRAIN_GOOD[path[-1]]
    doc = _set(copy.deepcopy(GRPO_BASE), path, [good, value] if path[0] == "grid" else value)
    if path[-1] in ("dataset", "eval_dataset"):
        doc["trainer"]["eval_size"] = 4
    (case.root / "n.toml").write_text(mutate_fuzz.to_toml(doc))
    cfg = str(case.root / "n.toml")
    line = case.refuses(["plan", cfg], phrase, what=mutation)
    if phrase not in ROW_PHRASES:  # a bad row is named by its file and line, not by the key
        assert ".".join(path) in line, (line, mutation)
    case.refuses(["sweep", cfg, "--db", case.url, "--executor", "debug"], phrase, what=mutation)
    assert not (case.root / "twoclocks-runs").exists()


ROW_PHRASES = {"NUL character", "missing column 'question'", "not valid JSON"}
TRAIN_GOOD = {"model": "builtin:tiny-arith", "dataset": "builtin:arithmetic",
              "eval_dataset": "builtin:arithmetic", "reward": "math-verify",
              "prompt_template": "{question}=", "rollout_engine": "hf"}


# --- training configs ------------------------------------------------------------------------

TRAIN_MUTATIONS = st.one_of(
    st.tuples(st.sampled_from(TRAIN_FLOATS), st.one_of(NONFINITE, NOT_A_NUMBER)),
    st.tuples(st.sampled_from(TRAIN_INTS), st.one_of(NOT_AN_INT, HUGE_INT)),
    st.tuples(st.sampled_from(["lr", "temperature", "eval_size", "group_size", "top_p"]),
              st.integers(-10**6, 0).map(float)),
    st.tuples(st.sampled_from(TRAIN_FLOATS + TRAIN_INTS + ["model", "dataset", "reward"])
              .flatmap(_typo), st.just(1)),
    st.tuples(st.sampled_from(["model", "dataset", "eval_dataset"]), st.one_of(
        st.just(""), st.integers(256, 3000).map(lambda n: "./" + "d" * n),
        st.text("ab", min_size=1, max_size=4).map(lambda t: t + "\x00"))),
    st.tuples(st.just("reward"), st.one_of(st.text("ab -", min_size=1, max_size=6),
                                           st.just("no_such_module_fz:fn"))),
    st.tuples(st.sampled_from(["dtype", "loss_agg", "advantage_scaling", "rollout_engine"]),
              st.text("xyz", min_size=1, max_size=4)),
    st.tuples(st.just("sample_budget"), st.integers(2**40, I64)),  # > 2^31 - 1 steps
    st.tuples(st.just("phases"), st.lists(st.fixed_dictionaries({
        "prompts_per_batch": st.one_of(NOT_AN_INT, HUGE_INT), "lr": st.just(1e-3)}),
        min_size=1, max_size=2)),
)


@settings(FUZZ, max_examples=200)
@given(mutation=TRAIN_MUTATIONS)
def test_invalid_train_configs_are_refused_before_training(tmp_path_factory, seeded, mutation):
    from trainer.config import load_config
    from twoclocks_cli.core.errors import ConfigError

    case = _case(tmp_path_factory, seeded)
    key, value = mutation
    (case.root / "t.toml").write_text(mutate_fuzz.to_toml({key: value}))
    with pytest.raises(ConfigError):  # the guard: a case that validated would start training
        load_config(case.root / "t.toml")
    work = case.root / "work"
    case.refuses(["train", str(case.root / "t.toml"), "--db", case.url, "--workdir", str(work)],
                 what=mutation)
    assert not work.exists() and not (case.root / "twoclocks-train").exists()


# --- database URLs x commands ----------------------------------------------------------------

def _foreign(root: Path) -> Path:
    path = root / "theirs.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    con.execute("INSERT INTO invoices (total) VALUES (9.5)")
    con.commit()
    con.close()
    return path


URLS = st.one_of(
    st.text("abc:x", min_size=1, max_size=5).filter(lambda p: not p.isdigit())
    .map(lambda port: f"postgresql://u:{PASSWORD}@127.0.0.1:{port}/db"),
    st.integers(65536, 10**7).map(lambda port: f"postgresql://u:{PASSWORD}@127.0.0.1:{port}/d"),
    st.sampled_from(["mysql", "oracle", "mssql", "http", "postgresql+asyncpg", "sqlite+aiosqlite"])
    .map(lambda scheme: f"{scheme}://u:{PASSWORD}@127.0.0.1/db"),
    st.sampled_from(["", " ", "\t", "db.sqlite", "sqlite:/x.db", "://"]),
    st.just(f"postgresql://u:{PASSWORD}@127.0.0.1:1/db"),  # nothing listens on port 1
    st.sampled_from(["FOREIGN", "GARBAGE", "FOLDER", "NODIR", "LONG"]),
)
COMMANDS = [["status"], ["sweeps", "list"], ["db", "current"], ["db", "upgrade"],
            ["runs", "list"], ["sweep", "SWEEP", "--executor", "debug"]]


@settings(FUZZ, max_examples=200)
@given(url=URLS, command=st.sampled_from(COMMANDS))
def test_bad_database_urls_are_refused_by_every_command(tmp_path_factory, seeded, url, command):
    case = _case(tmp_path_factory, seeded)
    files: dict[Path, bytes] = {}
    if url == "FOREIGN":
        path = _foreign(case.root)
        url = f"sqlite:///{path}"
    elif url == "GARBAGE":
        path = case.root / "garbage.db"
        path.write_bytes(b"this is not a database, " * 200)
    elif url == "FOLDER":
        path = case.root / "folder.db"
        path.mkdir()
    url = {"GARBAGE": f"sqlite:///{case.root / 'garbage.db'}",
           "FOLDER": f"sqlite:///{case.root / 'folder.db'}",
           "NODIR": f"sqlite:///{case.root / 'missing' / 'x.db'}",
           "LONG": f"sqlite:///{case.root / ('x' * 300)}"}.get(url, url)
    for path in case.root.iterdir():
        if path.is_file() and path.name != "store.db":
            files[path] = path.read_bytes()
    if command[0] == "sweep":
        quiet = {**SIM_BASE, "sample_budget": 1024}  # every cell >= min_steps: no warning line
        (case.root / "s.toml").write_text(mutate_fuzz.to_toml(quiet))
        command = ["sweep", str(case.root / "s.toml"), *command[2:]]
    case.refuses([*command, "--db", url], what=url)
    for path, data in files.items():  # the foreign and garbage files are left as they were
        assert path.read_bytes() == data, (url, command)
    assert not (case.root / "twoclocks-runs").exists()


# --- import files ----------------------------------------------------------------------------

BAD_STEP = st.one_of(st.integers(I32 + 1, 10**25), st.integers(-10**6, -1),
                     st.floats(0.5, 1e6).filter(lambda x: x != int(x)),
                     st.sampled_from(["x", "1e400", "nan", "inf", ""]))
BAD_SAMPLES = st.one_of(st.integers(I64 + 1, 10**30), st.sampled_from([1e30, -8, 2.5, "many"]))
WORDS = st.sampled_from(["x", "[1]", "abc", "1e3x"])  # (a CSV '1e999' is inf: a legal value)
HUGE_JSON_INT = st.integers(10**309, 10**400)  # a JSON int beyond a float


@st.composite
def bad_logs(draw):
    """(file name, text, format): a few good steps and one bad line at a drawn position."""
    fmt = draw(st.sampled_from(["csv", "jsonl", "trl"]))
    n = draw(st.integers(1, 6))
    rows = [{"step": i, "reward_mean": round(0.1 * i, 3), "samples": 8 * (i + 1)}
            for i in range(n)]
    where = draw(st.integers(0, n))
    field = draw(st.sampled_from(["step", "samples", "value"] if fmt != "trl"
                                 else ["step", "value"]))
    bad = dict(rows[where - 1] if where else rows[0])
    if field == "step":
        bad["step"] = draw(BAD_STEP)
    elif field == "samples":
        bad["samples"] = draw(BAD_SAMPLES)
    else:
        bad["reward_mean"] = draw({"csv": WORDS, "jsonl": st.one_of(WORDS, HUGE_JSON_INT),
                                   "trl": HUGE_JSON_INT}[fmt])
    rows.insert(where, bad)
    if fmt == "csv":
        body = "step,reward_mean,samples\n" + "".join(
            f"{r['step']},{r['reward_mean']},{r['samples']}\n" for r in rows)
        return "log.csv", body, fmt
    if fmt == "jsonl":
        import json

        return "log.jsonl", "".join(json.dumps(r) + "\n" for r in rows), fmt
    import json

    history = [{"step": r["step"], "reward": r["reward_mean"]} for r in rows]
    return "trainer_state.json", json.dumps({"log_history": history, "train_batch_size": 4,
                                             "global_step": n}), fmt


@settings(FUZZ, max_examples=120)
@given(log=bad_logs())
def test_import_files_with_numbers_the_store_cannot_hold_are_refused(tmp_path_factory, seeded,
                                                                      log):
    case = _case(tmp_path_factory, seeded)
    name, text, fmt = log
    (case.root / name).write_text(text)
    case.refuses(["ingest", str(case.root / name), "--format", fmt, "--db", case.url,
                  "--group-size", "4", "--batch-prompts", "2"], "nothing was written", what=log)
