"""The colocated vLLM engine against the trainer, on CPU with the real tiny model.

Truths: the HF engine's decode loop (greedy tokens), the trainer's own forward (log-probs of the
tokens vLLM sampled; the softmax the sampler must draw from), the model folder's generation
config and tokenizer (stop ids, prompt ids).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tests.vllm.conftest import FIGURES, SECOND_EOS, WIDTH
from trainer.logprobs import completion_logprobs
from trainer.rollout import vllm_inputs as V
from twoclocks_cli.core.errors import ConfigError


def _prompts(tok, n: int, seed: int) -> list[str]:
    from trainer.data import ArithmeticTask, render_prompt

    return [render_prompt(p, tok) for p in ArithmeticTask().sample(np.random.default_rng(seed), n)]


def _stops(tok) -> set[int]:
    return {tok.eos_token_id, tok.convert_tokens_to_ids(SECOND_EOS)}


def _hf_greedy(model, tok, base_cfg, prompts) -> list[list[int]]:
    """The HF engine's greedy completions, each cut after its first stop id (the HF engine
    stops on the tokenizer's eos only; vLLM on every generation-config eos too)."""
    from trainer.rollout.hf import HFEngine

    roll = HFEngine(base_cfg.model_copy(update={"rollout_engine": "hf"}), model, tok).generate(
        prompts, temperature=0.0)
    return [_cut(row, roll.completion_mask[i], _stops(tok))
            for i, row in enumerate(roll.completion_ids.tolist())]


def _cut(row: list[int], mask, stops: set[int]) -> list[int]:
    row = row[: int(mask.sum())]
    for j, t in enumerate(row):
        if t in stops:
            return row[: j + 1]
    return row


def _rows(roll) -> list[list[int]]:
    return [r[: int(m.sum())] for r, m in zip(roll.completion_ids.tolist(), roll.completion_mask,
                                              strict=True)]


def _logprob_gap(model, roll, temperature: float) -> torch.Tensor:
    """|trainer log-prob - vLLM log-prob| of every sampled token."""
    with torch.no_grad():
        own, _ = completion_logprobs(model, roll, temperature)
    m = roll.completion_mask.bool()
    assert bool(torch.isfinite(roll.sampler_logp[m]).all())  # vLLM gave every token's
    return (own[m] - roll.sampler_logp[m]).abs()


def _update(model, roll) -> torch.nn.Module:
    """A copy of `model` after one Adam step raising the log-prob of `roll`'s completions."""
    new = copy.deepcopy(model).train()
    opt = torch.optim.Adam(new.parameters(), lr=3e-3)
    logp, _ = completion_logprobs(new, roll, 1.0)
    m = roll.completion_mask.float()
    (-(logp * m).sum() / m.sum()).backward()
    opt.step()
    return new.eval().requires_grad_(False)


def test_greedy_equals_the_hf_engine_before_and_after_an_update(fresh, tiny, tok, base_cfg):
    """Token for token, on the checkpoint's weights and after one optimizer update and a sync:
    a sync that kept the old weights (or a tied lm_head's old kernel) fails the second half."""
    _, _, model = tiny
    prompts = _prompts(tok, 64, seed=2)
    before = _rows(fresh.generate(prompts, temperature=0.0))
    assert before == _hf_greedy(model, tok, base_cfg, prompts)
    torch.manual_seed(0)  # the request seeds of the samples the update learns from
    updated = _update(model, fresh.generate(prompts * 2, temperature=1.0))
    fresh.sync(updated)
    after = _rows(fresh.generate(prompts, temperature=0.0))
    expected = _hf_greedy(updated, tok, base_cfg, prompts)
    changed = sum(a != b for a, b in zip(before, expected, strict=True))
    assert changed >= 16, changed  # the update moved the greedy answers: the check has teeth
    assert after == expected
    FIGURES["greedy rows equal to the HF engine (before / after update)"] = (
        f"64/64 / 64/64 ({changed} rows changed by the update)")
    gap = _logprob_gap(updated, fresh.generate(prompts, temperature=1.0), 1.0)
    assert float(gap.max()) < 1e-4  # 0.11 mean before the tied lm_head was processed again
    assert fresh.llm.apply_model(V.reprocess_tied) == [["lm_head"]]  # vLLM's tied head


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_logprobs_equal_the_trainers(fresh, tiny, tok, temperature):
    """vLLM's processed log-prob of each token it sampled against the trainer's forward at the
    same temperature (fp32 both): float rounding, not a distribution gap."""
    torch.manual_seed(0)
    roll = fresh.generate([p for p in _prompts(tok, 64, seed=5) for _ in range(2)],
                          temperature=temperature)
    gap = _logprob_gap(tiny[2], roll, temperature)
    assert gap.numel() > 500
    mean, p99 = float(gap.mean()), float(gap.double().quantile(0.99))
    FIGURES[f"sampler log-prob |delta| at T={temperature} (mean, p99, tokens)"] = (
        f"{mean:.2e}, {p99:.2e}, {gap.numel()}")
    assert mean < 1e-5 and p99 < 1e-4


def test_a_batch_over_one_scheduler_step_comes_back_whole(fresh, tiny, tok):
    """160 prompts of ~37 tokens exceed the 4,096 prompt tokens of one CPU scheduler step. vLLM
    would split a prefill over two steps, which fails on CPU for a request with its own seed;
    the engine hands the prompts over in runs, and every row comes back, in order, with the
    trainer's log-probs."""
    prompts = ["12+30=42 75-9=66 " * 2 + p for p in _prompts(tok, 160, seed=9)]
    assert sum(map(len, V.prompt_token_ids(tok, prompts))) > 4096
    torch.manual_seed(0)
    roll = fresh.generate(prompts, temperature=1.0)
    assert roll.completion_ids.shape[0] == 160
    n = roll.prompt_len
    sent = [row[: n][mask[: n].bool()].tolist()
            for row, mask in zip(roll.input_ids, roll.attention_mask, strict=True)]
    assert sent == V.prompt_token_ids(tok, prompts)
    assert float(_logprob_gap(tiny[2], roll, 1.0).max()) < 1e-4


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (1.5, 1.0), (1.5, 0.7)])
def test_sampling_follows_the_trainers_distribution(fresh, tiny, tok, base_cfg, temperature,
                                                    top_p):
    """4,000 draws of one answer's first digit: frequencies match the trainer's
    softmax(logits / T) (the nucleus renormalised at top_p < 1): total variation < 0.05, as
    the HF decode loop's own test, and within what exact draws show by chance; nothing
    outside the nucleus."""
    _, _, model = tiny
    prompt = _prompts(tok, 1, seed=5)[0] + "\\boxed{"  # the next token is a digit or '-'
    ids = torch.tensor([V.prompt_token_ids(tok, [prompt])[0]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1]
    probs = torch.softmax(logits.double() / temperature, -1)
    if top_p < 1:
        order = probs.argsort(descending=True)
        kept = order[(probs[order].cumsum(0) - probs[order]) < top_p]
        nucleus = torch.zeros_like(probs)
        nucleus[kept] = probs[kept]
        probs = nucleus / nucleus.sum()
    assert float(probs.max()) < 0.9  # a spread distribution, not one certain token
    fresh.cfg = base_cfg.model_copy(update=dict(max_new_tokens=1, temperature=temperature,
                                                top_p=top_p))
    torch.manual_seed(1)
    roll = fresh.generate([prompt] * 4000)
    freq = torch.bincount(roll.completion_ids[:, 0], minlength=len(probs)).double() / 4000
    tv = 0.5 * float((freq - probs).abs().sum())
    # the TV that 4,000 exact draws from `probs` show by chance (500 replicates)
    draws = np.random.default_rng(0).multinomial(4000, probs.numpy(), size=500) / 4000
    noise = 0.5 * np.abs(draws - probs.numpy()).sum(1)
    FIGURES[f"first-token total variation at T={temperature}, top_p={top_p}"] = (
        f"{tv:.3f} (exact sampler's 99th percentile {np.quantile(noise, 0.99):.3f})")
    assert tv < 0.05 and tv < np.quantile(noise, 0.999)
    assert float(freq[probs == 0].sum()) == 0.0


def test_every_generation_config_eos_id_stops_a_completion(fresh, tok, model_dir):
    """The folder's generation config lists </s> and '7': completions end at either, the mask
    includes it, nothing follows, and such a row is not truncated."""
    gen = V.load_generation_config(model_dir)
    assert fresh.stop_ids == sorted(_stops(tok)) == sorted(gen.eos_token_id)
    torch.manual_seed(0)
    roll = fresh.generate([p for p in _prompts(tok, 64, seed=7) for _ in range(2)])
    ended = {t: 0 for t in _stops(tok)}
    for i, row in enumerate(_rows(roll)):
        stops = [j for j, t in enumerate(row) if t in ended]
        if stops:
            assert stops == [len(row) - 1], row  # the first stop id is the last token
            ended[row[-1]] += 1
            assert not bool(roll.truncated[i])
        else:
            assert len(row) == WIDTH and bool(roll.truncated[i])
    assert all(n > 0 for n in ended.values()), ended  # both ids really ended completions


def test_prompts_go_in_as_token_ids(fresh, tok):
    """This tokenizer adds a BOS to text (vLLM given the text would score a prompt the trainer
    never sees); the engine sends the trainer's ids, and vLLM reports exactly those."""
    from vllm import SamplingParams

    prompts = _prompts(tok, 4, seed=9)
    as_text = fresh.llm.generate(prompts, SamplingParams(max_tokens=1), use_tqdm=False)
    assert all(o.prompt_token_ids[0] == tok.bos_token_id for o in as_text)
    roll = fresh.generate(prompts)
    sent = tok(prompts, add_special_tokens=False)["input_ids"]
    p = roll.prompt_len
    got = [roll.input_ids[i, :p][roll.attention_mask[i, :p].bool()].tolist()
           for i in range(len(prompts))]
    assert got == sent and all(r[0] != tok.bos_token_id for r in got)
    assert [o.prompt_token_ids[1:] for o in as_text] == sent


def test_same_request_seeds_give_the_same_samples(fresh, tok):
    """Each request's seed comes from torch's generator: the same generator state samples the
    same completions (what an exact resume needs), another state others."""
    prompts = [p for p in _prompts(tok, 16, seed=11) for _ in range(4)]
    torch.manual_seed(3)
    a = fresh.generate(prompts)
    torch.manual_seed(3)
    b = fresh.generate(prompts)
    c = fresh.generate(prompts)
    assert torch.equal(a.input_ids, b.input_ids)
    assert not torch.equal(a.input_ids, c.input_ids)


def test_start_up_leaves_the_trainers_threads_and_environment(engine):
    """vLLM's CPU worker sets torch to 1 thread and replaces torch.set_num_threads with a
    no-op while starting; after the engine started both are as before, and the launcher
    variables it was started with (MASTER_PORT...) are gone (a later subprocess inherits them)."""
    import os

    assert {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_PORT")} == {
        k: engine.env_at_start.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    before = engine.threads_at_start
    assert torch.get_num_threads() == before
    torch.set_num_threads(before + 1)
    assert torch.get_num_threads() == before + 1
    torch.set_num_threads(before)


def test_sleep_mode_is_refused_on_cpu(tok, base_cfg, model_dir):
    """vLLM's CPU worker ignores sleep/wake: asking for it is one ConfigError naming the
    setting, raised before any engine starts."""
    from trainer.rollout.vllm import VLLMEngine

    for level in (1, 2):
        cfg = base_cfg.model_copy(update=dict(vllm_enable_sleep_mode=True,
                                              vllm_sleep_level=level))
        with pytest.raises(ConfigError, match="vllm_enable_sleep_mode = true: vLLM's CPU"):
            VLLMEngine(cfg, tok, model_dir)
