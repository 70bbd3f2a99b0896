"""Helpers for tests that train or sample in-process: a metric sink and the cached tiny model."""

from __future__ import annotations


class Collect:
    """Metric sink for an in-process `train()`: {step: {key: value}}, and the run's events."""

    def __init__(self):
        self.rows: dict[int, dict] = {}
        self.events: list[str] = []

    def log(self, step, samples, values):
        self.rows.setdefault(step, {}).update(values)

    def event(self, message):
        self.events.append(message)

    def flush(self):
        pass


def load_tiny():
    """(path, tokenizer, model in eval mode, fp32) of the real cached tiny model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.tiny import ensure_tiny_model

    path = ensure_tiny_model()
    tok = AutoTokenizer.from_pretrained(str(path), padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return path, tok, model


def full_row_logits(model, ids, mask, p):
    """transformers' forward over every whole row, nothing shared: the logits that predict the
    completion positions from `p` on (the truth for twoclocks' own forward)."""
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, p - 1 : -1]
