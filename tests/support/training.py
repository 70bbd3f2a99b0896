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


class KeptEngine:
    """The configured engine, keeping every rollout and the model it was handed."""

    def __init__(self):
        self.rollouts, self.model = [], None

    def __call__(self, cfg, model, tok, path):
        from trainer.rollout import make_engine

        self.model, inner = model, make_engine(cfg, model, tok, path)
        kept = self

        class Engine:
            def sync(self, m):
                inner.sync(m)

            def generate(self, prompts, temperature=None):
                roll = inner.generate(prompts, temperature)
                kept.rollouts.append(roll)
                return roll

        return Engine()


def train_collected(tmp_path, name: str, config: dict, make=None, on_step=None) -> Collect:
    """`train()` of TrainConfig(**config) into tmp_path/name, rows collected; must complete."""
    from trainer.config import TrainConfig
    from trainer.loop import train

    sink = Collect()
    assert train(TrainConfig(**config), sink, tmp_path / name, on_step=on_step,
                 make_rollout=make) == "completed"
    return sink


SMALL_RUN = dict(prompts_per_batch=8, group_size=4, lr=1e-3, sample_budget=32, seed=5,
                 eval_every_samples=0, checkpoint_every_steps=0, threads=1)


def train_small(tmp_path, name: str, make=None, on_step=None, **over) -> Collect:
    """A few tiny-model steps (SMALL_RUN with `over` on top), rows collected."""
    return train_collected(tmp_path, name, {**SMALL_RUN, **over}, make=make, on_step=on_step)


def without_timings(rows: dict) -> dict:
    """The rows without their timings (the only values that differ between equal runs)."""
    from tests.support.cells import TIMING

    return {s: {k: v for k, v in r.items() if k not in TIMING} for s, r in rows.items()}
