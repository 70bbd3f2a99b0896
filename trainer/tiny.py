"""`builtin:tiny-arith`: a ~1M-parameter Qwen2 model, character tokenizer, warmed up on arithmetic.

Built once per seed by supervised training in which some targets are deliberately wrong, then a
logit-scale calibration, so that its sampled (T=1) accuracy starts low (15–50%) and GRPO has room
to improve it. The result is an ordinary HF directory (AutoModelForCausalLM / AutoTokenizer),
cached under `$TWOCLOCKS_CACHE` or `~/.cache/twoclocks/`, written atomically under a file lock
and checked against a manifest of checksums on every use.
"""

from __future__ import annotations

import json
import math
import os
import re
import string
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from trainer.model_cache import MANIFEST, cache_root, cached_build, file_checksums, sha256
from trainer.smollm2 import SMOLLM2_ID
from twoclocks_cli.core.errors import ConfigError

TINY_MODEL_ID = "builtin:tiny-arith"
# the tiny model's context in tokens (its max_position_embeddings): a question and its answer
# are a few characters
TINY_POSITIONS = 512
# Bump when the recipe changes: a new version never reuses an old cache entry.
BUILD_VERSION = 2
# Threads used to build: the same seed gives the same weights on machines with the same CPU
# model and this torch (another CPU's kernels round the warm-up's sums apart: other weights).
BUILD_THREADS = 2
PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
# Every printable ASCII character plus newline, one token each.
CHARS = "".join(sorted(set(string.printable) - set("\t\r\x0b\x0c")))


@dataclass(frozen=True)
class TinyRecipe:
    """The architecture and warm-up recipe (part of the cache identity via BUILD_VERSION)."""

    hidden_size: int = 128  # model width
    num_layers: int = 4  # transformer blocks
    num_heads: int = 4  # attention heads (no grouped KV)
    intermediate_size: int = 512  # MLP width
    steps: int = 1400  # supervised warm-up steps
    batch_size: int = 128  # sequences per warm-up step
    lr: float = 2e-3  # AdamW peak lr (linear warm-up, cosine decay)
    warmup_steps: int = 100  # lr warm-up steps
    wrong_frac: float = 0.3  # fraction of targets replaced by a wrong answer
    # Sampled accuracy outside [calib_low, calib_high] after warm-up is moved to calib_target by
    # scaling the logits (the final norm's weight): a sharper or flatter starting policy.
    calib_low: float = 0.2
    calib_high: float = 0.42
    calib_target: float = 0.3
    calib_size: int = 512  # held-out problems used to calibrate (disjoint seed from eval)
    max_offset: int = 10  # wrong answers are the right one plus a nonzero offset up to this
    eval_size: int = 256  # held-out problems for the accuracies recorded in the manifest


_RECIPE = TinyRecipe()


def is_valid(model_dir: Path, seed: int) -> bool:
    """True when `model_dir` holds a complete build of this version and seed (checksums match)."""
    try:
        manifest = json.loads((model_dir / MANIFEST).read_text())
        if manifest.get("version") != BUILD_VERSION or manifest.get("seed") != seed:
            return False
        if manifest.get("recipe") != asdict(_RECIPE):
            return False
        files = manifest["files"]
        return bool(files) and all(sha256(model_dir / n) == h for n, h in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def build_tokenizer():
    """The character tokenizer as a PreTrainedTokenizerFast (left padding, no auto specials)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate([PAD, BOS, EOS, UNK, *CHARS])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tok.add_special_tokens([PAD, BOS, EOS, UNK])
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        padding_side="left",
        model_max_length=512,
    )


def _build_model(tokenizer, recipe: TinyRecipe):
    """A freshly initialised fp32 Qwen2 causal LM sized by `recipe` (uses the global torch RNG)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_heads,
        max_position_embeddings=TINY_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return Qwen2ForCausalLM(config).float()


def _wrong(answer: str, rng, recipe: TinyRecipe) -> str:
    """A wrong answer near `answer` (same format: an integer)."""
    offset = int(rng.integers(1, recipe.max_offset + 1)) * (1 if rng.random() < 0.5 else -1)
    return str(int(answer) + offset)


def _warmup_batch(task, tokenizer, rng, recipe: TinyRecipe):
    """One supervised batch: input ids, attention mask and labels (loss on the completion only)."""
    import torch

    from trainer.data import render_prompt

    problems = task.sample(rng, recipe.batch_size)
    prompts, fulls = [], []
    for p in problems:
        answer = _wrong(p.answer, rng, recipe) if rng.random() < recipe.wrong_frac else p.answer
        prompt = render_prompt(p, tokenizer)
        prompts.append(prompt)
        fulls.append(prompt + "\\boxed{" + answer + "}")
    enc = tokenizer(fulls, add_special_tokens=False)["input_ids"]
    n_prompt = [len(x) for x in tokenizer(prompts, add_special_tokens=False)["input_ids"]]
    width = max(len(x) for x in enc) + 1
    ids = torch.full((len(enc), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    mask = torch.zeros_like(ids)
    for i, (row, k) in enumerate(zip(enc, n_prompt, strict=True)):
        row = row + [tokenizer.eos_token_id]
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
        labels[i, k : len(row)] = ids[i, k : len(row)]
    return ids, mask, labels


def _lr_factor(step: int, recipe: TinyRecipe) -> float:
    """Linear warm-up then cosine decay to 10% of the peak."""
    if step < recipe.warmup_steps:
        return (step + 1) / recipe.warmup_steps
    t = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))


def _warm_up(model, tokenizer, seed: int, recipe: TinyRecipe, progress: bool) -> None:
    """Supervised training on the arithmetic task with `wrong_frac` of the targets wrong."""
    import numpy as np
    import torch

    from trainer.data import ArithmeticTask

    task = ArithmeticTask()
    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, recipe))
    model.train()
    t0 = time.monotonic()
    for step in range(recipe.steps):
        ids, mask, labels = _warmup_batch(task, tokenizer, rng, recipe)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if progress and (step % 100 == 0 or step == recipe.steps - 1):
            print(
                f"tiny-arith warm-up step {step + 1}/{recipe.steps} loss {loss.item():.3f} "
                f"({time.monotonic() - t0:.0f}s)",
                file=sys.stderr,
            )
    model.eval()


def accuracy(model, tokenizer, problems, temperature: float = 1.0, max_new_tokens: int = 12,
             batch_size: int = 256) -> float:
    """Fraction of `problems` whose completion is exactly `\\boxed{answer}` (greedy if T=0)."""
    import torch

    from trainer.data import render_prompt

    hits = 0
    for i in range(0, len(problems), batch_size):
        chunk = problems[i : i + batch_size]
        enc = tokenizer([render_prompt(p, tokenizer) for p in chunk], return_tensors="pt",
                        padding=True, add_special_tokens=False)
        sample = temperature > 0
        with torch.no_grad():
            out = model.generate(
                **enc, max_new_tokens=max_new_tokens, do_sample=sample,
                temperature=temperature if sample else None, top_k=0 if sample else None,
                top_p=1.0 if sample else None, pad_token_id=tokenizer.pad_token_id,
            )
        new = out[:, enc["input_ids"].shape[1] :]
        texts = tokenizer.batch_decode(new, skip_special_tokens=True)
        hits += sum(
            t.strip() == f"\\boxed{{{p.answer}}}" for t, p in zip(texts, chunk, strict=True)
        )
    return hits / len(problems)


def _sampled_at(model, tokenizer, problems, scale: float, base, seed: int) -> float:
    """Sampled accuracy with the logits multiplied by `scale` (fixed sampling seed)."""
    import torch

    model.model.norm.weight.data.copy_(base * scale)
    torch.manual_seed(seed)
    return accuracy(model, tokenizer, problems, temperature=1.0)


def _calibrate(model, tokenizer, seed: int, recipe: TinyRecipe) -> tuple[float, float]:
    """Scale the logits so sampled accuracy lies in the calibration band.

    Returns (scale, sampled accuracy before scaling).
    """
    from trainer.data import ArithmeticTask

    problems = ArithmeticTask().heldout(recipe.calib_size, seed=20_000 + seed)
    base = model.model.norm.weight.data.clone()
    before = _sampled_at(model, tokenizer, problems, 1.0, base, seed)
    if recipe.calib_low <= before <= recipe.calib_high:
        model.model.norm.weight.data.copy_(base)
        return 1.0, before
    lo, hi = (1.0, 4.0) if before < recipe.calib_low else (0.25, 1.0)
    best = (abs(before - recipe.calib_target), 1.0)
    for _ in range(7):  # bisection in log-scale; accuracy rises with the scale
        mid = math.sqrt(lo * hi)
        acc = _sampled_at(model, tokenizer, problems, mid, base, seed)
        best = min(best, (abs(acc - recipe.calib_target), mid))
        lo, hi = (mid, hi) if acc < recipe.calib_target else (lo, mid)
    model.model.norm.weight.data.copy_(base * best[1])
    return best[1], before


def _build(target: Path, seed: int, progress: bool) -> None:
    """Train and save a fresh model into `target` (an empty directory), manifest last."""
    import torch

    t0 = time.monotonic()
    recipe = _RECIPE
    tokenizer = build_tokenizer()
    threads = torch.get_num_threads()
    torch.set_num_threads(BUILD_THREADS)  # the weights depend on the float reduction order
    try:
        _train_and_save(target, seed, tokenizer, recipe, t0, progress)
    finally:
        torch.set_num_threads(threads)


def _train_and_save(target: Path, seed: int, tokenizer, recipe: TinyRecipe, t0: float,
                    progress: bool) -> None:
    """Warm up, calibrate, evaluate and save into `target`, the manifest last."""
    import torch
    from transformers import GenerationConfig

    from trainer.data import ArithmeticTask

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _build_model(tokenizer, recipe)
        _warm_up(model, tokenizer, seed, recipe, progress)
        scale, before = _calibrate(model, tokenizer, seed, recipe)
        heldout = ArithmeticTask().heldout(recipe.eval_size, seed=10_000 + seed)
        greedy = accuracy(model, tokenizer, heldout, temperature=0.0)
        torch.manual_seed(seed)
        sampled = accuracy(model, tokenizer, heldout, temperature=1.0)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, do_sample=True, temperature=1.0, top_k=0,
        top_p=1.0, max_new_tokens=12,
    )
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    files = file_checksums(target)
    manifest = {
        "model_id": TINY_MODEL_ID, "version": BUILD_VERSION, "seed": seed, "files": files,
        "recipe": asdict(recipe), "params": sum(p.numel() for p in model.parameters()),
        "greedy_accuracy": greedy, "sampled_accuracy": sampled, "logit_scale": scale,
        "sampled_accuracy_before_scale": before,
        "build_seconds": round(time.monotonic() - t0, 1), "torch_threads": torch.get_num_threads(),
    }
    (target / MANIFEST).write_text(json.dumps(manifest, indent=2))
    if progress:
        print(
            f"tiny-arith built in {manifest['build_seconds']}s: held-out accuracy greedy "
            f"{greedy:.2f}, sampled {sampled:.2f} (logit scale {scale:.2f}; {before:.2f} before)",
            file=sys.stderr,
        )


def ensure_tiny_model(seed: int = 0, cache_dir: Path | None = None, progress: bool = False) -> Path:
    """The directory of the tiny model for `seed`, built first (≈3 min on 2 free cores) if absent
    or corrupt."""
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    return cached_build(root, f"tiny-arith-v{BUILD_VERSION}-seed{seed}",
                        lambda target: is_valid(target, seed),
                        lambda tmp: _build(tmp, seed, progress),
                        f"{TINY_MODEL_ID} (seed {seed})", progress)


def resolve_model_path(name_or_path: str) -> Path | str:
    """`builtin:tiny-arith` → its cached directory; a local path → itself; a hub id → itself.

    Anything that looks like a filesystem path (absolute, ./, ../, ~) but does not exist is a
    ConfigError naming the path.
    """
    if name_or_path == TINY_MODEL_ID:
        return ensure_tiny_model()
    if name_or_path == SMOLLM2_ID:
        from trainer.smollm2 import ensure_smollm2

        return ensure_smollm2()
    if name_or_path.startswith("builtin:"):
        raise ConfigError(f"unknown built-in model {name_or_path!r}: allowed are "
                          f"{', '.join(map(repr, BUILTIN_MODELS))}")
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ConfigError(f"model path {path} is not a directory")
        return path
    if looks_local(name_or_path):
        raise ConfigError(f"model path {path} does not exist")
    return name_or_path


# -- what a model name needs, checked before anything runs (no torch, no network) -----------------

BUILTIN_MODELS = (TINY_MODEL_ID, SMOLLM2_ID)
# huggingface_hub's repo id rule: [ORG/]NAME of word characters, '-' and '.', no '--' or '..'
_HUB_ID = re.compile(r"^(?!.*(?:--|\.\.))(?:[\w.-]+/)?[\w.-]+$")
_WEIGHTS = ("*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                    "vocab.txt", "spiece.model")


def looks_local(name: str) -> bool:
    """A name written as a path (absolute, ./, ../, ~, or more than one '/'), never a hub id."""
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1


def model_problem(name: str) -> str | None:
    """What would stop `name` (the `model` option) from loading (a line to follow the name),
    or None: a built-in name from the known list; a local folder holding config.json, weights
    and tokenizer files; or a hub id already in the local Hugging Face cache. Read from the
    file system only (no torch, no network), so a sweep can refuse it before it writes
    anything."""
    if name.startswith("builtin:"):
        if name == SMOLLM2_ID:
            return _smollm2_problem()
        if name in BUILTIN_MODELS:
            return None
        allowed = ", ".join(map(repr, BUILTIN_MODELS))
        return f"unknown built-in model {name!r}: allowed are {allowed}"
    path = Path(name).expanduser()
    try:
        if path.exists():
            return _folder_problem(path)
    except OSError as err:
        return f"model path {path}: {err.strerror or err}"
    if looks_local(name):
        return f"model path {path} does not exist"
    if len(name) > 96 or not _HUB_ID.match(name):
        return "neither an existing folder nor a Hugging Face hub id ([ORG/]NAME)"
    return _hub_problem(name)


def model_positions(name: str) -> int | None:
    """The context in tokens (`max_position_embeddings`) of the model `name` (the `model`
    option), read from its config alone (no torch, no weights, no network); None where it
    cannot be told here (a hub id not cached, a config without it)."""
    if name == TINY_MODEL_ID:
        return TINY_POSITIONS
    if name == SMOLLM2_ID:
        from trainer.smollm2 import POSITIONS

        return POSITIONS
    if name.startswith("builtin:"):
        return None
    config = Path(name).expanduser() / "config.json"
    if not config.is_file() and not looks_local(name):
        config = _cached_hub_config(name)
    try:
        data = json.loads(config.read_text(encoding="utf-8")) if config else None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    text = data.get("text_config")  # a multimodal model's language part
    if isinstance(text, dict) and "max_position_embeddings" in text:
        data = text
    value = data.get("max_position_embeddings")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _cached_hub_config(repo: str) -> Path | None:
    """The config.json of hub id `repo` in the local Hugging Face cache, or None."""
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(repo, "config.json")
    except Exception:  # noqa: BLE001 - no hub library, or an id it refuses
        return None
    return Path(hit) if isinstance(hit, str) else None


def _smollm2_problem() -> str | None:
    """The SmolLM2 built-in needs its package's GGUF file and the gguf reader installed."""
    from trainer.smollm2 import gguf_path

    try:
        gguf_path()
    except ConfigError as err:
        return str(err)
    return None


def _folder_problem(path: Path) -> str | None:
    """A model folder must hold what AutoModelForCausalLM and AutoTokenizer read."""
    if not path.is_dir():
        return f"model path {path} is not a directory"
    config = path / "config.json"
    if not config.is_file():
        return (f"model folder {path} has no config.json (a Hugging Face model folder holds "
                "config.json, the weights and the tokenizer files)")
    try:
        ok = isinstance(json.loads(config.read_text(encoding="utf-8")), dict)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        ok = False
    if not ok:
        return f"model folder {path}: config.json is not a readable JSON object"
    if not any(next(path.glob(pattern), None) for pattern in _WEIGHTS):
        return f"model folder {path} holds no weights (*.safetensors or *.bin)"
    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        return (f"model folder {path} holds no tokenizer files (one of "
                f"{', '.join(_TOKENIZER_FILES)})")
    return None


def _hub_offline() -> bool:
    """Whether this process is told to stay off the hub (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE),
    as huggingface_hub reads those variables."""
    return any(os.environ.get(v, "").strip().upper() in ("1", "ON", "YES", "TRUE")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _hub_problem(repo: str) -> str | None:
    """A hub id loads without the network only from the local cache. Online, an id that is not
    cached may still be downloaded where the cells run (a cluster's login node often has no
    model the compute nodes fetch), and whether the hub holds it cannot be told without asking
    it, so it passes; offline (HF_HUB_OFFLINE=1) it cannot load, so it is refused with how to
    cache it."""
    if not _hub_offline():
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.constants import HF_HUB_CACHE
    except ImportError:  # transformers ships huggingface_hub: without it nothing loads anyway
        return "a hub id needs huggingface_hub (pip install transformers)"
    try:
        hit = try_to_load_from_cache(repo, "config.json")
    except Exception:  # noqa: BLE001 - an id the hub library itself refuses
        hit = None
    if isinstance(hit, str):
        return None
    return (f"a Hugging Face hub id not in the local cache ({HF_HUB_CACHE}) while "
            "HF_HUB_OFFLINE is set: without the network it cannot load, and whether the hub "
            f"holds it cannot be checked here; download it first (`hf download {repo}`, or point "
            "HF_HUB_CACHE at a cache that holds it) or give a local model folder")
