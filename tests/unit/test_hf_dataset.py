"""`dataset = "hf:…"` through the real `datasets` library, on a local datasets folder (the hub
itself is not reachable from CI; a hub id goes through the same `load_dataset` call)."""

from __future__ import annotations

import json

import pytest

from trainer.config import TrainConfig
from trainer.loop import load_data
from twoclocks_cli.core.errors import ConfigError

datasets = pytest.importorskip("datasets")  # the `hf` extra; CI installs it


@pytest.fixture(autouse=True)
def _offline_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


def _folder(tmp_path, rows, name="train.jsonl"):
    folder = tmp_path / "ds"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_a_local_datasets_folder_trains_and_holds_out(tmp_path):
    rows = [{"problem": f"{i}+1", "solution": str(i + 1)} for i in range(10)]
    folder = _folder(tmp_path, rows)
    cfg = TrainConfig(
        dataset=f"hf:{folder}", question_key="problem", answer_key="solution", eval_size=3
    )
    source, held = load_data(cfg)
    assert [p.question for p in source.problems] == [f"{i}+1" for i in range(7)]
    assert [(p.question, p.answer) for p in held] == [("7+1", "8"), ("8+1", "9"), ("9+1", "10")]


def test_hf_dataset_errors_are_one_clear_line(tmp_path):
    with pytest.raises(ConfigError, match=r"dataset 'hf:.*nowhere': cannot load"):
        load_data(TrainConfig(dataset=f"hf:{tmp_path / 'nowhere'}"))
    folder = _folder(tmp_path, [{"q": "1+1", "a": "2"}] * 5)
    with pytest.raises(ConfigError) as err:
        load_data(TrainConfig(dataset=f"hf:{folder}", eval_size=1))  # no question/answer columns
    assert "question" in str(err.value) and "\n" not in str(err.value)


def test_hf_rows_are_checked_like_file_rows(tmp_path):
    folder = _folder(
        tmp_path, [{"question": "1+1", "answer": "2"}, {"question": "", "answer": "3"}]
    )
    with pytest.raises(ConfigError, match=r"row 2: column 'question' is empty"):
        load_data(TrainConfig(dataset=f"hf:{folder}", eval_dataset=f"hf:{folder}"))
    with pytest.raises(ConfigError, match=r"cannot load \(ValueError: .*split"):
        load_data(TrainConfig(dataset=f"hf:{folder}", dataset_split="test"))
