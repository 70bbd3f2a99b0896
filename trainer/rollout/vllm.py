"""A vLLM rollout engine for GPU users (the `vllm` extra). NOT RUN IN THIS PROJECT'S CI.

No machine the project is tested on can run vLLM, so this engine was written against vLLM's
documented offline API (`vllm.LLM`, `SamplingParams`, `LLM.generate`) and TRL's way of syncing
weights (`load_weights` on the driver worker's model) but has never been executed here. It
samples with its own copy of the weights, which the trainer pushes after every update (`sync`).
"""

from __future__ import annotations

import os

import torch

from trainer.rollout import Rollout, assemble
from twoclocks_cli.errors import ConfigError


class VLLMEngine:
    """Generates with vLLM; `sync(model)` copies the trainer's weights into vLLM's model."""

    def __init__(self, cfg, tokenizer, model_path):
        try:
            from vllm import LLM  # noqa: PLC0415 - optional extra, imported lazily
        except ImportError:
            raise ConfigError(
                "rollout_engine = 'vllm' needs the vllm extra (pip install 'twoclocks[vllm]') "
                "and a GPU; use rollout_engine = 'hf' here"
            ) from None
        self.cfg, self.tokenizer = cfg, tokenizer
        # keep the engine in this process so `sync` can reach its model (as TRL does)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.llm = LLM(
            model=str(model_path),
            dtype=cfg.dtype,
            seed=cfg.seed,
            gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
            enable_prefix_caching=True,
        )

    def sync(self, model) -> None:
        """Load the trainer's current weights into vLLM (after every optimizer update)."""
        worker = self.llm.llm_engine.model_executor.driver_worker
        worker = getattr(worker, "worker", worker)  # the V1 engine wraps the worker once more
        inner = worker.model_runner.model
        inner.load_weights((name, p.detach()) for name, p in model.state_dict().items())
        self.llm.reset_prefix_cache()

    def generate(self, prompts: list[str], temperature: float | None = None) -> Rollout:
        """Sample one completion per prompt with vLLM; returned in the same layout as `hf`."""
        from vllm import SamplingParams

        cfg, tok = self.cfg, self.tokenizer
        t = cfg.temperature if temperature is None else temperature
        params = SamplingParams(
            n=1, temperature=t, top_p=cfg.top_p if t > 0 else 1.0, max_tokens=cfg.max_new_tokens
        )
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        width = cfg.max_new_tokens
        comp = torch.full((len(prompts), width), tok.pad_token_id, dtype=torch.long)
        for i, o in enumerate(outs):
            ids = list(o.outputs[0].token_ids)[:width]
            comp[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        return assemble(
            enc["input_ids"], enc["attention_mask"], comp, tok.eos_token_id, tok.pad_token_id, tok
        )
