"""Rollout engines: generated samples/s of the HF decode loop, HF `generate` and vLLM, one run.

On the built-in tiny model, at the demo's batch sizes (4, 16, 64 prompts x G = 8 samples), the
same arithmetic prompts, T = 1, 12 new tokens, fp32. The three engines are timed interleaved
(round r runs every engine at every batch before round r + 1), so a machine that slows during
the run slows them alike; a rate is the median over rounds of samples / seconds of one
`generate` call, after one warm-up call per engine and batch. vLLM's start-up is reported
apart. Ratios are against the HF decode loop (the default engine) measured in the same run.

Run in the vLLM venv (`bash scripts/setup-vllm.sh`), where all three engines import:

    .venv-vllm/bin/python bench/rollout_engines.py [--rounds 5] [--threads 2] [--smollm2]

`--smollm2` times SmolLM2-135M-Instruct on `examples/smollm2-train.toml`'s task instead (its
chat-template prompts, sums up to 20, T = 0.7, 24 new tokens; 4 and 16 prompts x G = 8): a real
chat model's rows part after a few tokens and stop at different lengths.

Without vLLM it times the two HF engines and says vLLM was not measured. On a GPU the same
script times vLLM on the GPU (it is not run here: no GPU on these machines).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

G, NEW_TOKENS = 8, 12
PROMPTS = (4, 16, 64)
ENGINE_GIB, ENGINE_GIB_SMOLLM2 = 1.5, 5.0  # vLLM's CPU share: this process plus its KV cache


def _setup(threads: int, smollm2: bool):
    """(model path, tokenizer, fp32 model in eval mode, base TrainConfig) of the tiny model, or
    of SmolLM2 with the shipped example's task settings."""
    import tomllib
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.config import TrainConfig
    from trainer.smollm2 import SMOLLM2_ID
    from trainer.tiny import ensure_tiny_model, resolve_model_path

    torch.set_num_threads(threads)
    path = resolve_model_path(SMOLLM2_ID) if smollm2 else ensure_tiny_model()
    tok = AutoTokenizer.from_pretrained(str(path), padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    task = {"max_new_tokens": NEW_TOKENS, "temperature": 1.0}
    if smollm2:
        example = tomllib.loads((Path(__file__).resolve().parents[1] / "examples" /
                                 "smollm2-train.toml").read_text())
        task = {k: example[k] for k in ("max_new_tokens", "temperature", "prompt_template",
                                        "arith_max_value", "arith_ops")}
    # on vLLM's CPU platform the share is of the node's memory, and it must cover this whole
    # process (both HF engines' model, vLLM's copy) before any KV cache: ask for a fixed size
    from twoclocks_cli.core.process import cpu_share_for

    share = cpu_share_for(ENGINE_GIB_SMOLLM2 if smollm2 else ENGINE_GIB)
    cfg = TrainConfig(model=str(path), seed=0, vllm_gpu_memory_utilization=share, **task)
    return path, tok, model, cfg


def _prompts(tok, cfg, n: int) -> list[str]:
    """n arithmetic prompts, each repeated G times (a group), as the trainer builds them."""
    import numpy as np

    from trainer.data import ArithmeticTask
    from trainer.loop import prompt_text

    task = ArithmeticTask(cfg.arith_min_value, cfg.arith_max_value, tuple(cfg.arith_ops))
    problems = task.sample(np.random.default_rng(n), n)
    return [prompt_text(p, cfg, tok) for p in problems for _ in range(G)]


def _engines(path, tok, model, cfg, with_vllm: bool) -> dict:
    """name -> engine; vLLM's start-up seconds in the returned engine's `start_s`."""
    from trainer.rollout.hf import HFEngine

    out = {"hf-loop": HFEngine(cfg.model_copy(update={"hf_decoder": "auto"}), model, tok),
           "hf-generate": HFEngine(cfg.model_copy(update={"hf_decoder": "generate"}), model, tok)}
    if out["hf-loop"].decoder is None:
        raise SystemExit("the HF decode loop does not support the tiny model: nothing to compare")
    if with_vllm:
        from trainer.rollout.vllm import VLLMEngine

        out["vllm"] = VLLMEngine(cfg.model_copy(update={"rollout_engine": "vllm"}), tok, path)
    return out


def _time(engine, prompts: list[str]) -> float:
    """Samples per second of one generate call."""
    start = time.perf_counter()
    engine.generate(prompts)
    return len(prompts) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--smollm2", action="store_true",
                    help="SmolLM2-135M-Instruct on examples/smollm2-train.toml's task.")
    args = ap.parse_args()

    with_vllm = importlib.util.find_spec("vllm") is not None
    path, tok, model, cfg = _setup(args.threads, args.smollm2)
    engines = _engines(path, tok, model, cfg, with_vllm)
    sizes = (4, 16) if args.smollm2 else PROMPTS
    batches = {p: _prompts(tok, cfg, p) for p in sizes}
    for eng in engines.values():  # warm-up: first-call allocation, kernel selection
        for prompts in batches.values():
            eng.generate(prompts)
    rates = {(name, p): [] for name in engines for p in sizes}
    for _ in range(args.rounds):
        for p, prompts in batches.items():
            for name, eng in engines.items():
                rates[(name, p)].append(_time(eng, prompts))

    model_name = "SmolLM2-135M-Instruct" if args.smollm2 else "the tiny model"
    print(f"rollout engines on {model_name}: T = {cfg.temperature}, {cfg.max_new_tokens} new "
          f"tokens, G = {G}, {args.threads} threads, median of {args.rounds} interleaved rounds")
    if with_vllm:
        print(f"vLLM start-up: {engines['vllm'].start_s:.1f} s (platform "
              f"{engines['vllm'].platform})")
    else:
        print("vLLM: not installed in this venv, not measured (bash scripts/setup-vllm.sh)")
    print(f"{'samples':>8} " + " ".join(f"{n + ' /s':>16}" for n in engines)
          + "  " + " ".join(f"{n + ' / hf-loop':>20}" for n in engines if n != "hf-loop"))
    for p in sizes:
        med = {n: statistics.median(rates[(n, p)]) for n in engines}
        print(f"{p * G:>8} " + " ".join(f"{med[n]:>16.1f}" for n in engines) + "  "
              + " ".join(f"{med[n] / med['hf-loop']:>20.2f}" for n in engines if n != "hf-loop"))


if __name__ == "__main__":
    main()
