"""Rollout engines: sample completions for a batch of prompts behind one small interface.

`hf` (the training model samples, default, runs anywhere) and `vllm` (the `vllm` extra: a
colocated vLLM, run in CI on CPU with vLLM's CPU build, tests/vllm/). An engine returns token
ids, masks and its own log-prob of each sampled token; the trainer recomputes the log-probs
itself and compares the two (`trainer.sampler`), so engines never need to agree on numerics.
"""

from __future__ import annotations

from trainer.rollout.batch import Rollout, assemble

__all__ = ["Rollout", "assemble", "make_engine"]


def make_engine(cfg, model, tokenizer, model_path):
    """The rollout engine named by `cfg.rollout_engine`."""
    if cfg.rollout_engine == "vllm":
        from trainer.rollout.vllm import VLLMEngine

        return VLLMEngine(cfg, tokenizer, model_path)
    from trainer.rollout.hf import HFEngine

    return HFEngine(cfg, model, tokenizer)
