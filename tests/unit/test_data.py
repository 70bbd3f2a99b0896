"""The arithmetic task (determinism, held-out split) and dataset file loading errors."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.data import ArithmeticTask, Problem, load_problems, render_prompt
from twoclocks_cli.core.errors import ConfigError


def _check(p: Problem) -> bool:
    """The gold answer is the arithmetic value of the question."""
    for sym in "+-*":
        a, s, b = p.question.partition(sym)
        if s and a and b:
            x, y = int(a), int(b)
            return int(p.answer) == (x + y if sym == "+" else x - y if sym == "-" else x * y)
    return False


def test_sample_is_deterministic_given_rng_state():
    task = ArithmeticTask()
    first = task.sample(np.random.default_rng(7), 50)
    assert first == task.sample(np.random.default_rng(7), 50)
    assert first != task.sample(np.random.default_rng(8), 50)
    rng = np.random.default_rng(7)
    task.sample(rng, 10)
    state = rng.bit_generator.state
    a = task.sample(rng, 20)
    rng.bit_generator.state = state  # what a checkpoint restores
    assert task.sample(rng, 20) == a


def test_answers_are_correct_and_options_respected():
    task = ArithmeticTask(min_value=5, max_value=12, ops=("*", "-"))
    probs = task.sample(np.random.default_rng(0), 300)
    assert all(_check(p) for p in probs)
    assert {("*" in p.question) for p in probs} == {True, False}
    assert "+" not in "".join(p.question for p in probs)
    for p in probs:
        a, b = (int(x) for x in p.question.replace("*", " ").replace("-", " ").split())
        assert 5 <= a <= 12 and 5 <= b <= 12


def test_heldout_fixed_per_seed_and_disjoint_from_training():
    task = ArithmeticTask()
    held = task.heldout(300, seed=3)
    assert held == task.heldout(300, seed=3)
    assert held != task.heldout(300, seed=4)
    assert len(set(held)) == 300 and all(_check(p) for p in held)
    train = set(task.sample(np.random.default_rng(0), 20_000))
    assert not train & set(task.heldout(2000, seed=0))


def test_heldout_on_a_huge_range_uses_rejection():
    task = ArithmeticTask(max_value=10**6, ops=("+",))
    held = task.heldout(50, seed=1)
    assert held == task.heldout(50, seed=1) and all(_check(p) for p in held)


@pytest.mark.parametrize(
    "kwargs", [{"ops": ("/",)}, {"ops": ()}, {"min_value": 5, "max_value": 4}, {"min_value": -1}]
)
def test_bad_task_options(kwargs):
    with pytest.raises(ConfigError):
        ArithmeticTask(**kwargs)


def test_zero_problems():
    task = ArithmeticTask()
    assert task.sample(np.random.default_rng(0), 0) == [] and task.heldout(0, seed=0) == []


def test_load_jsonl_and_csv(tmp_path):
    j = tmp_path / "d.jsonl"
    j.write_text('{"question": "1+1", "answer": 2}\n\n{"question": "3*3", "answer": "9"}\n')
    assert load_problems(j) == [Problem("1+1", "2"), Problem("3*3", "9")]
    c = tmp_path / "d.csv"
    c.write_text("\ufeffq,a,extra\n1+1,2,x\n\"what, is 2+2\",4,y\n", encoding="utf-8")  # BOM
    assert load_problems(c, question_key="q", answer_key="a") == [
        Problem("1+1", "2"), Problem("what, is 2+2", "4")
    ]


@pytest.mark.parametrize(
    "name, text, needle",
    [
        ("bad.jsonl", '{"question": "1+1", "answer": 2}\n{"question": "2+2"\n', "line 2"),
        ("bad.jsonl", '{"question": "1+1", "answer": 2}\n{"question": "2+2"}\n', "line 2"),
        ("bad.jsonl", '{"question": "1+1", "answer": 2}\n\n[1, 2]\n', "line 3"),
        ("bad.jsonl", '{"question": "", "answer": 2}\n', "line 1"),
        ("bad.jsonl", '{"question": "1+1", "answer": null}\n', "line 1"),
        ("deep.jsonl", '{"question": "1+1", "answer": 2}\n' + "[" * 100_000 + "\n",
         "line 2: not a problem row: JSON nested too deeply"),
        ("bad.csv", "question,answer\n1+1,2\n2+2\n", "line 3"),
        ("bad.csv", "question,answer\n1+1,2\n2+2,\n", "line 3"),
        ("bad.csv", "question,solution\n1+1,2\n", "missing column 'answer'"),
        ("empty.jsonl", "\n", "no problems"),
        ("bad.txt", "1+1,2\n", "unsupported"),
    ],
)
def test_load_errors_name_file_and_row(tmp_path, name, text, needle):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_problems(path)
    assert str(path) in str(err.value) and needle in str(err.value)


def test_load_missing_file_and_parquet(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_problems(tmp_path / "nope.jsonl")
    pq = tmp_path / "d.parquet"
    try:
        import pyarrow as pa
        import pyarrow.parquet as pqm
    except ImportError:
        pq.write_bytes(b"PAR1")
        with pytest.raises(ConfigError, match="pyarrow"):
            load_problems(pq)
        return
    pqm.write_table(pa.table({"question": ["1+1", None], "answer": ["2", "4"]}), pq)
    with pytest.raises(ConfigError, match="row 2"):
        load_problems(pq)


def test_render_prompt_plain_and_chat():
    from trainer.tiny import build_tokenizer

    p = Problem("23+41", "64")
    tok = build_tokenizer()
    assert render_prompt(p, tok) == "23+41="
    tok.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    text = render_prompt(p, tok)
    assert text.startswith("<|user|>23+41\n") and text.endswith("<|assistant|>")
    assert "\\boxed{ANSWER}" in text
