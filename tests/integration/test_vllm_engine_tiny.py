"""The vLLM engine's decisions on the tiny model, checked without vLLM (the main venv has none).

Everything trainer/rollout/vllm.py sends to vLLM or builds from its outputs goes through
trainer/rollout/vllm_inputs.py; these tests run those functions with the real tiny model's
tokenizer, generation config, weights and sampled completions. vLLM's outputs are stood in for
by objects of the same shape (tests/support/vllm_outputs.py) filled with real sampled tokens and
real trainer log-probs. The decisions that need no model are tests/unit/test_vllm_engine.py's;
what only a running vLLM can show (that it accepts these arguments, samples what the trainer
would, and takes the synced weights) is tests/vllm/'s job, run in `.venv-vllm` with vLLM's CPU
build (`make test-vllm`).
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil

import numpy as np
import pytest
import torch

from tests.support.training import load_tiny
from tests.support.vllm_outputs import CompletionOutput, Logprob, RequestOutput
from trainer import sampler as S
from trainer.config import TrainConfig
from trainer.rng import private_torch_rng
from trainer.rollout import assemble
from trainer.rollout import vllm_inputs as V
from twoclocks_cli.core.errors import ConfigError

# --- fixtures ---------------------------------------------------------------------------------
WIDTH = 11  # max_new_tokens: the tiny model's 1-2 digit answers end, 3-character ones truncate
@pytest.fixture(scope="module")
def tiny(tiny_model):  # taking tiny_model marks each test given it (conftest)
    """(path, tokenizer, model) of the real cached tiny model."""
    return load_tiny()


@pytest.fixture(scope="module")
def prompts(tiny):
    from trainer.data import ArithmeticTask, render_prompt

    _, tok, _ = tiny
    problems = ArithmeticTask().sample(np.random.default_rng(3), 6)
    texts = [render_prompt(p, tok) for p in problems]
    return [t for t in texts for _ in range(2)]  # groups of 2, as the trainer sends them


@pytest.fixture(scope="module")
def hf_rollout(tiny, prompts):
    """A real rollout of the tiny model through the HF engine (the layout the trainer scores)."""
    from trainer.rollout.hf import HFEngine

    _, tok, model = tiny
    cfg = TrainConfig(max_new_tokens=WIDTH, temperature=1.0)
    with private_torch_rng(11):
        return HFEngine(cfg, model, tok).generate(prompts)


def as_vllm_outputs(roll, logp=None, extra_top: bool = True) -> list[RequestOutput]:
    """What vLLM would return for `roll`'s rows: unpadded prompt ids, the completion up to and
    including its stop token, per-position {token: Logprob} (plus a rival top token)."""
    outs = []
    p = roll.prompt_len
    for i in range(len(roll.texts)):
        prompt = roll.input_ids[i, :p][roll.attention_mask[i, :p].bool()].tolist()
        keep = roll.completion_mask[i].bool()
        ids = roll.completion_ids[i][keep].tolist()
        lps = None
        if logp is not None:
            lps = []
            for j, t in enumerate(ids):
                entry = {t: Logprob(float(logp[i, j]), rank=2)}
                if extra_top:
                    entry[(t + 1) % 20] = Logprob(-0.01, rank=1)
                lps.append(entry)
        finish = "length" if bool(roll.truncated[i]) else "stop"
        outs.append(RequestOutput(prompt, [CompletionOutput(ids, lps, finish)]))
    return outs


def copy_model(tiny, tmp_path, eos=None, drop_generation_config=False):
    """A copy of the tiny model directory, its generation config's eos set to `eos`."""
    src, _, _ = tiny
    dst = tmp_path / "model"
    shutil.copytree(src, dst)
    gc_file = dst / "generation_config.json"
    if drop_generation_config:
        gc_file.unlink()
    elif eos is not None:
        data = json.loads(gc_file.read_text())
        data["eos_token_id"] = eos
        gc_file.write_text(json.dumps(data))
    return dst


# --- 2. tokens in ---------------------------------------------------------------------------
def test_prompt_ids_sent_are_exactly_the_ids_the_trainer_scores(tiny, prompts, hf_rollout):
    _, tok, _ = tiny
    sent = V.prompt_token_ids(tok, prompts)
    p = hf_rollout.prompt_len
    scored = [hf_rollout.input_ids[i, :p][hf_rollout.attention_mask[i, :p].bool()].tolist()
              for i in range(len(prompts))]
    assert sent == scored
    ids, mask = V.left_pad(sent, tok.pad_token_id)
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    assert torch.equal(ids, enc["input_ids"]) and torch.equal(mask, enc["attention_mask"])


def test_a_bos_adding_tokenizer_gets_no_second_bos(tiny, tmp_path, prompts):
    """vLLM given text encodes with add_special_tokens=True; a template tokenizer then gets a
    BOS the trainer never scores. The ids the engine sends have none."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    _, tok, _ = tiny
    bos = tok.bos_token
    tok2 = AutoTokenizer.from_pretrained(str(tiny[0]), padding_side="left")
    tok2.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tok.bos_token_id)])
    tok2.save_pretrained(tmp_path / "tok")
    tok2 = AutoTokenizer.from_pretrained(str(tmp_path / "tok"), padding_side="left")
    as_text = tok2(prompts[:2], add_special_tokens=True)["input_ids"]
    assert all(r[0] == tok.bos_token_id for r in as_text)  # what a text prompt would become
    sent = V.prompt_token_ids(tok2, prompts[:2])
    assert sent == tok(prompts[:2], add_special_tokens=False)["input_ids"]
    assert [r[1:] for r in as_text] == sent


# --- 3. stop ids ------------------------------------------------------------------------------
def test_every_generation_config_eos_id_is_a_stop_id(tiny, tmp_path):
    path, tok, _ = tiny
    assert V.stop_token_ids(tok, V.load_generation_config(path)) == [tok.eos_token_id]
    listed = copy_model(tiny, tmp_path, eos=[5, tok.eos_token_id, 7])
    gen = V.load_generation_config(listed)
    stops = V.stop_token_ids(tok, gen)
    assert stops == sorted({5, 7, tok.eos_token_id})
    cfg = TrainConfig()
    assert V.sampling_kwargs(cfg, 1.0, stops)["stop_token_ids"] == stops


def test_a_model_without_generation_config_stops_on_the_tokenizer_eos(tiny, tmp_path):
    _, tok, _ = tiny
    bare = copy_model(tiny, tmp_path, drop_generation_config=True)
    assert V.load_generation_config(bare) is None
    assert V.stop_token_ids(tok, None) == [tok.eos_token_id]


def test_outputs_give_the_hf_engines_rollout_exactly(tiny, hf_rollout):
    """Same completions, same layout: the trainer cannot tell which engine sampled."""
    _, tok, _ = tiny
    outs = as_vllm_outputs(hf_rollout)
    sent = [o.prompt_token_ids for o in outs]
    got = V.rollout_from_outputs(outs, sent, [tok.eos_token_id], WIDTH, tok.pad_token_id,
                                 tok.eos_token_id, tok)
    for name in ("input_ids", "attention_mask", "completion_mask", "truncated"):
        assert torch.equal(getattr(got, name), getattr(hf_rollout, name)), name
    assert got.prompt_len == hf_rollout.prompt_len and got.texts == hf_rollout.texts
    assert bool(hf_rollout.truncated.any()) and bool((~hf_rollout.truncated).any())  # both kinds


def test_a_second_eos_id_ends_the_completion_not_truncates_it(tiny, hf_rollout):
    """A completion vLLM stopped on another generation-config eos (id 5 here) ends there; the
    single-eos assembly of the old engine called it truncated and trained on what followed."""
    _, tok, _ = tiny
    other, width = 5, WIDTH
    outs = as_vllm_outputs(hf_rollout)
    outs[0].outputs[0] = CompletionOutput([9, 10, other], None, "stop", stop_reason=other)
    # stopped on the eos, but the eos left out of token_ids: it is put back
    outs[1].outputs[0] = CompletionOutput([9, 10, 11], None, "stop", stop_reason=None)
    sent = [o.prompt_token_ids for o in outs]
    got = V.rollout_from_outputs(outs, sent, [tok.eos_token_id, other], width, tok.pad_token_id,
                                 tok.eos_token_id, tok)
    assert got.completion_mask[0].tolist() == [1, 1, 1] + [0] * (width - 3)
    assert got.completion_ids[0, :3].tolist() == [9, 10, other] and not bool(got.truncated[0])
    assert got.completion_ids[1, :4].tolist() == [9, 10, 11, tok.eos_token_id]
    assert got.completion_mask[1].sum() == 4 and not bool(got.truncated[1])
    old = assemble(got.input_ids[:1, : got.prompt_len], got.attention_mask[:1, : got.prompt_len],
                   got.completion_ids[:1], tok.eos_token_id, tok.pad_token_id, tok)
    assert bool(old.truncated[0]) and int(old.completion_mask[0].sum()) == width


def test_vllm_changing_the_prompt_ids_is_caught(tiny, hf_rollout):
    _, tok, _ = tiny
    outs = as_vllm_outputs(hf_rollout)
    sent = [o.prompt_token_ids for o in outs]
    outs[2].prompt_token_ids = [tok.bos_token_id] + outs[2].prompt_token_ids
    with pytest.raises(RuntimeError, match="prompt 2"):
        V.rollout_from_outputs(outs, sent, [tok.eos_token_id], WIDTH, tok.pad_token_id,
                               tok.eos_token_id, tok)


# --- 6. sampler log-probs -----------------------------------------------------------------------
def test_sampler_logprobs_are_gathered_and_compared_with_the_trainers(tiny, hf_rollout):
    from trainer.logprobs import completion_logprobs

    _, tok, model = tiny
    with torch.no_grad():
        logp, _ = completion_logprobs(model, hf_rollout, 1.0)
    m = hf_rollout.completion_mask.bool()
    outs = as_vllm_outputs(hf_rollout, logp)
    sent = [o.prompt_token_ids for o in outs]
    got = V.rollout_from_outputs(outs, sent, [tok.eos_token_id], WIDTH, tok.pad_token_id,
                                 tok.eos_token_id, tok)
    assert torch.allclose(got.sampler_logp[m], logp[m].float(), atol=1e-6)
    assert bool(torch.isnan(got.sampler_logp[~m]).all())
    same = S.sampler_mismatch(logp, got.sampler_logp, hf_rollout.completion_mask)
    assert same["sampler_tokens"] == int(m.sum())
    assert same["sampler_abs_logratio"] < 1e-6 and abs(same["sampler_kl_k3"]) < 1e-9
    delta = 0.1  # the sampler gave every token log-prob lower by 0.1
    shifted = got.sampler_logp - delta
    off = S.sampler_mismatch(logp, shifted, hf_rollout.completion_mask)
    assert off["sampler_abs_logratio"] == pytest.approx(delta, rel=1e-5)
    assert off["sampler_kl_k3"] == pytest.approx(math.exp(delta) - 1 - delta, rel=1e-4)
    w = S.tis_weights(logp, shifted, cap=2.0)
    assert torch.allclose(w[m], torch.full_like(w[m], math.exp(delta)), rtol=1e-5)
    assert torch.allclose(S.tis_weights(logp, shifted, cap=1.05)[m], torch.tensor(1.05))
    assert bool((w[~m] == 1).all())  # no sampler log-prob: weight 1
    picked = got.select(torch.tensor([3, 0]))
    assert torch.equal(picked.sampler_logp[1].nan_to_num(), got.sampler_logp[0].nan_to_num())
    assert picked.texts == [got.texts[3], got.texts[0]]



def test_engine_kwargs_per_rank(tiny):
    path, _, _ = tiny
    cfg = TrainConfig(seed=3, max_new_tokens=12, dtype="bfloat16", vllm_enable_sleep_mode=True)
    room = V.prompt_room(cfg, V.model_max_positions(path))
    assert V.model_max_positions(path) == 512 and room == 500  # min(1024, 512 - 12)
    a = V.engine_kwargs(cfg, path, V.Placement(0, 0, 2), room)
    b = V.engine_kwargs(cfg, path, V.Placement(1, 1, 2), room)
    assert a["max_model_len"] == 512 and a["distributed_executor_backend"] == "external_launcher"
    assert a["seed"] == 3 * 7919 and b["seed"] == 3 * 7919 + 1
    assert a["enable_sleep_mode"] is True and a["dtype"] == "bfloat16"
    assert a["logprobs_mode"] == "processed_logprobs" and a["tensor_parallel_size"] == 1
    assert "enforce_eager" not in a  # vLLM's own default (compiled, CUDA graphs) on a GPU
    cpu = V.engine_kwargs(cfg, path, V.Placement(), room, "cpu")
    assert cpu["enforce_eager"] is True and cpu["max_num_batched_tokens"] == 4096
    assert "max_num_batched_tokens" not in a
    long = TrainConfig(max_new_tokens=12, vllm_max_prompt_tokens=5000)
    assert V.engine_kwargs(long, path, V.Placement(), 5000, "cpu")["max_num_batched_tokens"] == 5012
    s = V.sampling_kwargs(cfg, 0.0, [2])
    assert s["logprobs"] == 0 and s["top_p"] == 1.0 and s["max_tokens"] == 12



def test_prompt_room_and_lengths_are_checked_against_the_model(tiny):
    path, _, _ = tiny
    limit = V.model_max_positions(path)
    cfg = TrainConfig(max_new_tokens=12, vllm_max_prompt_tokens=100)
    assert V.engine_kwargs(cfg, path, V.Placement(), V.prompt_room(cfg, limit))[
        "max_model_len"] == 112
    with pytest.raises(ConfigError, match="vllm_max_prompt_tokens = 501.*at most 500"):
        V.prompt_room(TrainConfig(max_new_tokens=12, vllm_max_prompt_tokens=501), limit)
    with pytest.raises(ConfigError, match="max_new_tokens = 512"):
        V.prompt_room(TrainConfig(max_new_tokens=512), limit)
    V.check_prompt_lengths([[1] * 100], 100)
    with pytest.raises(ConfigError, match="101 tokens.*allows 100"):
        V.check_prompt_lengths([[1] * 5, [1] * 101], 100)


def test_sync_check_compares_what_kept_its_name_and_shape(tiny):
    """The trainer's weights against a model holding them under the same names: equal; one
    changed value is named; a model that kept no name and shape is an error, not a pass."""
    _, _, model = tiny
    sent = dict(V.weight_items(model))
    compared, differ = V.sync_check(model, sent)
    assert compared == len(sent) and differ == []
    V.check_sync([(compared, differ)])
    stale = {**sent, "model.norm.weight": sent["model.norm.weight"] + 1e-3}
    result = V.sync_check(model, stale)
    assert result == (len(sent), ["model.norm.weight"])
    with pytest.raises(V.WeightSyncError, match="1 of .* compared parameters.*model.norm"):
        V.check_sync([result])
    with pytest.raises(V.WeightSyncError, match="no vLLM parameter could be compared"):
        V.check_sync([V.sync_check(model, {"other": torch.zeros(1)})])



def test_weight_names_are_the_checkpoints(tiny):
    """The names synced are the ones in the model's safetensors (what vLLM's loader maps),
    with a DDP-style `module.` wrapper removed; the tied lm_head is sent once, as embeddings."""
    from safetensors import safe_open

    path, _, model = tiny
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        stored = set(f.keys())
    wrapper = torch.nn.Module()
    wrapper.module = model
    for m in (model, wrapper):
        items = dict(V.weight_items(m))
        assert set(items) <= stored
        assert stored - set(items) <= {"lm_head.weight"}
        name = "model.embed_tokens.weight"
        assert items[name].data_ptr() == model.get_parameter(name).data_ptr()  # no copy
        assert not items[name].requires_grad


# --- config and the engine's refusal without vLLM ------------------------------------------------
@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_the_engine_without_vllm_is_one_config_error(tiny):
    from trainer.rollout.vllm import VLLMEngine

    path, tok, _ = tiny
    with pytest.raises(ConfigError, match="needs the vllm extra"):
        VLLMEngine(TrainConfig(rollout_engine="vllm"), tok, path)
