"""A colocated vLLM rollout engine for GPU users (the `vllm` extra). NOT RUN IN THIS PROJECT'S CI.

No machine the project is tested on has a GPU or can install vLLM, so this class has never been
executed here. It was written against vLLM's source (0.27.0 to 0.30.0, every release the extra
pins: `LLM`, `SamplingParams`, `TokensPrompt`, `LLM.apply_model`, `sleep`/`wake_up`,
`reset_prefix_cache`, `collective_rpc("reload_weights")`) and TRL's colocated engine. Every
decision that does not need vLLM lives in `trainer.rollout.vllm_inputs` and is tested with the
real tiny model's tokenizer and generation config (tests/unit/test_vllm_engine.py);
scripts/gpu-check.sh runs this engine end to end where a GPU and vLLM exist.

How it avoids the defects of the first version:
- Weight sync: `distributed_executor_backend="external_launcher"`. vLLM then runs its engine
  core and worker inside this process (it sets VLLM_ENABLE_V1_MULTIPROCESSING=0 itself; the
  engine sets it too, before vLLM reads it), joins the trainer's ranks through env:// and
  puts each rank's worker on its LOCAL_RANK's GPU. Chosen over the environment variable alone
  because several ranks need the launcher anyway, and over a cross-process `collective_rpc`
  because in-process the weights are handed over without being serialised. The weights go in
  through `LLM.apply_model` (vLLM's API for running a function on the worker's model, which
  also unwraps CUDA graphs) calling the model's `load_weights`; then the prefix cache is reset.
- Tokens in: prompts are tokenized once, as the trainer tokenizes them, and sent as
  `TokensPrompt`s; the Rollout is built from each output's own `prompt_token_ids`.
- Stop ids: the tokenizer's eos and every generation-config eos id end a completion, in vLLM
  (`stop_token_ids`) and in the completion mask alike.
- Seeds: vLLM's seed is the rank's seed; its worker reseeds random/numpy/torch globally at
  start-up, so the trainer's generators are saved before and restored after (`preserved_rng`).
- Sampler log-probs: `logprobs=0`, processed (after temperature); returned on the Rollout as
  `sampler_logp`; the trainer logs the mismatch every step and applies truncated importance
  sampling with `tis_cap` (`trainer.sampler`; tested on CPU with the HF engine's log-probs).
- Memory: max_model_len = prompt room + max_new_tokens; with `vllm_enable_sleep_mode` the engine
  sleeps after each generation and wakes for the sync and the next generation.
"""

from __future__ import annotations

import functools
import os

from trainer.rng import preserved_rng
from trainer.rollout import vllm_inputs as V
from twoclocks_cli.core.errors import ConfigError


def _load(model, *, weights):
    """Run on vLLM's worker model: load (name, tensor) pairs in HF checkpoint naming."""
    model.load_weights(weights)


class VLLMEngine:
    """Generates with a colocated vLLM; `sync(model)` loads the trainer's weights into it."""

    def __init__(self, cfg, tokenizer, model_path):
        try:
            from vllm import LLM  # noqa: PLC0415 - optional extra, imported lazily
        except ImportError:
            raise ConfigError(
                "rollout_engine = 'vllm' needs the vllm extra (pip install 'twoclocks[vllm]') "
                "and a GPU; use rollout_engine = 'hf' here"
            ) from None
        self.cfg, self.tokenizer = cfg, tokenizer
        import torch

        self.place = V.placement_from_env(os.environ)
        self.device = V.check_device(self.place, torch.cuda.device_count())
        os.environ.update(V.launcher_env(self.place, os.environ))
        self.stop_ids = V.stop_token_ids(tokenizer, V.load_generation_config(model_path))
        self.room = V.prompt_room(cfg, V.model_max_positions(model_path))
        kwargs = V.engine_kwargs(cfg, model_path, self.place, self.room)
        with preserved_rng():  # vLLM's worker reseeds the global generators while starting
            self.llm = LLM(**kwargs)
        self.plan = V.SleepPlan(cfg.vllm_sleep_level if cfg.vllm_enable_sleep_mode else None)
        self.model = None  # the trainer's model of the last sync (what a level-2 wake reloads)

    def sync(self, model) -> None:
        """Load the trainer's current weights into vLLM (after every optimizer update)."""
        self.model = model
        self._run(self.plan.sync())

    def _run(self, steps: list[str]) -> None:
        """Carry out the sleep plan's steps on vLLM, in order."""
        for step in steps:
            if step == "wake_weights":
                self.llm.wake_up(tags=["weights"])
            elif step == "wake_kv_cache":
                self.llm.wake_up(tags=["kv_cache"])
            elif step == "push":  # every weight handed over in this process, no copy
                self.llm.apply_model(functools.partial(_load, weights=list(
                    V.weight_items(self.model))))
            elif step == "reload":  # before any sync: the checkpoint's weights from disk
                self.llm.collective_rpc("reload_weights")
            elif step == "reset_prefix_cache":  # its keys/values came from the old weights
                self.llm.reset_prefix_cache()
            elif step == "sleep":
                self.llm.sleep(level=self.plan.level)
            else:  # pragma: no cover - SleepPlan names only the steps above
                raise ValueError(f"unknown engine step {step!r}")

    def generate(self, prompts: list[str], temperature: float | None = None):
        """Sample one completion per prompt; the HF engine's layout plus `sampler_logp`."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        cfg, tok = self.cfg, self.tokenizer
        t = cfg.temperature if temperature is None else temperature
        sent = V.prompt_token_ids(tok, prompts)
        V.check_prompt_lengths(sent, self.room)
        params = SamplingParams(**V.sampling_kwargs(cfg, t, self.stop_ids))
        self._run(self.plan.before_generate())
        try:
            outs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in sent],
                                     params, use_tqdm=False)
        finally:
            self._run(self.plan.after_generate())
        return V.rollout_from_outputs(outs, sent, self.stop_ids, cfg.max_new_tokens,
                                      tok.pad_token_id, tok.eos_token_id, tok)
