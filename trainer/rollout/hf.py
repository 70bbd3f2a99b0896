"""The default rollout engine: transformers `generate`, batched, prompts left-padded."""

from __future__ import annotations

import torch

from trainer.rollout import Rollout, assemble


class NonFiniteLogits(RuntimeError):
    """Sampling met inf/NaN probabilities: the policy has diverged."""


class HFEngine:
    """Samples with the training model itself, so there are no weights to sync."""

    def __init__(self, cfg, model, tokenizer):
        self.cfg, self.model, self.tokenizer = cfg, model, tokenizer

    def sync(self, model) -> None:
        """Nothing to do: generation uses the live training model."""

    def generate(self, prompts: list[str], temperature: float | None = None) -> Rollout:
        """Sample one completion per prompt (repeat a prompt G times for a group); T=0 is greedy."""
        cfg, tok = self.cfg, self.tokenizer
        t = cfg.temperature if temperature is None else temperature
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        device = next(self.model.parameters()).device
        ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
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
                out = self.model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=cfg.max_new_tokens,
                    pad_token_id=tok.pad_token_id,
                    eos_token_id=tok.eos_token_id,
                    **kwargs,
                )
        except RuntimeError as err:
            if "inf" in str(err) or "nan" in str(err):
                raise NonFiniteLogits(str(err)) from None
            raise
        finally:
            self.model.train(was_training)
        completion = out[:, ids.shape[1] :].cpu()
        return assemble(ids.cpu(), mask.cpu(), completion, tok.eos_token_id, tok.pad_token_id, tok)
