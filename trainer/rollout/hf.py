"""The default rollout engine: the training model samples its own completions, prompts left-padded.

A GRPO batch repeats each prompt G times: the engine tokenizes each distinct prompt once and
pre-fills its keys/values once. Qwen2/Llama models decode through twoclocks' own loop
(`trainer.rollout.decode`); anything else through transformers `generate`, handed that cache
re-indexed to every row (generate then only runs each row's last prompt token). Either way the
sampler's log-prob of every token comes back on the Rollout (`sampler_logp`); the decode loop,
which is the training forward's own math on the live weights, also returns each token's entropy
(`sampler_entropy`), so the trainer needs no forward of its own for the rows it does not train.
In another precision than the trainer's (`rollout_dtype`) the engine is handed a copy of the
weights in that precision (`trainer.precision`): its log-probs are that copy's, the behaviour
policy's, and its entropy comes back only where the update computes in that precision too (then
the copy is the update's own; otherwise its numbers are no longer the trainer's).
"""

from __future__ import annotations

import math

import torch

from trainer.rollout.batch import Rollout, assemble


class NonFiniteLogits(RuntimeError):
    """Sampling met inf/NaN probabilities: the policy has diverged."""


class HFEngine:
    """Samples with the training model itself, or with the copy of it in the rollout precision
    that the loop refreshes after every update: no weights to sync here."""

    def __init__(self, cfg, model, tokenizer):
        from trainer.rollout.decode import FastDecoder, unsupported

        self.cfg, self.model, self.tokenizer = cfg, model, tokenizer
        # the decode loop's numbers are the trainer's own in the parameters' precision or in
        # the one the update computes in (its forward's)
        own = {getattr(torch, d) for d in (cfg.dtype, getattr(cfg, "update_dtype", None))
               if d not in (None, "auto")}
        self.own = next(model.parameters()).dtype in own
        use_loop = getattr(cfg, "hf_decoder", "auto") == "auto" and unsupported(model) is None
        self.decoder = FastDecoder(model) if use_loop else None

    def sync(self, model) -> None:
        """Nothing to do: generation uses the live model (or copy) it was handed."""

    def generate(self, prompts: list[str], temperature: float | None = None) -> Rollout:
        """Sample one completion per prompt (repeat a prompt G times for a group); T=0 is greedy."""
        cfg, tok = self.cfg, self.tokenizer
        t = cfg.temperature if temperature is None else temperature
        distinct = list(dict.fromkeys(prompts))
        row = {text: i for i, text in enumerate(distinct)}
        inverse = torch.tensor([row[text] for text in prompts])
        enc = tok(distinct, return_tensors="pt", padding=True, add_special_tokens=False)
        device = next(self.model.parameters()).device
        u_ids, u_mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
        ids, mask = u_ids[inverse], u_mask[inverse]
        sample = t > 0
        kwargs = (
            dict(do_sample=True, temperature=t, top_p=cfg.top_p, top_k=0)
            if sample
            else dict(do_sample=False, temperature=None, top_p=None, top_k=None)
        )
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                entropy = None  # only the decode loop's numbers are the policy's own
                if self.decoder is not None:
                    completion, logp, entropy = self.decoder.sample(
                        u_ids, u_mask, inverse.to(device), cfg.max_new_tokens, t, cfg.top_p,
                        tok.eos_token_id, tok.pad_token_id,
                    )
                else:
                    completion, logp = self._generate(u_ids, u_mask, ids, mask, inverse, kwargs)
        except FloatingPointError as err:
            raise NonFiniteLogits(str(err)) from None
        except RuntimeError as err:
            if "inf" in str(err) or "nan" in str(err):
                raise NonFiniteLogits(str(err)) from None
            raise
        finally:
            self.model.train(was_training)
        roll = assemble(ids.cpu(), mask.cpu(), completion.cpu(), tok.eos_token_id,
                        tok.pad_token_id, tok)
        off = ~roll.completion_mask.bool()
        roll.sampler_logp = logp.float().cpu().masked_fill(off, math.nan)
        if entropy is not None and self.own:
            roll.sampler_entropy = entropy.float().cpu().masked_fill(off, math.nan)
        return roll

    def _generate(self, u_ids, u_mask, ids, mask, inverse, kwargs):
        """(completion ids, the sampler's log-probs) from transformers `generate`."""
        cfg, tok = self.cfg, self.tokenizer
        prefill = self._prefill(u_ids, u_mask, inverse.to(ids.device))
        out = self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=cfg.max_new_tokens,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            return_dict_in_generate=True,
            output_logits=True,
            **prefill,
            **kwargs,
        )
        completion = out.sequences[:, ids.shape[1] :]
        t = kwargs.get("temperature") or 1.0
        logits = torch.stack(out.logits, dim=1).float() / t  # raw logits, one per new token
        logp = torch.log_softmax(logits, dim=-1).gather(-1, completion.unsqueeze(-1))
        return completion, logp.squeeze(-1)

    def _prefill(self, u_ids, u_mask, inverse) -> dict:
        """`generate` kwargs carrying the distinct prompts' cache (all but their last token)
        re-indexed to every row; empty when no prompt repeats or the model has no usable cache."""
        from trainer.logprobs import cache_kwarg, prefix_cache

        if len(u_ids) == len(inverse) or u_ids.shape[1] < 2:
            return {}
        head = prefix_cache(self.model, u_ids[:, :-1], u_mask[:, :-1])
        if head is None:
            return {}
        cache = head[1]
        cache.batch_select_indices(inverse)
        return {cache_kwarg(self.model): cache}
