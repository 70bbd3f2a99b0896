"""builtin:tiny-arith: builds, loads through Auto*, reloads from cache, rebuilds when corrupt,
and starts with a sampled accuracy GRPO can improve (15–50%)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import time

import pytest

from trainer import tiny
from trainer.data import ArithmeticTask, render_prompt
from twoclocks_cli.core.errors import ConfigError

pytestmark = [pytest.mark.tiny_model, pytest.mark.one_worker]

# Tests marked slow share one real build (≈3 min on 2 free cores) per session, in the user cache.
# A short recipe for the cache-mechanics tests (a real build, seconds instead of minutes).
SHORT = dataclasses.replace(tiny.TinyRecipe(), steps=8, warmup_steps=2, eval_size=8,
                             calib_size=8)


@pytest.fixture(scope="session")
def tiny_dir():
    """The real tiny model, built once per test session in the user cache (or $TWOCLOCKS_CACHE)."""
    return tiny.ensure_tiny_model(seed=0)


@pytest.fixture(scope="session")
def loaded(tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_dir), AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture
def short_recipe(monkeypatch, tmp_path):
    """Build with SHORT into a private cache ($TWOCLOCKS_CACHE = tmp dir)."""
    monkeypatch.setattr(tiny, "_RECIPE", SHORT)
    monkeypatch.setenv("TWOCLOCKS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.slow
def test_loads_as_an_ordinary_hf_model(loaded):
    import torch

    model, tok = loaded
    assert model.config.model_type == "qwen2"
    assert model.dtype == torch.float32
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (128, 4)
    assert model.config.num_attention_heads == 4
    assert 0.9e6 < sum(p.numel() for p in model.parameters()) < 1.2e6
    assert tok.padding_side == "left"
    assert None not in (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id)
    assert model.generation_config.eos_token_id == tok.eos_token_id
    text = "12-57=\\boxed{-45}"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) and tok.decode(ids) == text


@pytest.mark.slow
def test_left_padded_batch_generates_like_single_prompts(loaded):
    import torch

    model, tok = loaded
    probs = [p for p in ArithmeticTask().heldout(40, seed=5)]
    probs = sorted(probs, key=lambda p: len(p.question))[::13]  # different prompt lengths
    prompts = [render_prompt(p, tok) for p in probs]
    assert len({len(p) for p in prompts}) > 1
    with torch.no_grad():
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        batch = model.generate(**enc, max_new_tokens=12, do_sample=False)
        batch_txt = tok.batch_decode(batch[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        for prompt, got in zip(prompts, batch_txt, strict=True):
            one = tok(prompt, return_tensors="pt", add_special_tokens=False)
            out = model.generate(**one, max_new_tokens=12, do_sample=False)
            assert tok.decode(out[0, one["input_ids"].shape[1]:], skip_special_tokens=True) == got


@pytest.mark.slow
def test_sampled_accuracy_starts_between_15_and_50_percent(loaded):
    import torch

    from trainer.rewards import MathVerifyReward

    model, tok = loaded
    probs = ArithmeticTask().heldout(512, seed=123)
    enc = tok([render_prompt(p, tok) for p in probs], return_tensors="pt", padding=True,
              add_special_tokens=False)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        out = model.generate(**enc, max_new_tokens=12, do_sample=True, temperature=1.0,
                             top_k=0, top_p=1.0)
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    with MathVerifyReward() as reward:
        rewards = reward(texts, probs)
    acc = sum(rewards) / len(rewards)
    assert 0.15 <= acc <= 0.5, f"sampled accuracy {acc:.3f}"
    # well-formed almost always: the model learned the format, not only the answers
    assert sum(t.startswith("\\boxed{") for t in texts) / len(texts) > 0.9


@pytest.mark.slow
def test_reload_from_cache_is_fast_and_does_not_rebuild(tiny_dir):
    before = (tiny_dir / tiny.MANIFEST).stat().st_mtime_ns
    t0 = time.monotonic()
    assert tiny.ensure_tiny_model(seed=0) == tiny_dir
    assert time.monotonic() - t0 < 5.0
    assert (tiny_dir / tiny.MANIFEST).stat().st_mtime_ns == before


@pytest.fixture(scope="module")
def short_model(tmp_path_factory):
    """One SHORT build (seed 0) that the cache tests copy and damage."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tiny, "_RECIPE", SHORT)
        return tiny.ensure_tiny_model(seed=0, cache_dir=tmp_path_factory.mktemp("short"))


def _checksums(model_dir):
    return json.loads((model_dir / tiny.MANIFEST).read_text())["files"]


def test_build_is_deterministic_per_seed(short_recipe, short_model):
    stale = short_recipe / f".tiny-arith-v{tiny.BUILD_VERSION}-seed0.tmpdead"
    stale.mkdir(parents=True)  # what a build killed mid-way leaves behind
    again = tiny.ensure_tiny_model(seed=0)
    assert not stale.exists()
    assert again.parent == short_recipe and again != short_model
    assert _checksums(again) == _checksums(short_model)
    other = tiny.ensure_tiny_model(seed=2)
    assert _checksums(other)["model.safetensors"] != _checksums(short_model)["model.safetensors"]


def _damage(path, how: str) -> None:
    if how == "flip_weights":
        data = bytearray((path / "model.safetensors").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (path / "model.safetensors").write_bytes(bytes(data))
    elif how == "truncate_weights":
        with (path / "model.safetensors").open("r+b") as f:
            f.truncate(1000)
    elif how == "no_manifest":
        (path / tiny.MANIFEST).unlink()
    elif how == "missing_file":
        (path / "tokenizer.json").unlink()
    elif how == "bad_json":
        (path / tiny.MANIFEST).write_text("{not json")
    else:  # an older recipe
        manifest = json.loads((path / tiny.MANIFEST).read_text())
        manifest["recipe"]["steps"] += 1
        (path / tiny.MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    "damage",
    ["flip_weights", "truncate_weights", "no_manifest", "missing_file", "bad_json", "recipe"],
)
def test_corrupt_cache_is_detected(short_recipe, short_model, damage):
    path = short_recipe / short_model.name
    shutil.copytree(short_model, path)
    assert tiny.is_valid(path, 0)
    _damage(path, damage)
    assert not tiny.is_valid(path, 0)


@pytest.mark.parametrize("damage", ["flip_weights", "no_manifest"])
def test_corrupt_cache_is_rebuilt(short_recipe, short_model, damage):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = short_recipe / short_model.name
    shutil.copytree(short_model, path)
    _damage(path, damage)
    assert tiny.ensure_tiny_model(seed=0) == path
    assert tiny.is_valid(path, 0)
    assert _checksums(path) == _checksums(short_model)  # the same model again
    AutoModelForCausalLM.from_pretrained(path)
    AutoTokenizer.from_pretrained(path)


# A child process: the SHORT recipe, a build counter around the real _build, then ensure.
_CHILD = """
import dataclasses, sys, time
from trainer import tiny
tiny._RECIPE = dataclasses.replace(tiny.TinyRecipe(), steps=8, warmup_steps=2, eval_size=8,
                                   calib_size=8)
real = tiny._build
def counting(target, seed, progress):
    with open(sys.argv[2], "a") as f:
        f.write("build\\n")
    time.sleep(0.5)  # widen the race window
    real(target, seed, progress)
tiny._build = counting
tiny.ensure_tiny_model(seed=3, cache_dir=sys.argv[1])
"""


def test_two_processes_build_once(short_recipe, tmp_path):
    # fresh interpreters, not fork: torch's OpenMP pool does not survive a fork of this process
    builds = tmp_path / "builds.txt"
    cmd = [sys.executable, "-c", _CHILD, str(short_recipe), str(builds)]
    procs = [subprocess.Popen(cmd) for _ in range(2)]
    assert [p.wait(timeout=600) for p in procs] == [0, 0]
    assert builds.read_text().count("build") == 1
    assert tiny.is_valid(short_recipe / f"tiny-arith-v{tiny.BUILD_VERSION}-seed3", 3)
    assert not list(short_recipe.glob(".*tmp*"))


@pytest.mark.slow
def test_resolve_model_path(tiny_dir, tmp_path):
    assert tiny.resolve_model_path(tiny.TINY_MODEL_ID) == tiny_dir
    assert tiny.resolve_model_path(str(tiny_dir)) == tiny_dir
    assert tiny.resolve_model_path("Qwen/Qwen2.5-Math-1.5B") == "Qwen/Qwen2.5-Math-1.5B"
    assert tiny.resolve_model_path("gpt2") == "gpt2"
    for bad in [str(tmp_path / "missing"), "./nope", "a/b/c", "builtin:huge"]:
        with pytest.raises(ConfigError) as err:
            tiny.resolve_model_path(bad)
        assert bad.lstrip("./") in str(err.value)
