"""`builtin:tiny-arith` for the trl backend: TRL's GRPOTrainer on the project's tiny model.

The same pieces as the embedded trainer's default: the tiny Qwen2-style model (built once into
the cache, see trainer.tiny), the arithmetic task's prompts and the strict boxed-integer
math-verify reward. An eval set of held-out problems is attached, so `eval_strategy = "steps"`
in `[trl.args]` logs `eval_accuracy`. On CPU, `[trl.args]` needs `use_cpu = true`,
`bf16 = false` and `gradient_checkpointing = false` (TRL's defaults assume a GPU).
"""

from __future__ import annotations

TRAIN_PROMPTS = 2048
EVAL_PROMPTS = 64


def tiny_arith_trainer(args):
    """A GRPOTrainer for `args` (a trl.GRPOConfig) on the tiny model and the arithmetic task."""
    import numpy as np
    import pyarrow as pa
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    from trainer.data import ArithmeticTask, Problem, render_prompt
    from trainer.rewards import MathVerifyReward
    from trainer.tiny import ensure_tiny_model

    path = ensure_tiny_model(0)
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    task = ArithmeticTask()

    def rows(problems) -> list[dict]:
        return [{"prompt": render_prompt(p, tok), "answer": p.answer} for p in problems]

    train = Dataset(pa.Table.from_pylist(rows(task.sample(np.random.default_rng(args.seed),
                                                          TRAIN_PROMPTS))),
                    fingerprint=f"tiny-arith-train-{args.seed}")
    held = Dataset(pa.Table.from_pylist(rows(task.heldout(EVAL_PROMPTS, 0))),
                   fingerprint="tiny-arith-eval")
    reward = MathVerifyReward(workers=0)  # in the trainer's main thread: no worker processes

    def correctness(prompts, completions, answer, **kw):
        return reward(list(completions), [Problem("", a) for a in answer])

    trainer = GRPOTrainer(model=model, reward_funcs=correctness, args=args, train_dataset=train,
                          eval_dataset=held, processing_class=tok)
    trainer.twoclocks_close = reward.close  # called by the backend after training
    return trainer
